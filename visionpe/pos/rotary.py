"""The one rotary kernel every RoPE variant shares.

angle[n, c] = sum_s pos[n, s] * F[s, c]: positions [N, S] (from a TokenLayout) times a frequency matrix F [S, d/2]
(or [S, heads, d/2] for per-head frequencies). Channel pairs (0, 1), (2, 3), ... rotate by angle[:, c]
(interleaved, as complex numbers), or, in the rotate-half layout (`half=True`, DINOv3 / timm's `rotate_half`),
channels (c, c + d/2). Angles and the rotation run in fp32, also under autocast; prefix tokens get angle 0, which is
an exact identity (cos 0 = 1, sin 0 = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from timm.layers import register_notrace_function

from ..fx import is_fx_tracing
from .table_cache import TableCache

__all__ = [
    "rotary_angles",
    "rotary_cos_sin",
    "apply_rotary",
    "axial_frequencies",
    "rope_frequencies",
    "FixedCosSinCache",
    "check_p_rope",
    "p_rope_keep",
    "scaled_cos_sin",
]


def no_autocast(device: torch.device):
    """Autocast switched off on `device`; a no-op on device types without autocast (meta, ...)."""
    if not is_fx_tracing() and torch.amp.is_autocast_available(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return nullcontext()


def rope_frequencies(num: int, theta: float, dim: int | None = None) -> torch.Tensor:
    """The classic 1D RoPE inverse frequencies theta^(-2j/dim), j = 0..num-1 (dim defaults to 2 * num pairs)."""
    dim = 2 * num if dim is None else dim
    return theta ** (-2.0 * torch.arange(num, dtype=torch.float32) / dim)


def axial_frequencies(head_dim: int, theta: float, num_axes: int = 2) -> torch.Tensor:
    """Axial frequency matrix F [num_axes, d/2]: the first d/(2*axes) pairs read axis 0, the next axis 1, ...

    Each axis block uses f_j = theta^(-2*axes*j/d) (for 2D: theta^(-4j/d), j = 0..d/4-1).
    """
    pairs = head_dim // 2
    if head_dim % (2 * num_axes):
        raise ValueError(f"head dim {head_dim} must be divisible by {2 * num_axes} for {num_axes}-axis RoPE")
    per_axis = pairs // num_axes
    f = theta ** (-torch.arange(per_axis, dtype=torch.float32) / per_axis)
    freqs = torch.zeros(num_axes, pairs)
    for a in range(num_axes):
        freqs[a, a * per_axis : (a + 1) * per_axis] = f
    return freqs


def check_p_rope(p: float) -> float:
    """p-RoPE's kept fraction as a float, or a ValueError unless 0 <= p <= 1."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"p (p-RoPE's fraction of rotary frequencies kept) must be in [0, 1], got {p!r}")
    return float(p)


def p_rope_keep(ladders: Sequence[int], p: float) -> torch.Tensor:
    """p-RoPE (Barbero et al., ICLR 2025): which rotary pairs keep their frequency, bool [C].

    ladders (C numbers): the ladder (an axis, a stream) each pair's frequency comes from, its pairs in order of
    falling frequency. Of a ladder's n pairs the first int(p * 2n // 2) keep their frequency (transformers'
    `proportional` RoPE count); the rest, its lowest frequencies, get frequency 0: no rotation at any position."""
    ladders = [int(a) for a in ladders]
    seen = {a: 0 for a in ladders}
    keep = []
    for a in ladders:
        keep.append(seen[a] < int(p * (2 * ladders.count(a)) // 2))
        seen[a] += 1
    return torch.tensor(keep, dtype=torch.bool)


def rotary_angles(pos: torch.Tensor, freqs: torch.Tensor, num_prefix: int = 0) -> torch.Tensor:
    """Angles [P + N, d/2] (or [heads, P + N, d/2] for freqs [S, heads, d/2]) in fp32; prefix rows are 0."""
    with no_autocast(pos.device):
        pos = pos.float()
        freqs = freqs.float()
        if freqs.ndim == 2:  # [S, C]
            angles = (pos.unsqueeze(-1) * freqs.unsqueeze(0)).sum(1)  # [N, C]
        else:  # [S, H, C] -> [H, N, C]; elementwise products avoid autocast's reduced-precision matmul
            angles = (pos.t()[:, None, :, None] * freqs[:, :, None, :]).sum(0)
        if num_prefix:
            angles = torch.cat([angles.new_zeros(*angles.shape[:-2], num_prefix, angles.shape[-1]), angles], dim=-2)
    return angles


def rotary_cos_sin(angles: torch.Tensor, half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of angles [..., C] repeated per channel pair -> [..., 2C], fp32: [a0, a0, a1, a1, ...], or with
    half=True [a0, a1, ..., a0, a1, ...] with sin signed [-sin, sin] (the rotation is then x cos + roll(x) sin)."""
    with no_autocast(angles.device):
        if half:
            sin = angles.sin()
            return torch.cat([angles.cos()] * 2, dim=-1), torch.cat([-sin, sin], dim=-1)
        cos = angles.cos().repeat_interleave(2, dim=-1)
        sin = angles.sin().repeat_interleave(2, dim=-1)
    return cos, sin


@register_notrace_function  # FX: one graph leaf (reads the frequency tensor's shape and device)
def scaled_cos_sin(
    pos: torch.Tensor, freqs: torch.Tensor, num_prefix: int, half: bool = False, gain: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [P + N, d] of positions [N, S] under F; gain != 1 scales both (YaRN's temperature on q and k)."""
    cos, sin = rotary_cos_sin(rotary_angles(pos, freqs, num_prefix), half)
    return (cos, sin) if gain == 1.0 else (cos * gain, sin * gain)


torch.fx.wrap("scaled_cos_sin")


class FixedCosSinCache(TableCache):
    """cos/sin of fixed frequencies, kept for the last few layouts (the same positions tensor, prefix count, pair
    count, device and tag hit; the tag names anything else the frequencies depend on, e.g. a test-time scaling).
    Computed in the graph while tracing (TableCache.lookup)."""

    def __call__(
        self, layout, freqs: torch.Tensor, tag=None, half: bool = False, gain: float = 1.0, pos: torch.Tensor = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """pos: positions to use instead of layout.pos (a PE's own coordinates of the layout, cached by identity)."""
        pos = layout.pos if pos is None else pos
        key = (layout.num_prefix, freqs.shape[-1], freqs.device, freqs.dtype, tag, half, gain)
        return self.lookup(key, lambda: scaled_cos_sin(pos, freqs, layout.num_prefix, half, gain), (pos,))


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    # [x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]
    x = x.unflatten(-1, (-1, 2))
    return torch.stack([-x[..., 1], x[..., 0]], dim=-1).flatten(-2)


def _as_pairs(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] in fp32 as complex numbers [..., d/2] (a view where x's strides allow one)."""
    x = x.float()
    if x.stride(-1) != 1 or x.storage_offset() % 2 or any(s % 2 for s in x.stride()[:-1]):
        x = x.clone(memory_format=torch.contiguous_format)  # a fresh buffer (contiguous() keeps an odd offset)
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _apply_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half layout: channel c pairs with c + d/2, [a, b] -> [a cos - b sin, b cos + a sin]: with the signed
    sin of `rotary_cos_sin(..., half=True)` that is x cos + roll(x, d/2) sin (fewer passes than splitting x)."""
    x32 = x.float()
    if torch.compiler.is_compiling():
        return (x32 * cos + x32.roll(x.shape[-1] // 2, -1) * sin).to(x.dtype)
    return torch.addcmul(x32 * cos, x32.roll(x.shape[-1] // 2, -1), sin).to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: bool = False) -> torch.Tensor:
    """Rotate channel pairs of x [B, H, N, d] by the angles behind cos/sin [(H,) N, d]; fp32 math, x's dtype out.
    half=True: the rotate-half layout (cos/sin from `rotary_cos_sin(..., half=True)`).

    Eagerly, one complex product per pair: forward and backward are a few kernels where the elementwise form takes
    a dozen (about 4x faster on the CPU at nano sizes). Under torch.compile the elementwise form, which the compiler
    fuses into one kernel (it generates no code for complex numbers)."""
    if half:
        return _apply_half(x, cos, sin)
    if torch.compiler.is_compiling() or is_fx_tracing():
        return (x * cos + _rotate_pairs(x) * sin).to(x.dtype)
    turn = torch.complex(cos[..., 0::2], sin[..., 0::2])  # cos/sin repeat each pair's value: e^(i angle) per pair
    return torch.view_as_real(_as_pairs(x) * turn).flatten(-2).to(x.dtype)
