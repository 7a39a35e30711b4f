"""SIGTERM (what SLURM and Kubernetes send before a kill) and SIGINT (Ctrl-C) during training: stop cleanly.

The first such signal only sets a flag; the trainer looks at it after every step (every rank agrees on it, see
Trainer._stop_signal), writes a checkpoint there and raises TrainingInterrupted, which the command line reports in
one line with the resume command and the signal's conventional exit status (128 + number: 143, 130). A second signal
acts as it would have without this (Ctrl-C twice: KeyboardInterrupt; the checkpoint files are written atomically).
"""

from __future__ import annotations

import signal
import threading

__all__ = ["StopOnSignal", "TrainingInterrupted", "STOP_SIGNALS"]

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
