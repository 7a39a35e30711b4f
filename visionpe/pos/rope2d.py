"""2D RoPE for images (Heo et al., ECCV 2024): axial (fixed frequencies) and mixed (learnable per layer and head).

Both drive the shared rotary kernel with a frequency matrix F over the layout's (x, y) streams:
- axial: the first d/4 pairs rotate by x * f_j, the last d/4 by y * f_j, f_j = theta^(-4j/d) (theta 100 for ViT);
- mixed: per layer and head, fx = [m cos a, m cos(a + pi/2)], fy = [m sin a, m sin(a + pi/2)], m_j = theta^(-4j/d)
  (theta 10), a ~ U[0, 2 pi); stored as `freqs` [2, depth, heads, d/2] (timm's layout), excluded from weight decay.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layout import TokenLayout
from .base import PEHost, PosContext, PosEncoding
from .rotary import FixedCosSinCache, apply_rotary, axial_frequencies, rotary_angles, rotary_cos_sin

__all__ = ["RoPE2D", "mixed_frequencies"]


def mixed_frequencies(head_dim: int, depth: int, num_heads: int, theta: float = 10.0, rotate: bool = True):
    """Initial RoPE-Mixed frequencies [2 (x, y), depth, heads, d/2]; rotate=False gives the axial pattern."""
    if head_dim % 4:
        raise ValueError(f"RoPE-Mixed needs a head dim divisible by 4, got {head_dim}")
    mag = theta ** (-torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)  # [d/4]
    a = torch.rand(depth, num_heads, 1) * 2 * math.pi if rotate else torch.zeros(depth, num_heads, 1)
    fx = torch.cat([mag * torch.cos(a), mag * torch.cos(a + math.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(a), mag * torch.sin(a + math.pi / 2)], dim=-1)
    return torch.stack([fx, fy], dim=0)


class RoPE2D(PosEncoding):
    """Rotates q and k of every attention layer by their (x, y) positions; prefix tokens are not rotated."""

    positive_options = ("theta",)

    def __init__(self, host: PEHost, mode: str = "axial", theta: float | None = None):
        super().__init__(host)
        if mode not in ("axial", "mixed"):
            raise ValueError(f"RoPE2D mode must be 'axial' or 'mixed', got {mode!r}")
        self.mode = mode
        self.theta = float(theta if theta is not None else (100.0 if mode == "axial" else 10.0))
        head_dims = {spec.head_dim for spec in host.layers}
        for d in head_dims:
            if d % 4:
                raise ValueError(f"2D RoPE needs head dims divisible by 4, got {d}")
        if mode == "mixed":
            heads = {spec.num_heads for spec in host.layers}
            if len(heads) == 1 and len(head_dims) == 1:  # one tensor, as in timm / rope-vit checkpoints
                self.freqs = nn.Parameter(
                    mixed_frequencies(head_dims.pop(), host.depth, heads.pop(), self.theta)
                )  # [2, depth, H, d/2]
            else:  # hierarchical backbones: one tensor per layer
                self.freqs = nn.ParameterList(
                    [nn.Parameter(mixed_frequencies(s.head_dim, 1, s.num_heads, self.theta)[:, 0]) for s in host.layers]
                )
        else:
            for d in head_dims:
                self.register_buffer(f"axial_{d}", axial_frequencies(d, self.theta), persistent=False)
        self._cos_sin_cache = FixedCosSinCache()  # axial only (mixed frequencies are trained)

    def layer_frequencies(self, i: int) -> torch.Tensor:
        """Frequency matrix of layer i: [2, d/2] (axial, shared) or [2, heads, d/2] (mixed)."""
        if self.mode == "axial":
            return getattr(self, f"axial_{self.host.layers[i].head_dim}")
        if isinstance(self.freqs, nn.ParameterList):
            return self.freqs[i]
        return self.freqs[:, i]

    def _cos_sin(self, i: int, layout: TokenLayout):
        if self.mode == "axial":  # fixed: once per layout and head dim
            return self._cos_sin_cache(layout, self.layer_frequencies(i))
        return rotary_cos_sin(rotary_angles(layout.pos, self.layer_frequencies(i), layout.num_prefix))

    def context(self, i, layout, kv_layout=None):
        if layout.streams != 2:
            raise ValueError(f"2D RoPE needs (x, y) positions, got a layout with {layout.streams} streams")
        cos_q, sin_q = self._cos_sin(i, layout)
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout)

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)

    def no_weight_decay(self):
        if self.mode != "mixed":
            return set()
        if isinstance(self.freqs, nn.ParameterList):
            return {f"freqs.{i}" for i in range(len(self.freqs))}
        return {"freqs"}
