"""What every benchmark measures with: the interleaved clock, FLOPs, peak memory and the machine (docs/benchmark.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from math import prod

import timm
import torch
from torch import nn

import visionpe  # noqa: F401  (registers the models)

from ...engine.setup import run_model, to_device
from ...zoo.registry import family_of, list_visionpe_models
from .fsdp_memory import MMAP_THRESHOLD  # the probe process's glibc mmap threshold, as fsdp_memory's ranks

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
        """'0.95 [0.93-0.97]': the median and, in brackets, the spread_word(n)."""
        lo, hi = (self.q1, self.q3) if self.n >= 4 else (self.min, self.max)
        if self.n == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} [{lo:{spec}}-{hi:{spec}}]"

    def as_dict(self) -> dict:
        return asdict(self)


def spread_word(n: int) -> str:
    """What Spread.text gives in brackets for n rounds: the interquartile range, or with fewer than 4 the range."""
    return "interquartile range" if n >= 4 else "min-max"


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
        with torch.inference_mode(not train):
            out = run_model(model, x)
        if train:
            out.float().square().mean().backward()
            for p in model.parameters():
                p.grad = None
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


# --------------------------------------------------------------------------------------------------------------- FLOPs


def sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """aten::scaled_dot_product_attention(q [.., N, d], k [.., M, d], v [.., M, dv]): q k^T is N*M*d MACs per
    batch x head, probs @ v is N*M*dv; the softmax and the mask are element-wise and not counted."""
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    if None in (q, k, v):
        raise ValueError("scaled_dot_product_attention traced without complete shapes; trace with real tensors")
    batch_heads = prod(q[:-2])
    n, d, m, dv = q[-2], q[-1], k[-2], v[-1]
    return batch_heads * n * m * (d + dv)


class _Kwargs(nn.Module):
    """Positional tensors -> model(**kwargs), so fvcore can trace models that take dicts (multimodal)."""

    def __init__(self, model: nn.Module, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *args):
        return self.model(**dict(zip(self.keys, args)))


def count_flops(model: nn.Module, inputs) -> dict[str, int]:
    """MACs of one forward pass per aten op, e.g. {'linear': ..., 'conv': ...} (their sum: the total); the model in
    eval mode, `inputs` a tensor, a tuple of positional tensors or a dict of keyword tensors."""
    try:
        from fvcore.nn import FlopCountAnalysis
    except ImportError:
        raise ImportError('counting FLOPs needs fvcore: pip install "visionpe[bench]"') from None

    if isinstance(inputs, dict):
        model, inputs = _Kwargs(model, list(inputs)), tuple(inputs.values())
    was_training = model.training
    model.eval()
    logging.getLogger("fvcore").setLevel(logging.ERROR)  # traces of our layout caches are harmless
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(model, inputs if isinstance(inputs, tuple) else (inputs,))
            analysis.set_op_handle("aten::scaled_dot_product_attention", sdpa_flop_jit)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
            return dict(analysis.by_operator())
    finally:
        model.train(was_training)


# -------------------------------------------------------------------------------------------------------------- memory


def is_video(name: str) -> bool:
    """True for models that take clips [B, C, T, H, W]."""
    return isinstance(x := example_input(name, 32, 1), torch.Tensor) and x.ndim == 5


def example_input(name: str, size: int, batch: int, frames: int | None = None):
    """A random input of `size` px for `name`: its family's (clips of `frames` frames for video), else images."""
    if name in list_visionpe_models():
        return family_of(name).example_input(size, batch, frames)
    return torch.randn(batch, 3, size, size)


def cuda_peak_mb(step: Callable[[], object], device: str = "cuda") -> float:
    """Peak CUDA memory (MiB) allocated by `step()` beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def saved_activation_mb(model: nn.Module, x) -> float:
    """MiB of tensors autograd saves for backward in one training forward (weights excluded)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    was_training = model.training
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run_model(model, x)
    model.train(was_training)
    return sum(seen.values()) / 2**20


def peak_memory_mb(
    name: str,
    size: int,
    batch: int = 1,
    train: bool = False,
    model_kwargs: dict | None = None,
    frames: int | None = None,
    device: str = "cpu",
    model: nn.Module | None = None,
) -> float:
    """Peak memory (MiB) of one step of model `name` at `size` px beyond its weights (`model`: reuse on CUDA)."""
    kwargs = model_kwargs or {}
    if device.startswith("cuda"):
        model = (model or timm.create_model(name, **kwargs)).to(device).train(train)
        step = model_step(model, to_device(example_input(name, size, batch, frames), device), train)
        return cuda_peak_mb(step, device)
    spec = json.dumps(dict(name=name, size=size, batch=batch, train=train, kwargs=kwargs, frames=frames))
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))}
    probe = [sys.executable, "-m", "visionpe.bench.perf.measure", spec]  # this module's __main__: _child
    out = subprocess.run(probe, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {name} at {size} px failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- child process


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":")) / 1024  # kB


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where /proc/self/clear_refs is not writable."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _child(spec: dict) -> float:
    torch.set_num_threads(1)
    name, train, frames = spec["name"], spec["train"], spec.get("frames")
    model = timm.create_model(name, **spec.get("kwargs", {})).train(train)
    x = example_input(name, spec["size"], spec["batch"], frames)
    if "img_size" not in spec.get("kwargs", {}):  # timm's models are built for one size and cannot take 32 px
        try:  # warm-up: kernels and thread pools
            model_step(model, example_input(name, 32, 1, frames and 2), train)()
        except ValueError:  # a model with a minimum size (e.g. ViTAR's token merger): its default size
            model_step(model, example_input(name, model.pretrained_cfg["input_size"][-1], 1, frames and 2), train)()
    before = _status_mb("VmRSS")
    resettable = _reset_peak()
    model_step(model, x, train)()
    peak = _status_mb("VmHWM") if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return max(peak - before, 0.0)


def machine_info(device: str = "cpu") -> dict:
    """What the figures were measured on (no host names)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(
        cpu=cpu,
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        timm=timm.__version__,
        device=device,
        date=time.strftime("%Y-%m-%d"),
    )
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def machine_description(machine: dict) -> str:
    where = machine.get("gpu") or f"{machine['cpu']} ({machine['cores']} cores, {machine['threads']} torch threads)"
    return f"{where}, torch {machine['torch']}, timm {machine['timm']}"


if __name__ == "__main__":
    print(f"{_child(json.loads(sys.argv[1])):.1f}")
