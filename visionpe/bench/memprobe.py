"""The one memory probe of every benchmark: peak memory of one step beyond the model's weights.

On CUDA: the allocator's high-water mark around the step (`cuda_peak_mb`). On CPU there is no allocator mark to reset,
so each measurement runs in a fresh process (`python -m visionpe.bench.memprobe SPEC_JSON`) that warms the model up on
a tiny input, resets the kernel's peak resident set size (VmHWM, via /proc/self/clear_refs) and reads it after the
step. That process runs with glibc's mmap threshold fixed at 256 KiB (MALLOC_MMAP_THRESHOLD_): every tensor of 256 KiB
or more is then its own mapping, returned to the kernel when freed, so the peak follows the live tensors, as CUDA's
allocated-bytes mark does. With glibc's default (a threshold that grows to 32 MiB after the first large frees) the
resident set also holds freed heap blocks: ViT-B/16 at 1024 px read 222 MiB for vit_b_ape and 463 MiB for vit_b_irpe,
against 167 and 188 MiB with the fixed threshold; the difference was the heap's high-water mark, not tensors.
`saved_activation_mb` counts the bytes autograd keeps for backward: exact and free of allocator noise.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable

import timm
import torch
from torch import nn

import visionpe  # noqa: F401  (registers the models)

from ..zoo import family_of, list_visionpe_models

__all__ = ["example_input", "is_video", "peak_memory_mb", "cuda_peak_mb", "saved_activation_mb", "MMAP_THRESHOLD"]

MMAP_THRESHOLD = 256 * 1024  # bytes: allocations this large get their own mapping in the probe process (glibc)


def is_video(name: str) -> bool:
    """True for models that take clips [B, C, T, H, W]."""
    if name not in list_visionpe_models():
        return False
    make = getattr(family_of(name), "example_input", None)
    return make is not None and isinstance(x := make(32, 1), torch.Tensor) and x.ndim == 5


def example_input(name: str, size: int, batch: int, frames: int | None = None, in_chans: int = 3):
    """A random input of `size` px for `name`: its family's example input (clips of `frames` frames for video)."""
    if name in list_visionpe_models():
        make = getattr(family_of(name), "example_input", None)
        if make is not None:
            x = make(size, batch)
            if frames is not None and isinstance(x, torch.Tensor) and x.ndim == 5:
                x = torch.randn(batch, x.shape[1], frames, size, size)
            return x
    return torch.randn(batch, in_chans, size, size)


def _run(model: nn.Module, x, train: bool) -> None:
    if train:
        out = model(**x) if isinstance(x, dict) else model(x)
        out.float().square().mean().backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.inference_mode():
            model(**x) if isinstance(x, dict) else model(x)


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
        model(**x) if isinstance(x, dict) else model(x)
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
        x = example_input(name, size, batch, frames)
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
        return cuda_peak_mb(lambda: _run(model, x, train), device)
    spec = dict(name=name, size=size, batch=batch, train=train, kwargs=kwargs, frames=frames)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))}
    out = subprocess.run(
        [sys.executable, "-m", "visionpe.bench.memprobe", json.dumps(spec)], capture_output=True, text=True, env=env
    )
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
            _run(model, example_input(name, 32, 1, frames and 2), train)
        except ValueError:  # a model with a minimum size (e.g. ViTAR's token merger): its default size
            _run(model, example_input(name, model.pretrained_cfg["input_size"][-1], 1, frames and 2), train)
    before = _status_mb("VmRSS")
    resettable = _reset_peak()
    _run(model, x, train)
    peak = _status_mb("VmHWM") if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return max(peak - before, 0.0)


if __name__ == "__main__":
    print(f"{_child(json.loads(sys.argv[1])):.1f}")
