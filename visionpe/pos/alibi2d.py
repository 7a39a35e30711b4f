"""2D ALiBi as in CROMA (Fuller et al., NeurIPS 2023): logit_ij -= slope_h * ||p_i - p_j||, the Euclidean distance
between the two patches' (x, y) positions in patch units, the same in every layer; pairs with a prefix token get no
bias. Slopes are ALiBi's geometric sequence: for H a power of two, slope_h = 2^(-8 (h + 1) / H); otherwise the
2^floor(log2 H) slopes of the nearest lower power of two, then every other slope of twice that many (12 heads:
2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5). CROMA computes the bias in fp32 (fp32 distance times fp32
slope) for square grids; here any grid (non-square, Swin windows, CvT's strided keys) gets the same formula.
No parameters: checkpoints hold nothing of it and a new grid needs no resizing.
"""

from __future__ import annotations

import math

import torch

from .offset_bias import OffsetBiasPE

__all__ = ["ALiBi2D", "alibi_slopes"]


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.), with the interleave for a head count that is not a power of two."""
    if heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(heads).is_integer():
        return power_of_two(heads)
    low = 2 ** math.floor(math.log2(heads))
    return power_of_two(low) + alibi_slopes(2 * low)[0::2][: heads - low]


class ALiBi2D(OffsetBiasPE):
    """logit_ij -= slope_h * ||p_j - p_i||_2 (CROMA's 2D ALiBi); `slope_scale` multiplies every slope (1: CROMA)."""

    def __init__(self, host, slope_scale: float = 1.0):
        super().__init__(host)
        self.slope_scale = float(slope_scale)

    def table_key(self, i):
        return (self.heads(i), self.slope_scale)  # layers with as many heads share one table

    def offset_fn(self, i, q, kv):
        slopes = [s * self.slope_scale for s in alibi_slopes(self.heads(i))]

        def fn(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            dist = (u * u + v * v).sqrt().float()  # exact in fp64, one rounding to fp32 (as CROMA's math.sqrt)
            s = torch.tensor(slopes, dtype=torch.float32, device=u.device).view(-1, *([1] * u.ndim))
            return -(dist * s)

        return fn
