"""Test-time RoPE scaling: the `ntk` and `yarn` position modes, for any rotary frequency matrix F [S, (heads,) C].

The positions keep their training spacing (as in `extrapolate`); the frequencies change with the size ratio
s_a = (test extent / training extent) of each stream a, taken as 1 below the training size (no scaling there):
- ntk (NTK-aware base scaling): the base of a geometric ladder f_j = base^(-j/K), j = 0..K-1, becomes
  base * s^(K / (K - 1)), i.e. f_j -> f_j * s^(-j / (K - 1)): the fastest frequency is kept, the slowest divided by
  s. `ladder_exponents` gives j / (K - 1) for each rotary pair (every 2D RoPE here lays out d/4 ladders per axis);
  `single_ladder_exponents` for one d/2-long ladder shared by the streams (the RoPE-ND schemes: each stream's pairs
  then read base * s_a^(d / (d - 2))).
- yarn (YaRN, arXiv 2309.00071): per frequency, r = L_a * |f| / (2 pi) turns over the training extent L_a;
  gamma = clamp((r - alpha) / (beta - alpha), 0, 1) (alpha 1, beta 32); f -> f * (gamma + (1 - gamma) / s_a),
  so slow frequencies are interpolated and fast ones kept; q and k are multiplied by 0.1 ln(s) + 1 (the attention
  temperature; s = the geometric mean of the streams' ratios, the growth of the attended area per axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "SCALING_MODES",
    "RopeScaling",
    "ladder_exponents",
    "single_ladder_exponents",
    "rope_scaling",
    "scale_frequencies",
    "yarn_temperature",
]

SCALING_MODES = ("ntk", "yarn")
YARN_ALPHA, YARN_BETA = 1.0, 32.0


@dataclass(frozen=True)
class RopeScaling:
    """One test-time scaling: the mode and the size ratio of each position stream (>= 1)."""

    mode: str
    ratios: tuple[float, ...]


def rope_scaling(mode: str, size: tuple[int, ...], ref: tuple[int, ...]) -> RopeScaling | None:
    """The scaling of `mode` for streams of extent `size` trained at `ref` (same order); None when nothing scales
    (another mode, or no stream larger than at training)."""
    if mode not in SCALING_MODES:
        return None
    ratios = tuple(max(float(n) / float(r), 1.0) for n, r in zip(size, ref))
    return RopeScaling(mode, ratios) if any(r > 1.0 for r in ratios) else None


def ladder_exponents(head_dim: int) -> torch.Tensor:
    """j / (K - 1) of each of the d/2 rotary pairs, for d/4-long ladders repeated per axis ([C], fp32)."""
    k = head_dim // 4
    j = torch.arange(head_dim // 2, dtype=torch.float32) % k
    return j / max(k - 1, 1)


def single_ladder_exponents(head_dim: int) -> torch.Tensor:
    """c / (K - 1) of each of the K = d/2 rotary pairs of one ladder f_c = base^(-c/K) ([C], fp32)."""
    k = head_dim // 2
    return torch.arange(k, dtype=torch.float32) / max(k - 1, 1)


def yarn_temperature(scaling: RopeScaling | None) -> float:
    """The factor YaRN multiplies q and k by (1.0 without yarn)."""
    if scaling is None or scaling.mode != "yarn":
        return 1.0
    return 0.1 * math.log(math.prod(scaling.ratios) ** (1.0 / len(scaling.ratios))) + 1.0


def scale_frequencies(
    freqs: torch.Tensor,
    scaling: RopeScaling | None,
    head_dim: int,
    extents: tuple[float, ...],
    exponents: torch.Tensor | None = None,
) -> torch.Tensor:
    """F [S, (heads,) C] scaled for `scaling` (unchanged when None). extents: the training extent of each stream in
    the units of the positions F multiplies (yarn's L_a); exponents [C]: ntk's j / (K - 1) per pair (default
    `ladder_exponents(head_dim)`)."""
    if scaling is None:
        return freqs
    if len(scaling.ratios) != freqs.shape[0] or len(extents) != freqs.shape[0]:
        raise ValueError(f"RoPE scaling has {len(scaling.ratios)} ratios for a frequency matrix of {freqs.shape[0]}")
    shape = (-1,) + (1,) * (freqs.ndim - 1)
    ratio = torch.tensor(scaling.ratios, dtype=torch.float32, device=freqs.device).view(shape)
    if scaling.mode == "ntk":
        exponents = ladder_exponents(head_dim) if exponents is None else exponents
        return freqs * ratio ** -exponents.to(freqs.device)
    extent = torch.tensor(extents, dtype=torch.float32, device=freqs.device).view(shape)
    turns = extent * freqs.abs() / (2 * math.pi)
    gamma = ((turns - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA)).clamp(0.0, 1.0)
    return freqs * (gamma + (1.0 - gamma) / ratio)
