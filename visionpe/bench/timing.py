"""Throughput measurement shared by the benchmark commands: images/s for inference and training steps.

Figures are reported as ratios against a baseline measured in the same run, with the runs interleaved
(A, B, A, B, ...) and the median kept, because the machines are shared and noisy.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["images_per_second", "interleaved_throughput", "peak_memory_mb"]


def _step(model: nn.Module, x, train: bool) -> None:
    if train:
        out = model(**x) if isinstance(x, dict) else model(x)
        out.float().square().mean().backward()
        for p in model.parameters():
            p.grad = None
    else:
        with torch.inference_mode():
            model(**x) if isinstance(x, dict) else model(x)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(
    model: nn.Module,
    x,
    train: bool = False,
    steps: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Images (batch items) per second of `steps` forward (or forward + backward) passes. `clock` may be
    time.process_time: CPU seconds, which a shared, oversubscribed machine disturbs far less than wall time."""
    model.train(train)
    batch = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
    device = next(model.parameters()).device
    for _ in range(warmup):
        _step(model, x, train)
    _sync(device)
    start = clock()
    for _ in range(steps):
        _step(model, x, train)
    _sync(device)
    return batch * steps / (clock() - start)


def interleaved_throughput(
    models: dict[str, nn.Module],
    make_input: Callable[[], object],
    train: bool,
    rounds: int = 3,
    steps: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median images/s of each model over `rounds` interleaved measurements."""
    x = make_input()
    for m in models.values():  # warm every model once before any timing
        images_per_second(m, x, train, steps=1, warmup=0)
    results: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, m in models.items():
            results[name].append(images_per_second(m, x, train, steps=steps, warmup=0, clock=clock))
    return {name: statistics.median(v) for name, v in results.items()}


def peak_memory_mb(
    name: str, size: int, batch: int = 1, train: bool = False, model_kwargs: dict | None = None
) -> float:
    """Peak memory (MiB) of one step of a registered model at `size`, beyond the model's own weights.

    On CPU there is no allocator high-water mark to reset, so each measurement runs in a fresh process and reads
    its peak resident set size (see visionpe.bench.memprobe); on CUDA the caller can use torch.cuda.max_memory_*.
    """
    cmd = [sys.executable, "-m", "visionpe.bench.memprobe", name, str(size), str(batch), "1" if train else "0"]
    cmd.append(json.dumps(model_kwargs or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {name} at {size} failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])
