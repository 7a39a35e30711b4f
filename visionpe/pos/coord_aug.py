"""Training-time coordinate augmentation for rotary PEs (DINOv3's "RoPE box jittering"), for any [N, S] positions.

One draw per call, shared by every token (and the whole batch), in this order (DINOv3's):
- shift: add u_s ~ U(-shift, shift) to stream s (S draws);
- jitter: multiply stream s by exp(v_s), v_s ~ U(-ln J, ln J) (S draws);
- rescale: multiply every stream by one exp(w), w ~ U(-ln R, ln R) (1 draw).
The draws come from the positions' device generator in that order, so a seeded CPU run draws the same numbers as the
official code for the same (h, w) coordinates. Shift is in the units of the positions it is applied to (DINOv3's
[-1, 1] box, or patches for RoPE2D); jitter and rescale are about the origin, which a relative PE cannot tell from
any other point. A PE applies it only in training (`CoordAugment.__call__(pos, training)`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .rotary import no_autocast

__all__ = ["CoordAugment", "augment_coords"]


def augment_coords(
    pos: torch.Tensor,
    shift: float | None = None,
    jitter: float | None = None,
    rescale: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """pos [N, S] -> augmented positions [N, S] (a new tensor; None skips a transform)."""
    streams = pos.shape[-1]

    def uniform(n: int, bound: float) -> torch.Tensor:
        return torch.empty(n, device=pos.device, dtype=pos.dtype).uniform_(-bound, bound, generator=generator)

    if shift is not None:
        pos = pos + uniform(streams, shift)
    if jitter is not None:
        pos = pos * uniform(streams, math.log(jitter)).exp()
    if rescale is not None:
        pos = pos * uniform(1, math.log(rescale)).exp()
    return pos


def _check(name: str, value, low: float, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"{name} must be a finite number >= {low} ({what}) or None, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CoordAugment:
    """The augmentation options of a rotary PE: shift_coords (>= 0), jitter_coords and rescale_coords (factors
    >= 1), each None for off. DINOv3 trains with rescale_coords=2 (a log-uniform scale in [1/2, 2])."""

    shift: float | None = None
    jitter: float | None = None
    rescale: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "shift", _check("shift_coords", self.shift, 0.0, "a shift"))
        object.__setattr__(self, "jitter", _check("jitter_coords", self.jitter, 1.0, "a factor"))
        object.__setattr__(self, "rescale", _check("rescale_coords", self.rescale, 1.0, "a factor"))

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def __call__(self, pos: torch.Tensor, training: bool) -> torch.Tensor:
        """A fresh draw in training; the positions unchanged in eval."""
        if not (training and self.active):
            return pos
        with no_autocast(pos.device):
            return augment_coords(pos.float(), self.shift, self.jitter, self.rescale)

    def jointly(self, positions: list[torch.Tensor], training: bool) -> list[torch.Tensor]:
        """Several position sets in one frame (the queries' and CvT's stride-2 keys') under one draw: a relative PE
        sees the same shift and scale on both sides."""
        if not (training and self.active) or len(positions) == 1:
            return [self(p, training) for p in positions]
        return list(self(torch.cat(positions), True).split([len(p) for p in positions]))
