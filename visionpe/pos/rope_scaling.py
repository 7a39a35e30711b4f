"""Test-time RoPE scaling: the `ntk` and `yarn` position modes, for any rotary frequency matrix F [S, (heads,) C].

The positions keep their training spacing (as in `extrapolate`); the frequencies change with the size ratio
s_a = (test extent / training extent) of each stream a, taken as 1 below the training size (no scaling there):
- ntk (NTK-aware base scaling): the base of a geometric ladder f_j = base^(-j/K), j = 0..K-1, becomes
  base * s^(K / (K - 1)), i.e. f_j -> f_j * s^(-j / (K - 1)): the fastest frequency is kept, the slowest divided by
  s. `ladder_exponents` gives j / (K - 1) for each rotary pair (every 2D RoPE here lays out d/4 ladders per axis);
  `single_ladder_exponents` for one d/2-long ladder shared by the streams (the RoPE-ND schemes: each stream's pairs
  then read base * s_a^(d / (d - 2))).
- yarn (YaRN, arXiv 2309.00071): fast frequencies are kept, slow ones interpolated (f / s_a), with a linear ramp
  between; q and k are multiplied by 0.1 ln(s) + 1 (the attention temperature; s = the geometric mean of the
  streams' ratios, the growth of the attended area per axis). Two ramps (`RopeScaling.ramp`):
  - "reference" (default; the reference code, jquesnelle/yarn and transformers' YaRN): on the geometric ladder
    f_j = f_0 e^(-lambda j) the PE's frequencies come from (`Ladder`), pair index c(r) = ln(L_a f_0 / (2 pi r)) /
    lambda turns r times over the training extent L_a; the ramp runs over the pair index from
    low = max(floor(c(beta_fast = 32)), 0) to high = min(ceil(c(beta_slow = 1)), 2K - 1) (high + 0.001 when equal):
    gamma = 1 - clamp((j - low) / (high - low), 0, 1), f -> f * (gamma + (1 - gamma) / s_a). A frequency off
    the ladder (RoPE-Mixed's learned ones) takes its continuous index j = ln(f_0 / |f|) / lambda. An empty range
    (high < low = 0: even the fastest pair turns less than once over L_a, exactly c(1) <= -1) scales nothing.
  - "paper" (the paper's wavelength form): r = L_a |f| / (2 pi) turns of each frequency over L_a,
    gamma = clamp((r - 1) / (32 - 1), 0, 1) on r itself (no rounding).
- riflex (RIFLEx, arXiv 2502.15894; a time axis only, visionpe.pos.rope_nd): one frequency of the time axis, the
  intrinsic one (`intrinsic_index`), becomes 0.9 * 2 pi / L_test when the test length L_test exceeds its period
  round(2 pi / f), so it turns less than once over the input; every other frequency is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..position_modes import SCALING_MODES, TIME_MODES  # the modes this module serves (the one list)

__all__ = [
    "RIFLEX_MARGIN",
    "SCALING_MODES",
    "TIME_MODES",
    "YARN_RAMPS",
    "Ladder",
    "RopeScaling",
    "base_ladder",
    "identify_k",
    "intrinsic_index",
    "riflex_frequency",
    "rope_period",
    "ladder_exponents",
    "single_ladder_exponents",
    "rope_scaling",
    "scale_frequencies",
    "yarn_temperature",
]

RIFLEX_MARGIN = 0.9  # RIFLEx's official code: the test length stays within 90% of the lowered frequency's period
YARN_RAMPS = ("reference", "paper")  # yarn's ramp: the reference code's (default) or the paper's wavelength form
YARN_BETA_SLOW, YARN_BETA_FAST = 1.0, 32.0  # turns over the training extent: interpolated below, kept above


@dataclass(frozen=True)
class RopeScaling:
    """One test-time scaling: the mode, the size ratio of each position stream (>= 1) and yarn's ramp."""

    mode: str
    ratios: tuple[float, ...]
    ramp: str = "reference"


@dataclass(frozen=True)
class Ladder:
    """The geometric ladder f_j = first * exp(-step * j), j = 0..pairs-1, a rotary PE's frequencies come from (per
    stream); yarn's reference ramp counts in its pairs."""

    first: float
    step: float
    pairs: int


def base_ladder(base: float, pairs: int, first: float = 1.0) -> Ladder:
    """The ladder f_j = first * base^(-j / pairs) (axial RoPE: base theta, d/4 pairs; 1D RoPE: d/2 pairs)."""
    return Ladder(float(first), math.log(base) / pairs, int(pairs))


def check_yarn_ramp(ramp: str) -> str:
    """`ramp` if it names a yarn ramp, else a ValueError naming the choices."""
    if ramp not in YARN_RAMPS:
        raise ValueError(f"yarn_ramp must be one of {', '.join(YARN_RAMPS)}, got {ramp!r}")
    return ramp


def rope_scaling(mode: str, size: tuple[int, ...], ref: tuple[int, ...], ramp: str = "reference") -> RopeScaling | None:
    """The scaling of `mode` for streams of extent `size` trained at `ref` (same order); None when nothing scales
    (another mode, or no stream larger than at training). ramp: yarn's (YARN_RAMPS)."""
    if mode not in SCALING_MODES:
        return None
    ratios = tuple(max(float(n) / float(r), 1.0) for n, r in zip(size, ref))
    return RopeScaling(mode, ratios, ramp) if any(r > 1.0 for r in ratios) else None


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
    ladder: Ladder | None = None,
) -> torch.Tensor:
    """F [S, (heads,) C] scaled for `scaling` (unchanged when None). extents: the training extent of each stream in
    the units of the positions F multiplies (yarn's L_a); exponents [C]: ntk's j / (K - 1) per pair (default
    `ladder_exponents(head_dim)`); ladder: the ladder F's frequencies come from (yarn's reference ramp)."""
    if scaling is None:
        return freqs
    if len(scaling.ratios) != freqs.shape[0] or len(extents) != freqs.shape[0]:
        raise ValueError(f"RoPE scaling has {len(scaling.ratios)} ratios for a frequency matrix of {freqs.shape[0]}")
    shape = (-1,) + (1,) * (freqs.ndim - 1)
    ratio = torch.tensor(scaling.ratios, dtype=torch.float32, device=freqs.device).view(shape)
    if scaling.mode == "ntk":
        exponents = ladder_exponents(head_dim) if exponents is None else exponents
        return freqs * ratio ** -exponents.to(freqs.device)
    if scaling.ramp == "paper":
        extent = torch.tensor(extents, dtype=torch.float32, device=freqs.device).view(shape)
        turns = extent * freqs.abs() / (2 * math.pi)
        gamma = ((turns - YARN_BETA_SLOW) / (YARN_BETA_FAST - YARN_BETA_SLOW)).clamp(0.0, 1.0)
    else:
        if ladder is None:
            raise ValueError("yarn's reference ramp needs the ladder the frequencies come from (ladder=...)")
        bounds = [_correction_range(float(n), ladder) for n in extents]
        low = torch.tensor([b[0] for b in bounds], dtype=torch.float32, device=freqs.device).view(shape)
        high = torch.tensor([b[1] for b in bounds], dtype=torch.float32, device=freqs.device).view(shape)
        index = torch.log(ladder.first / freqs.abs().float()) / ladder.step  # j on the ladder (inf for f = 0)
        gamma = 1.0 - ((index - low) / (high - low)).clamp(0.0, 1.0)
    return freqs * (gamma + (1.0 - gamma) / ratio)


def _correction_range(extent: float, ladder: Ladder) -> tuple[float, float]:
    """(low, high) pair indices of yarn's reference ramp over a training extent: rounded outwards, clamped as the
    reference clamps them, and apart by 0.001 when equal."""

    def index(turns: float) -> float:  # the (real) pair index whose frequency turns `turns` times over the extent
        return math.log(extent * ladder.first / (2 * math.pi * turns)) / ladder.step

    low = max(math.floor(index(YARN_BETA_FAST)), 0)
    high = min(math.ceil(index(YARN_BETA_SLOW)), 2 * ladder.pairs - 1)
    return float(low), float(high) + (0.001 if low == high else 0.0)


def rope_period(freq: float) -> float:
    """The period of a rotary frequency in positions, rounded as RIFLEx rounds it: round(2 pi / f); inf for f = 0."""
    return float(round(2 * math.pi / abs(freq))) if freq else math.inf


def identify_k(periods: list[float], repeat: float) -> int:
    """RIFLEx's intrinsic frequency index k (1-based, fastest first): the component whose period is nearest the
    frame `repeat` at which a repetition was first observed (the first on ties), as the official `identify_k`."""
    diffs = [abs(n - repeat) for n in periods]
    return diffs.index(min(diffs)) + 1


def intrinsic_index(
    periods: list[float], train_length: float, k: int | None = None, repeat: float | None = None
) -> int | None:
    """0-based index of RIFLEx's intrinsic frequency among a time axis' `periods` (fastest first): `k` - 1 when k is
    given, `identify_k(periods, repeat)` - 1 when the repetition frame is, else the fastest component whose period
    exceeds the training length (the first not to complete a turn in training; None when every one does)."""
    if k is not None:
        return k - 1
    if repeat is not None:
        return identify_k(periods, repeat) - 1
    return next((j for j, n in enumerate(periods) if n > train_length), None)


def riflex_frequency(test_length: float) -> float:
    """RIFLEx's lowered intrinsic frequency for `test_length` positions: 0.9 * 2 pi / L_test (under one turn)."""
    return RIFLEX_MARGIN * 2 * math.pi / test_length
