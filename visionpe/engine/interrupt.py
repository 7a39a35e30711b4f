"""SIGTERM (what SLURM and Kubernetes send before a kill) and SIGINT (Ctrl-C) during training: stop cleanly.

The first such signal only sets a flag; the trainer looks at it after every step (every rank agrees on it:
StopSignal), writes a checkpoint there and raises TrainingInterrupted, which the command line reports in
one line with the resume command and the signal's conventional exit status (128 + number: 143, 130). A second signal
acts as it would have without this (Ctrl-C twice: KeyboardInterrupt; the checkpoint files are written atomically).
The benchmark runs many such jobs and stops them all the same way (visionpe.bench.jobs). A loss that stops being
finite stops the run too, before any checkpoint of diverged weights (DivergenceGuard).
"""

from __future__ import annotations

import math
import signal
import threading
from pathlib import Path

import torch

from .distributed import DistContext, all_reduce_max, resume_command

__all__ = [
    "StopOnSignal",
    "StopSignal",
    "TrainingInterrupted",
    "STOP_SIGNALS",
    "interrupted",
    "diverged",
    "DivergenceGuard",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingInterrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; `exit_code` is 128 + the signal's number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class StopOnSignal:
    """`with StopOnSignal() as stop: ... stop.signum` (0 until a stop signal arrives). Outside the main thread
    signals cannot be caught, and nothing is installed."""

    def __init__(self):
        self.signum = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))  # a second one acts as before

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()


def interrupted(signum: int, epoch: int, global_step: int, run_dir: Path) -> TrainingInterrupted:
    """The exception (and its one line) for a run stopped by `signum` after checkpointing at `global_step`."""
    return TrainingInterrupted(
        signum,
        f"stopped by {signal.Signals(signum).name} at epoch {epoch + 1}, step {global_step}: checkpoint saved in "
        f"{run_dir}; continue with: {resume_command(run_dir)}",
    )


def diverged(what: str, first_loss: float | None, pointer: Path) -> FloatingPointError:
    """The error for a non-finite training loss: the likely cause, and what is on disk (if anything)."""
    kept = (
        f"the last checkpoint written ({pointer}) is from before it and is kept"
        if pointer.is_file()
        else ("no checkpoint was written yet")
    )
    if first_loss is not None and not math.isfinite(first_loss):
        cause = (
            f"the first batch's loss was already {first_loss}, before any update: the model's output or the data "
            f"is not finite (check model.kwargs, e.g. the PE's pe_kwargs, and the inputs)"
        )
    else:
        cause = "lower optim.lr or set optim.clip_grad (or train.amp=none if it is on)"
    return FloatingPointError(f"{what}; {cause}; {kept}")


class StopSignal:
    """The stop signal that every rank agrees on: `received()` is the signal any rank got (0: none), so that every
    rank stops at the same step. `signals`: the StopOnSignal the run is inside (`with StopOnSignal() as
    stop.signals`)."""

    def __init__(self, ctx: DistContext):
        self.ctx, self.signals = ctx, StopOnSignal()

    def received(self) -> int:
        return all_reduce_max(self.signals.signum, self.ctx)

    def interrupted(self, epoch: int, global_step: int, run_dir: Path) -> TrainingInterrupted:
        return interrupted(self.received(), epoch, global_step, run_dir)


class DivergenceGuard:
    """The checks for a non-finite training loss: of each logged window, and of the open window before a checkpoint
    (diverged weights are never saved). The first batch's loss tells a model broken from the start."""

    def __init__(self, pointer: Path):
        self.pointer, self.first_loss = pointer, None

    def first(self, loss: torch.Tensor) -> None:
        if self.first_loss is None:  # one sync, to tell a model that is broken from the start from a divergence
            self.first_loss = float(loss.detach())

    def check_mean(self, mean: float, global_step: int) -> None:
        if not math.isfinite(mean):
            raise diverged(f"loss became {mean} by step {global_step}", self.first_loss, self.pointer)

    def check_before_save(self, window_finite: bool, global_step: int) -> None:
        if not window_finite:
            raise diverged(f"loss became non-finite by step {global_step}", self.first_loss, self.pointer)
