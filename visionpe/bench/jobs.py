"""The benchmark's runs as stoppable jobs: `run_stoppable` calls a job per item, here or in spawned worker processes,
and stops them all on SIGTERM / SIGINT as training stops (visionpe.engine.interrupt): the jobs checkpoint at their
next step and the benchmark raises JobStopped, which its command reports in one line."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

import torch

from ..engine.interrupt import STOP_SIGNALS, StopOnSignal

__all__ = ["JobStopped", "run_stoppable", "stopped_job", "worker_init"]


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
