"""MHRoPE (Huang et al., ICLR 2026, arXiv 2510.23095): multimodal RoPE allocated by head instead of by channel.

Positions are the interleaved M-RoPE layout (visionpe.pos.mm_positions, scheme mrope_interleaved; the paper's
setting adds `spatial_reset`): streams (t, h, w). Where M-RoPE / MRoPE-I give each rotary pair of every head one
stream, MHRoPE gives each head one stream and all d/2 frequencies of the 1D ladder theta^(-2c/d) on it: heads
0 .. n_t - 1 read t, the next n_h read h, the next n_w read w, and heads beyond n_t + n_h + n_w are not rotated
(NoPE heads: frequency 0, cos 1, sin 0). F is [3, heads, d/2], the rotary kernel's per-head form.

`head_section` = (n_t, n_h, n_w), the official `mrope_section` of MHRoPE (its default (2, 3, 3) of 8 KV heads).
Default here, for any head count H: n_h = n_w = max(1, floor(3 H / 8)), n_t = H - 2 n_h (every head rotates; 8 heads
give the official (2, 3, 3), 4 heads (2, 1, 1), 3 heads (1, 1, 1), 12 heads (4, 4, 4), 2 heads (0, 1, 1): t then
gets no head). The official code counts key-value heads and repeats them over the query groups; our attention has
as many key-value heads as query heads, so the counts are of heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import PEHost
from .mm_schemes import HOPE_EVAL_SCALE, V2PE_EVAL_DELTA
from .rope_nd import RoPEND
from .rotary import p_rope_keep, rope_frequencies

__all__ = ["MHROPE_HEADS", "MHRoPE", "head_axes", "head_frequencies", "head_section"]

MHROPE_HEADS = (2, 3, 3)  # the official default (t, h, w) of 8 key-value heads


def head_section(num_heads: int, section: Sequence[int] | None = None) -> tuple[int, int, int]:
    """(n_t, n_h, n_w) heads per axis for `num_heads` heads: `section` checked, or the default rule (module doc)."""
    if section is None:
        hw = max(1, num_heads * MHROPE_HEADS[1] // sum(MHROPE_HEADS))
        if num_heads < 2 * hw:
            raise ValueError(f"MHRoPE's default head_section gives h and w a head each; a layer with {num_heads} "
                             "head cannot: give head_section=(n_t, n_h, n_w) with at most that many heads")  # fmt: skip
        return num_heads - 2 * hw, hw, hw
    counts = tuple(section) if isinstance(section, (list, tuple)) else ()
    if len(counts) != 3 or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
        raise ValueError(f"MHRoPE head_section must be 3 head counts (t, h, w) >= 0, got {section!r}")
    if not 1 <= sum(counts) <= num_heads:
        raise ValueError(f"MHRoPE head_section {counts} assigns {sum(counts)} heads, a layer has {num_heads}; give "
                         f"1 to {num_heads} heads in all (the rest are not rotated)")  # fmt: skip
    return counts


def head_axes(num_heads: int, section: Sequence[int] | None = None) -> list[int]:
    """The stream (0 t, 1 h, 2 w) each head reads, -1 for a head that is not rotated."""
    counts = head_section(num_heads, section)
    axes = [a for a, n in enumerate(counts) for _ in range(n)]
    return axes + [-1] * (num_heads - len(axes))


def head_frequencies(
    head_dim: int, num_heads: int, theta: float, section: Sequence[int] | None = None, p: float = 1.0
) -> torch.Tensor:
    """F [3, heads, d/2]: F[a, h, c] = theta^(-2c/d) when head h reads stream a, else 0; p-RoPE (p < 1) keeps the
    fastest int(p * d / 2) pairs of every head."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    pairs = head_dim // 2
    ladder = rope_frequencies(pairs, theta) * p_rope_keep([0] * pairs, p)
    freqs = torch.zeros(3, num_heads, pairs)
    for h, a in enumerate(head_axes(num_heads, section)):
        if a >= 0:
            freqs[a, h] = ladder
    return freqs


class MHRoPE(RoPEND):
    """RoPE-ND over the interleaved M-RoPE layout with one stream per head (module doc). head_section: heads per
    stream (t, h, w), default from the head count; scheme_options: the layout's options (`spatial_reset`, the
    paper's setting); theta, yarn_ramp, p, riflex_k, riflex_repeat as RoPE-ND (RIFLEx lowers one frequency of the
    t heads)."""

    def __init__(
        self,
        host: PEHost,
        head_section: Sequence[int] | None = None,
        theta: float = 100.0,
        scheme_options: dict | None = None,
        yarn_ramp: str = "reference",
        p: float = 1.0,
        riflex_k: int | None = None,
        riflex_repeat: float | None = None,
    ):
        self.head_section = None if head_section is None else tuple(head_section)  # read by the base's buffers
        super().__init__(host, "mrope_interleaved", theta, None, V2PE_EVAL_DELTA, scheme_options, HOPE_EVAL_SCALE,
                         yarn_ramp, p, riflex_k, riflex_repeat)  # fmt: skip

    def _heads(self, d: int) -> int:
        heads = {spec.num_heads for spec in self.host.layers if spec.head_dim == d}
        if len(heads) != 1:
            raise ValueError(f"MHRoPE needs one head count per head dim; layers of head dim {d} have {sorted(heads)}")
        return heads.pop()

    def _frequencies(self, d: int):
        return head_frequencies(d, self._heads(d), self.theta, self.head_section, self.p)

    def _time_frequencies(self, d: int) -> tuple[list[int], list[float]]:
        if head_section(self._heads(d), self.head_section)[0] == 0:
            return [], []  # no head reads t
        with torch.device("cpu"):
            ladder = rope_frequencies(d // 2, self.theta) * p_rope_keep([0] * (d // 2), self.p)
        return list(range(d // 2)), ladder.tolist()
