"""Spiral RoPE (Liu et al., arXiv 2602.03227): 2D RoPE whose channel pairs rotate along K = 2R directions.

Each head of dim d splits as the official code does: a first half read along the row axis and a second half along
the column axis, each with the frequency ladder f_k = max_freq * theta^(-2k / (d/2)), k = 0..d/4-1, in adjacent
channel pairs. Then pair p of a half turns by i * 90 / R degrees, i = (p mod 2R) // 2 (the official groups of 4R
channels, sub-block i rotated by i * 90 / R): its angle is f * (y cos phi + x sin phi), phi = h * 90 + i * 90 / R
degrees from the row (y) axis toward the column (x) axis, h = 0 for the first half, 1 for the second. With the
defaults (R = 2) that is 0, 45, 90 and 135 degrees, every direction taking every other pair of the ladder.

Deviation (named in docs/pes.md): the official code rotates the angle map as an image (`grid_sample`, border
padding), which clamps the angles on two corner triangles of the grid; here the projection is computed exactly,
so q . k depends on the offset only, at any grid size. Positions are the layout's (raw patch indices by default;
the official rescaling to the training grid is the ViT's `position_mode="interpolate"`). Prefix tokens are not
rotated (the official code skips CLS).
"""

from __future__ import annotations

import math

import torch

from .base import PEHost, PosContext, PosEncoding
from .coord_aug import CoordAugment
from .rotary import FixedCosSinCache, apply_rotary, scaled_cos_sin

torch.fx.wrap("scaled_cos_sin")  # FX: a graph leaf when called from here too (visionpe.fx)

__all__ = ["RoPE2DSpiral", "spiral_directions", "spiral_frequencies"]


def spiral_directions(head_dim: int, rotate: int) -> torch.Tensor:
    """Direction of every channel pair [d/2] in radians from the row axis toward the column axis."""
    half = head_dim // 4  # pairs per axis half
    p = torch.arange(head_dim // 2, dtype=torch.float64)
    h, i = torch.div(p, half, rounding_mode="floor"), torch.div(p % (2 * rotate), 2, rounding_mode="floor")
    return (h * 90.0 + i * 90.0 / rotate) * math.pi / 180.0


def spiral_frequencies(head_dim: int, rotate: int = 2, max_freq: float = 1.5, theta: float = 10000.0):
    """Frequency matrix F [2 (x, y), d/2]: pair p's angle is f_p * (y cos phi_p + x sin phi_p)."""
    if head_dim % (4 * rotate):
        raise ValueError(f"Spiral RoPE needs a head dim divisible by 4 * rotate = {4 * rotate}, got {head_dim}")
    dim = head_dim // 2  # the official per-axis width
    ladder = max_freq * theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # [d/4]
    f = ladder.repeat(2)  # the row half's pairs, then the column half's
    phi = spiral_directions(head_dim, rotate)
    unit = torch.stack([torch.sin(phi), torch.cos(phi)])
    unit = torch.where(unit.abs() < 1e-12, 0.0, unit)  # exact zeros on the axes (cos 90 degrees is not 0 in floats)
    return (f * unit).float()


class RoPE2DSpiral(PosEncoding):
    """Spiral RoPE at the qk site. rotate R: half the number of directions (K = 2R; 1 gives axial RoPE with
    adjacent pairs); max_freq, theta: the ladder max_freq * theta^(-2k / (d/2)) (official 1.5, 10000);
    shift/jitter/rescale_coords: coordinate augmentation in training (None: off)."""

    positive_options = ("rotate", "max_freq", "theta")

    def __init__(
        self,
        host: PEHost,
        rotate: int = 2,
        max_freq: float = 1.5,
        theta: float = 10000.0,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
    ):
        super().__init__(host)
        if isinstance(rotate, bool) or not isinstance(rotate, int) or rotate < 1:
            raise ValueError(
                f"rotate (half the number of Spiral RoPE directions) must be an integer >= 1, got {rotate!r}"
            )
        self.rotate, self.max_freq, self.theta = rotate, float(max_freq), float(theta)
        self.coord_aug = CoordAugment(shift_coords, jitter_coords, rescale_coords)
        self._head_dims = sorted({spec.head_dim for spec in host.layers})
        for d in self._head_dims:
            self.register_buffer(f"freqs_{d}", self._freqs(d), persistent=False)
        self._cos_sin_cache = FixedCosSinCache()

    def _freqs(self, d: int) -> torch.Tensor:
        return spiral_frequencies(d, self.rotate, self.max_freq, self.theta)

    def init_non_persistent_buffers(self) -> None:
        for d in self._head_dims:
            buf = getattr(self, f"freqs_{d}")
            self.register_buffer(f"freqs_{d}", self._freqs(d).to(buf.device, buf.dtype), persistent=False)

    def context(self, i, layout, kv_layout=None, own=None):
        if layout.streams != 2:
            raise ValueError(f"Spiral RoPE needs (x, y) positions, got a layout with {layout.streams} streams")
        freqs = getattr(self, f"freqs_{self.host.layers[i].head_dim}")
        layouts = [layout] if kv_layout is None else [layout, kv_layout]
        if self.coord_aug.active and self.training:  # one draw per layer, shared by queries and keys
            drawn = self.coord_aug.jointly([lay.pos for lay in layouts], True)
            cos_sin = [scaled_cos_sin(p, freqs, lay.num_prefix) for p, lay in zip(drawn, layouts)]
        else:
            cos_sin = [self._cos_sin_cache(lay, freqs) for lay in layouts]
        (cos_q, sin_q), (cos_k, sin_k) = cos_sin[0], cos_sin[-1]

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)
