"""SIGTERM (what SLURM and Kubernetes send before a kill) and SIGINT (Ctrl-C) during training: stop cleanly.

The first such signal only sets a flag; the trainer looks at it after every step (every rank agrees on it, see
Trainer._stop_signal), writes a checkpoint there and raises TrainingInterrupted, which the command line reports in
one line with the resume command and the signal's conventional exit status (128 + number: 143, 130). A second signal
acts as it would have without this (Ctrl-C twice: KeyboardInterrupt; the checkpoint files are written atomically).
`run_stoppable` runs many such jobs, here or in worker processes, and stops them all the same way.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from .distributed import resume_command

__all__ = ["StopOnSignal", "TrainingInterrupted", "JobStopped", "STOP_SIGNALS", "interrupted", "diverged",
           "run_stoppable", "stopped_job", "worker_init"]  # fmt: skip

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


# ------------------------------------------------------------------------------------------- many jobs, stoppable


class JobStopped(Exception):
    """A job of `run_stoppable` stopped on SIGTERM / SIGINT; args: (message, signal number). Picklable across
    processes."""


def stopped_job(signum: int, where: str) -> JobStopped:
    return JobStopped(f"stopped by {signal.Signals(signum).name}{where}", signum)


_WORKER_STOP = types.SimpleNamespace(signum=0)  # the stop signal a worker process received (0: none)


def _note_stop(signum, frame) -> None:
    _WORKER_STOP.signum = _WORKER_STOP.signum or signum


def worker_init(threads: int, parent: int) -> None:
    """A worker process: `threads` torch threads, stop signals noted for its job, and exit when `parent` is gone."""
    torch.set_num_threads(threads)
    for s in STOP_SIGNALS:  # the job stops at its next step or point (the trainer's own handler nests)
        signal.signal(s, _note_stop)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()


def _exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """Stop this worker once the parent process is gone: an orphan would go on writing into its runs folder."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(1)


def _in_worker(work: Callable, item):
    return work(item, _WORKER_STOP)


def run_stoppable(work: Callable, items: list, done: Callable, processes: int = 1, threads: int = 1) -> None:
    """Call work(item, stop) for every item, here or in `processes` spawned worker processes (`threads` torch threads
    each; `work` must pickle), and done(item, result, error) after each: a failed item does not stop the others
    (VISIONPE_DEBUG=1 raises its error). `stop.signum` is the stop signal received (0: none); `work` checks it between
    steps and raises JobStopped. A stop signal here cancels the items not started and passes SIGTERM on to the
    workers, which stop at their next step; then JobStopped."""
    if processes == 1 or len(items) <= 1:
        with StopOnSignal() as stop:
            for item in items:
                try:
                    result = work(item, stop)
                except Exception as e:
                    if isinstance(e, JobStopped) or os.environ.get("VISIONPE_DEBUG"):
                        raise
                    done(item, None, e)
                else:
                    done(item, result, None)
        return
    stopped: JobStopped | None = None
    with StopOnSignal() as stop, ProcessPoolExecutor(
        min(processes, len(items)), mp_context=multiprocessing.get_context("spawn"),
        initializer=worker_init, initargs=(threads, os.getpid()),
    ) as pool:  # fmt: skip
        futures = {pool.submit(_in_worker, work, item): item for item in items}
        remaining = set(futures)
        while remaining:
            finished, remaining = wait(remaining, timeout=0.5, return_when=FIRST_COMPLETED)
            if stop.signum and stopped is None:
                stopped = stopped_job(stop.signum, "")
                remaining = {f for f in remaining if not f.cancel()}
                for proc in list(getattr(pool, "_processes", {}).values()):  # the executor's own worker table
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGTERM)
            for fut in finished:  # a cancelled future left `remaining` when it was cancelled
                err = fut.exception()
                if isinstance(err, JobStopped):
                    stopped = stopped or err
                else:
                    done(futures[fut], None if err else fut.result(), err)
    if stopped is not None:
        raise stopped
