"""The attention backends against the math reference, as dicts a report (`visionpe-bench gpu-check`) prints:
whether xformers can run here (`xformers_status`), a model's logits per backend and dtype (`check_model_backends`),
masked attention of native-resolution batches (`check_masked_backend`: one call, fp32 and bf16, images/s, peak
memory) and a model on a packed batch against each image alone (`check_native_model`). All run on any device (on
CPU: sdpa, flex in eager mode, math)."""

from __future__ import annotations

import importlib
import importlib.metadata
import time

import torch

from ...attention.backends import attend, attn_backend
from ...attention.masks import AttnMask
from ...layout.batch import pack_images

__all__ = ["xformers_status", "check_model_backends", "packed_segment_ids", "check_masked_backend",
           "check_native_model", "TOLERANCE", "MODEL_TOLERANCE"]  # fmt: skip

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # max error relative to the output's scale
# Largest |backend - math| relative to max |math| of a model's logits (check_model_backends, check_native_model).
# fp32: unit roundoff 6e-8, and the backends order the sums of a few hundred products per dot product and softmax row
# differently, through 2 blocks: ~1e-6 expected, 1e-4 leaves room for TF32-free reordering on any kernel. bf16: unit
# roundoff 3.9e-3 on every stored activation, several roundings per block, 2 blocks: a few 1e-2 expected.
MODEL_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 6e-2}


def xformers_status() -> dict:
    """Installed versions and whether xformers' compiled ops load (and run, on CUDA); `reason` says why not."""
    info: dict = dict(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    try:
        info["xformers"] = importlib.metadata.version("xformers")
    except importlib.metadata.PackageNotFoundError:
        return dict(info, xformers=None, usable=False, reason="xformers is not installed (pip install '.[xformers]')")
    reqs = importlib.metadata.requires("xformers") or []
    info["xformers_requires_torch"] = next((r.split(";")[0][5:].strip() for r in reqs if r.startswith("torch")), None)
    try:
        import xformers.ops as xops

        info["ops_import"] = True
    except Exception as e:  # a build for another torch can fail here with an undefined-symbol or version error
        return dict(info, ops_import=False, usable=False, reason=f"import xformers.ops: {type(e).__name__}: {e}")
    try:  # a build for another torch imports with a warning, but its compiled extension does not load
        importlib.import_module("xformers._C")
        info["compiled_ops"] = True
    except (ImportError, OSError) as e:
        why = f"xformers' compiled ops do not load with torch {torch.__version__}: {str(e)[:160]}"
        return dict(info, compiled_ops=False, usable=False, reason=why)
    if not torch.cuda.is_available():
        return dict(info, usable=False, reason="xformers' kernels run on CUDA only")
    try:
        q = torch.randn(1, 16, 2, 32, device="cuda", dtype=torch.float16)
        xops.memory_efficient_attention(q, q, q)
    except Exception as e:
        return dict(info, usable=False, reason=f"memory_efficient_attention failed: {type(e).__name__}: {e}")
    return dict(info, usable=True, reason="")


def error_text(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


def _logits(model, x: torch.Tensor, dtype: torch.dtype, backend: str) -> torch.Tensor:
    mixed = torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), mixed, attn_backend(backend):
        return model(x).float()


def check_model_backends(model, x: torch.Tensor, backends: list[str], dtypes: list[torch.dtype]) -> list[dict]:
    """Per dtype and backend, {dtype, backend, rel_err, tol, ok}: the max |backend - math| / max |math| of the
    model's logits on `x` (eval mode; bf16 under autocast with fp32 weights, as mixed precision runs), or {dtype,
    backend, error, ok=False} where the backend (or the math reference) fails: reported, not raised."""
    rows = []
    for dtype in dtypes:
        label = str(dtype).removeprefix("torch.")
        try:
            ref = _logits(model, x, dtype, "math")
        except Exception as e:
            rows += [dict(dtype=label, backend=b, error=f"math reference: {error_text(e)}", ok=False) for b in backends]
            continue
        for backend in backends:
            try:
                err = ((_logits(model, x, dtype, backend) - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
            except Exception as e:
                rows.append(dict(dtype=label, backend=backend, error=error_text(e), ok=False))
                continue
            tol = MODEL_TOLERANCE[dtype]
            rows.append(dict(dtype=label, backend=backend, rel_err=err, tol=tol, ok=err <= tol))
    return rows


def packed_segment_ids(rows: int, length: int, images_per_row: int, seed: int = 0) -> torch.Tensor:
    """long [rows, length]: each row packed with `images_per_row` segments of random lengths, then padding (-1)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((rows, length), -1, dtype=torch.long)
    for r in range(rows):
        cuts = torch.randperm(length - 1, generator=gen)[:images_per_row].add(1).sort().values.tolist()
        bounds = [0, *cuts]
        for j in range(images_per_row):  # the last cut starts the padding
            ids[r, bounds[j] : bounds[j + 1]] = j
    return ids


def _timed(fn, device: torch.device, reps: int) -> float:
    """Seconds per call (after one warm-up call: compilation, caches)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps


def check_masked_backend(
    backend: str,
    device: str | torch.device = "cuda",
    rows: int = 8,
    length: int = 1024,
    images_per_row: int = 4,
    heads: int = 6,
    head_dim: int = 64,
    with_bias: bool = False,
    reps: int = 10,
) -> dict:
    """Masked attention of one packed batch on `backend` against the math reference (fp64 on CPU; fp32 where
    float64 is slow, i.e. CUDA): per dtype the max error relative to the output's scale and whether it is within
    TOLERANCE, images/s (segments per second, padding excluded) and peak memory of the backend's call (CUDA)."""
    device = torch.device(device)
    ids = packed_segment_ids(rows, length, images_per_row).to(device)
    mask = AttnMask(ids)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(rows, heads, length, head_dim, device=device, generator=gen) for _ in range(3))
    bias = torch.randn(1, heads, length, length, device=device, generator=gen) if with_bias else None
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32
    with attn_backend("math"):
        cast = [t.to(ref_dtype) if t is not None else None for t in (q, k, v, bias)]
        ref = attend(*cast[:3], cast[3], mask=AttnMask(ids)).float()
    result = dict(backend=backend, device=str(device), rows=rows, length=length, images=rows * images_per_row)
    for dtype in (torch.float32, torch.bfloat16):
        args = [t.to(dtype) if t is not None else None for t in (q, k, v, bias)]
        with attn_backend(backend):
            out = attend(*args[:3], args[3], mask=mask).float()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            seconds = _timed(lambda a=args: attend(*a[:3], a[3], mask=mask), device, reps)
        name = "fp32" if dtype == torch.float32 else "bf16"
        err = float((out - ref).abs().max() / ref.abs().max())
        result[f"{name}_max_rel_err"] = err
        result[f"{name}_ok"] = bool(torch.isfinite(out).all()) and err <= TOLERANCE[dtype]
        result[f"{name}_images_per_s"] = rows * images_per_row / seconds
        if device.type == "cuda":
            result[f"{name}_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return result


GRIDS = [(6, 18), (18, 6), (10, 10), (8, 12), (12, 8), (1, 16), (16, 16), (7, 14)]  # aspect ratios 1:3 to 3:1


def check_native_model(model, backend: str, device: str | torch.device = "cuda", reps: int = 3) -> dict:
    """A ViT (eval mode) on a packed batch of images of the GRIDS sizes, two per row, under `backend`, against each
    image alone on the math backend in fp32: per dtype the logits' max error relative to their scale and whether
    it is within MODEL_TOLERANCE, and images/s of the packed batch (bf16 on CUDA only)."""
    device = torch.device(device)
    model = model.to(device).eval()
    p = model.patch_embed.patch_size[0]
    gen = torch.Generator().manual_seed(0)
    images = [torch.randn(3, h * p, w * p, generator=gen) for h, w in GRIDS]
    batch = {k: v.to(device) for k, v in pack_images([images[i : i + 2] for i in range(0, len(images), 2)], p).items()}
    with torch.no_grad(), attn_backend("math"):
        want = torch.cat([model(img[None].to(device)) for img in images]).float()
    result = dict(backend=backend, device=str(device), images=len(images))
    dtypes = (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,)
    for dtype in dtypes:
        name = "fp32" if dtype == torch.float32 else "bf16"

        def run(dtype=dtype):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                return model(batch)

        with torch.no_grad(), attn_backend(backend):
            got = run().float()
            seconds = _timed(run, device, reps)
        err = float((got - want).abs().max() / want.abs().max())
        result[f"{name}_max_rel_err"] = err
        result[f"{name}_ok"] = bool(torch.isfinite(got).all()) and err <= MODEL_TOLERANCE[dtype]
        result[f"{name}_images_per_s"] = len(images) / seconds
    return result
