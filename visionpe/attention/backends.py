"""One entry point for scaled dot-product attention: `attend(q, k, v, bias=None, scale=None)`.

Backends: xformers' memory-efficient kernel (CUDA), PyTorch SDPA, flex attention (masked calls), and an explicit
`math` reference. `auto` picks the fastest that supports the call, and drops a kernel that fails on this machine
(flex without Triton, xformers' ops built for another torch) with one warning: SDPA answers instead. Naming a backend
that cannot run the call raises. Select with VISIONPE_ATTN=auto|xformers|sdpa|flex|math or `set_attn_backend(...)`.

`mask=` (a `visionpe.attention.AttnMask`) blocks attention between the images of a padded or packed batch: SDPA
takes it as a boolean mask, math as -inf logits, flex as a BlockMask (auto's choice on CUDA for a masked call without
a bias), xformers as a BlockDiagonalMask when every segment is contiguous.

`attend_rows` runs attention a block of query rows at a time with position terms that can be produced per block
(`RowBias`, `RowValue` of visionpe.attention, e.g. iRPE's bucketed terms): peak memory O(rows x M) instead of
O(N x M), and the bias-only case still runs on the fused backends. The `math` backend keeps the whole-matrix
reference path.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..fx import is_fx_tracing
from .masks import AttnMask, flex_attend, flex_available, xformers_block_attend
from .rows import RowBias, RowValue

__all__ = [
    "attend",
    "attend_with_probs",
    "attend_rows",
    "set_attn_backend",
    "get_attn_backend",
    "check_attn_backend",
    "attn_backend",
    "BACKENDS",
    "ROW_BLOCK_ELEMENTS",
]

BACKENDS = ("auto", "xformers", "sdpa", "flex", "math")
_backend: str | None = None  # None: read VISIONPE_ATTN


def set_attn_backend(name: str) -> None:
    """Choose the attention backend for every later call ('auto', 'xformers', 'sdpa', 'flex' or 'math')."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    _backend = name


def get_attn_backend() -> str:
    name = _backend if _backend is not None else os.environ.get("VISIONPE_ATTN", "auto")
    if name not in BACKENDS:
        raise ValueError(f"VISIONPE_ATTN={name!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    return name


def check_attn_backend(device: torch.device) -> str:
    """The selected backend, checked against the device a run will use before any work: an unknown name, or
    xformers where it cannot run, is a ValueError naming the setting."""
    name = get_attn_backend()
    where = "VISIONPE_ATTN" if _backend is None else "set_attn_backend"
    if name == "flex" and not flex_available():
        raise ValueError(f"{where}=flex but this PyTorch has no flex attention; use auto or sdpa")
    if name == "xformers":
        if not xformers_available():
            raise ValueError(f"{where}=xformers but xformers is not installed; use auto or sdpa")
        if device.type != "cuda":
            raise ValueError(f"{where}=xformers runs on CUDA only, and this run is on {device}; use auto or sdpa")
    return name


@contextlib.contextmanager
def attn_backend(name: str) -> Iterator[None]:
    """Temporarily use one backend: `with attn_backend("math"): ...`."""
    global _backend
    previous = _backend
    set_attn_backend(name)
    try:
        yield
    finally:
        _backend = previous


# ---------------------------------------------------------------------------------------------------- capabilities


@functools.lru_cache(maxsize=1)
def xformers_available() -> bool:
    """True when xformers is installed (imported lazily: importing it is slow and it cannot run on CPU)."""
    return importlib.util.find_spec("xformers") is not None


_auto_failed: dict[str, str] = {}  # backend -> why its kernel failed under `auto` (auto no longer picks it)


def _drop_from_auto(backend: str, error: Exception) -> None:
    """auto's call on `backend` failed on this machine (flex without Triton, xformers' ops built for another torch):
    warn once, stop choosing it."""
    if backend not in _auto_failed:
        warnings.warn(f"{backend} attention failed ({error!r}); attention falls back to SDPA", stacklevel=3)
    _auto_failed[backend] = repr(error)


def xformers_supports(q: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, str]:
    """Whether xformers' memory-efficient kernel can run this call, and if not, why."""
    if not xformers_available():
        return False, "xformers is not installed (pip install 'visionpe[xformers]')"
    if not q.is_cuda:
        return False, "xformers runs on CUDA tensors only"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False, f"xformers does not take {q.dtype}"
    if bias is not None and not isinstance(bias, torch.Tensor):
        return False, "xformers takes tensor biases only"
    return True, ""


# -------------------------------------------------------------------------------------------------------- backends


def attend_with_probs(q, k, v, bias=None, scale: float | None = None, mask: AttnMask | None = None):
    """The math reference: `attend`'s output (tensors as there) and the attention probabilities [B, H, N, M]."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    attn = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn + bias.to(attn.dtype)  # as SDPA does: an fp32 bias on a bf16 model
    if mask is not None:
        attn = mask.apply(attn)
    probs = attn.softmax(dim=-1)
    return probs @ v, probs


def _sdpa(q, k, v, bias, scale, mask: AttnMask | None = None):
    if bias is not None:
        bias = bias.to(q.dtype)
    if mask is not None:
        bias = mask.dense() if bias is None else mask.apply(bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _aligned_bias(bias: torch.Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """xformers needs a bias of the full [B, H, N, M] shape whose row stride is a multiple of 8 elements."""
    b, h, n, m = shape
    m_pad = (m + 7) // 8 * 8
    storage = torch.empty(b, h, n, m_pad, dtype=dtype, device=bias.device)
    aligned = storage[..., :m]
    aligned.copy_(bias.expand(b, h, n, m))
    return aligned


def _xformers(q, k, v, bias, scale, mask: AttnMask | None = None):
    import xformers.ops as xops

    b, h, n, _ = q.shape
    m = k.shape[-2]
    if mask is not None:
        seqlens = mask.seqlens() if bias is None else None
        if seqlens is not None:
            return xformers_block_attend(q, k, v, scale, seqlens)
        bias = mask.apply(torch.zeros((), dtype=q.dtype, device=q.device) if bias is None else bias.to(q.dtype))
    if bias is not None:
        bias = _aligned_bias(bias, (b, h, n, m), q.dtype)
    # xformers takes [B, M, H, K] (tokens before heads)
    out = xops.memory_efficient_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, scale=scale
    )
    return out.transpose(1, 2)


def on_cuda(q: torch.Tensor) -> bool:
    """Whether a call runs on CUDA (a function, so tests can pretend)."""
    return q.is_cuda


def _auto_xformers(q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return "xformers" not in _auto_failed and xformers_supports(q, bias)[0]


def resolve_backend(q: torch.Tensor, bias: torch.Tensor | None, mask: AttnMask | None = None) -> str:
    """The backend that will run this call under the current selection."""
    name = get_attn_backend()
    if name == "auto":
        if is_fx_tracing():  # an FX graph keeps PyTorch's kernel (the tensors' device is not known while tracing)
            return "sdpa"
        if mask is not None:
            if bias is None and on_cuda(q) and flex_available() and "flex" not in _auto_failed:
                return "flex"  # block-sparse: skips the blocks between images
            if bias is None and _auto_xformers(q, bias) and mask.seqlens() is not None:
                return "xformers"  # contiguous segments: a BlockDiagonalMask
            return "sdpa"  # a dense mask (xformers would need it as an aligned bias)
        return "xformers" if _auto_xformers(q, bias) else "sdpa"
    if name == "flex":
        if not flex_available():
            raise RuntimeError("attention backend 'flex' cannot run this call: no flex attention in this PyTorch")
        if mask is None:
            return "sdpa"  # flex only changes masked calls
    if name == "xformers":
        ok, why = xformers_supports(q, bias)
        if not ok:
            raise RuntimeError(f"attention backend 'xformers' cannot run this call: {why}; use 'auto' or 'sdpa'")
    return name


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    mask: AttnMask | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for q [B, H, N, d], k/v [B, H, M, d], bias broadcastable to [B, H, N, M];
    mask: an AttnMask over the N = M tokens (attention only within each segment)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    backend = resolve_backend(q, bias, mask)
    if backend == "math":
        return attend_with_probs(q, k, v, bias, scale, mask)[0]
    kernel = _sdpa if backend == "sdpa" else _xformers if backend == "xformers" else flex_attend
    if backend == "sdpa" or get_attn_backend() != "auto":
        return kernel(q, k, v, bias, scale, mask)
    try:  # auto falls back to sdpa, and a kernel that fails here is not picked again
        return kernel(q, k, v, bias, scale, mask)
    except torch.cuda.OutOfMemoryError:
        raise  # the call is too large; the kernel itself works
    except Exception as error:  # noqa: BLE001
        _drop_from_auto(backend, error)
        return _sdpa(q, k, v, bias, scale, mask)


# ------------------------------------------------------------------------------------------------ row-block terms

ROW_BLOCK_ELEMENTS = 1 << 21  # logits elements per query block ([B, H, rows, M]): 8 MiB in fp32
ROW_ALIGN = 32  # blocks of more rows are cut to a multiple of this (the CPU flash kernel's query tile)


def _block_probs(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + bias) of one row block, the bias added in place (matmul's backward does not read its
    output, so this is autograd-safe) and, without autograd, the softmax too: one [B, H, rows, M] tensor besides the
    bias (two with autograd)."""
    attn = (q * scale) @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn.add_(bias.to(attn.dtype))
        del bias  # the caller holds no reference: freed here
    if torch.is_grad_enabled() and attn.requires_grad:
        return attn.softmax(dim=-1)
    return torch.softmax(attn, dim=-1, out=attn)


def attend_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: RowBias | None = None,
    value: RowValue | None = None,
    scale: float | None = None,
    block_elements: int | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v (+ value term), computed a block of query rows at a time.

    The bias of each block is built just before it is used (so at most [B, H, rows, M] exists at a time) and passed
    to `attend` (fused backends); with a value term the block runs on the math path, whose probabilities feed it.
    rows = block_elements // (B * H * M), at least 1 (default ROW_BLOCK_ELEMENTS)."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    b, h, n, _ = q.shape
    m = k.shape[-2]
    budget = ROW_BLOCK_ELEMENTS if block_elements is None else block_elements
    step = max(1, min(n, budget // max(1, b * h * m)))
    if ROW_ALIGN < step < n:
        step -= step % ROW_ALIGN  # whole tiles of the fused kernels
    if step < n:  # the fused kernels take contiguous keys and values: copy them once, not once per block
        k, v = k.contiguous(), v.contiguous()
    state = bias.prepare(q, k) if bias is not None else None
    outs = []
    for start in range(0, n, step):
        stop = min(n, start + step)
        qb = q[:, :, start:stop] if step < n else q
        # the block's bias is not held here, so it is freed once used (before the softmax on the math path)
        if value is None:
            outs.append(attend(qb, k, v, bias.rows(state, start, stop) if bias is not None else None, scale))
        else:
            probs = _block_probs(qb, k, bias.rows(state, start, stop) if bias is not None else None, scale)
            outs.append((probs @ v).add_(value.rows(probs, start, stop)))
            del probs  # freed before the next block's logits
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
