"""The one clock of every speed measurement: interleaved rounds, per-round rates, ratios with their spread.

Each round runs every task once, in a fresh random order, so that load from other processes drifting over the run
hits all of them alike; a ratio is taken per round (paired) and summarised by its median, quartiles and range.
Clocks: 'wall' (wall-clock seconds; CUDA work is synchronised before each reading) and 'cpu' (CPU seconds of the
calling thread with torch on one thread: a shared, oversubscribed machine disturbs it far less than wall time).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["CLOCKS", "Clock", "Spread", "spread", "torch_threads", "model_step", "interleave", "paired_ratios"]

CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Clock:
    kind: str = "wall"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.kind not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {self.kind!r}")
        if self.kind == "cpu" and not self.device.startswith("cpu"):
            raise ValueError(f"the 'cpu' clock counts CPU work; use the 'wall' clock on {self.device}")

    @staticmethod
    def default(device: str) -> str:
        return "cpu" if device.startswith("cpu") else "wall"

    def now(self) -> float:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
        return time.thread_time() if self.kind == "cpu" else time.perf_counter()

    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU seconds of one thread (robust to other work on a shared machine)"
        return "wall-clock seconds"


@dataclass
class Spread:
    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    def text(self, spec: str = ".2f") -> str:
        """'0.95 [0.93-0.97]': median and interquartile range (the range itself with fewer than 4 rounds)."""
        lo, hi = (self.q1, self.q3) if self.n >= 4 else (self.min, self.max)
        if self.n == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} [{lo:{spec}}-{hi:{spec}}]"

    def as_dict(self) -> dict:
        return asdict(self)


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("no values to summarise")
    v = sorted(values)
    q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else (v[0], v[0], v[0])
    return Spread(statistics.median(v), q1, q3, v[0], v[-1], len(v))


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with `n` torch threads (None: leave as is), restoring the previous count after."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_step(model: nn.Module, x, train: bool) -> Callable[[], int]:
    """One forward (inference mode) or forward + backward of `model` on `x`; returns the batch size (items done)."""
    batch = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]

    def step() -> int:
        model.train(train)
        if train:
            out = model(**x) if isinstance(x, dict) else model(x)
            out.float().square().mean().backward()
            for p in model.parameters():
                p.grad = None
        else:
            with torch.inference_mode():
                model(**x) if isinstance(x, dict) else model(x)
        return batch

    return step


def interleave(
    tasks: dict[str, Callable[[], int]], clock: Clock, rounds: int = 3, steps: int = 1, warmup: int = 1, seed: int = 0
) -> dict[str, list[float]]:
    """Items per second of each task in each of `rounds` rounds (`steps` calls timed per task and round); every task
    runs `warmup` untimed calls first, and each round visits the tasks in a fresh random order."""
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be at least 1, got {rounds} and {steps}")
    for task in tasks.values():
        for _ in range(warmup):
            task()
    rng = random.Random(seed)
    rates: dict[str, list[float]] = {name: [] for name in tasks}
    for _ in range(rounds):
        for name in rng.sample(list(tasks), len(tasks)):
            start = clock.now()
            items = sum(tasks[name]() for _ in range(steps))
            rates[name].append(items / max(clock.now() - start, 1e-9))
    return rates


def paired_ratios(rates: dict[str, list[float]], baseline: str) -> dict[str, list[float]]:
    """Per-round rate of each task over the baseline's rate in the same round."""
    if baseline not in rates:
        raise ValueError(f"baseline {baseline!r} was not measured; measured: {', '.join(rates)}")
    base = rates[baseline]
    return {name: [a / b for a, b in zip(v, base)] for name, v in rates.items()}
