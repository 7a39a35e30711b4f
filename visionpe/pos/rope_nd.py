"""RoPE over N position streams for video / multimodal models: 3D RoPE, M-RoPE (Qwen2-VL's sections, Qwen3-VL's
interleaved layout), VideoRoPE, HoPE, VRoPE, V2PE and 1D RoPE.

The PE declares its scheme (`layout_scheme`) and the scheme's per-forward options (`layout_options`: V2PE's visual
step); the backbone builds its layouts with them through `visionpe.pos.mm_positions.segment_layout` (their `pos`
[N, S] holds the scheme's streams) and never names the scheme itself. This PE
rotates q and k of every layer through the shared kernel (visionpe.pos.rotary) with the scheme's fixed frequency
matrix F [S, d/2]. The fixed angles are computed once per layout and head dim and shared by all layers.

Test-time scaling (the host's `ntk` / `yarn` position modes, visionpe.pos.rope_scaling): s_a = the spread
(max - min + 1) of stream a's positions in the layout over its spread in the layout of the training input, so each
stream scales by how far the input reaches beyond training. The training input is the host's `reference_segments`
(the multimodal encoder: its reference clip between the <img> / </img> markers, with its reference text) built under
the scheme, else the training clip alone (a video backbone): for a layout that is one clip, the spreads of frames,
rows and columns (rope3d / M-RoPE), of the diagonals (VRoPE) or of the one sequence stream (rope1d / V2PE). Text
and markers are positions like any other: a text token takes the running index on every stream, so text after the
visual input stretches every stream, and pure text or rope1d scales by the token-length ratio. Every scheme's F is
one ladder theta^(-2c/d) over the d/2 pairs: ntk gives stream a's pairs the base theta * s_a^(d / (d - 2)); yarn
ramps each frequency by its turns over the training spread and multiplies q and k by 0.1 ln s + 1.

RIFLEx (the host's `riflex` position mode, schemes with a time stream: rope3d, mrope, mrope_time, videorope,
mrope_interleaved; HoPE's time pairs do not rotate): L = the time stream's spread in the training input, L_test its
spread in the layout; the intrinsic time frequency (`riflex_k`, the official 1-based k over the time pairs, fastest
first; else the one nearest the repetition frame `riflex_repeat`; else the fastest whose period exceeds L) becomes
0.9 * 2 pi / L_test when L_test exceeds its period, every other frequency kept. p-RoPE (`p`): of each stream's
pairs only the fraction p with the highest frequencies rotates (visionpe.pos.rotary.p_rope_keep).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..layout.tokens import TokenLayout
from .base import PEHost, PosContext, PosEncoding
from .mm_schemes import (
    HOPE_EVAL_SCALE,
    SCHEMES,
    V2PE_EVAL_DELTA,
    frequency_matrix,
    position_ids,
    runtime_options,
    scheme_streams,
    segment_layout,
    stream_of_pairs,
)
from .rope_scaling import (
    SCALING_MODES,
    TIME_MODES,
    RopeScaling,
    base_ladder,
    check_yarn_ramp,
    intrinsic_index,
    riflex_frequency,
    rope_period,
    rope_scaling,
    scale_frequencies,
    single_ladder_exponents,
    yarn_temperature,
)
from .rotary import FixedCosSinCache, apply_rotary, check_p_rope, p_rope_keep
from .table_cache import TableCache

__all__ = ["RoPEND", "TIME_SCHEMES", "layout_scheme"]

SCALED_LAYOUTS = 32  # layouts whose position spreads are kept (as many as the cos/sin cache keeps)
TIME_SCHEMES = ("rope3d", "mrope", "mrope_time", "videorope", "mrope_interleaved", "hope")  # stream 0 is time


def _spread(pos) -> tuple[float, ...]:
    """max - min + 1 of each position stream of pos [N, S]."""
    return tuple((pos.amax(0) - pos.amin(0) + 1).tolist())


class RoPEND(PosEncoding):
    """Rotates q/k by the layout's position streams under one scheme of visionpe.pos.mm_positions; prefix tokens are
    not rotated. theta: base of the 1D ladder f_c = theta^(-2c/d) every scheme uses (100 suits vision grids, 10000 is
    the language-model default); delta: V2PE's visual step at inference (drawn per visual segment in training);
    temporal_scale: HoPE's temporal scale gamma at inference (drawn per visual segment in training);
    scheme_options: fixed position options of the scheme (mrope / mrope_time `after_visual`, mrope_time
    `temporal_interval`, videorope `temporal_stride`, mrope_interleaved `spatial_reset`; see
    visionpe.pos.mm_positions.position_ids); yarn_ramp: the
    `yarn` mode's ramp, 'reference' (the reference code) or 'paper' (visionpe.pos.rope_scaling); p: p-RoPE's kept
    fraction of each stream's pairs (1: all); riflex_k / riflex_repeat: the `riflex` mode's intrinsic time frequency
    (its 1-based index among the time pairs, or the frame a repetition was first seen at; default: the fastest
    whose period exceeds the training length)."""

    positive_options = ("theta", "delta", "riflex_k", "riflex_repeat")

    def __init__(
        self,
        host: PEHost,
        scheme: str = "rope3d",
        theta: float = 100.0,
        mrope_section: Sequence[int] | None = None,
        delta: float = V2PE_EVAL_DELTA,
        scheme_options: dict | None = None,
        temporal_scale: float = HOPE_EVAL_SCALE,
        yarn_ramp: str = "reference",
        p: float = 1.0,
        riflex_k: int | None = None,
        riflex_repeat: float | None = None,
    ):
        super().__init__(host)
        self.yarn_ramp = check_yarn_ramp(yarn_ramp)
        self.p = check_p_rope(p)
        if scheme not in SCHEMES:
            raise ValueError(f"unknown RoPE scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        if riflex_k is not None and riflex_repeat is not None:
            raise ValueError("give riflex_k (the intrinsic frequency's index) or riflex_repeat (the repetition frame), "
                             "not both")  # fmt: skip
        if riflex_k is not None and (isinstance(riflex_k, bool) or not isinstance(riflex_k, int)):
            raise ValueError(f"riflex_k is a 1-based index among the time stream's pairs, got {riflex_k!r}")
        self.riflex_k, self.riflex_repeat = riflex_k, riflex_repeat
        if not 0 < float(delta) <= 1:
            raise ValueError(f"V2PE delta must be in (0, 1], got {delta}")
        if not float(temporal_scale) > 0:
            raise ValueError(f"HoPE temporal_scale must be positive, got {temporal_scale}")
        self.temporal_scale = float(temporal_scale)
        self.scheme = self.layout_scheme = scheme
        self.delta = float(delta)
        self.scheme_options = dict(scheme_options or {})
        if self.scheme_options:
            position_ids("text:1 video:2x1x1 text:1", scheme, **self.scheme_options)  # rejects bad options early
        self.theta = float(theta)
        self.num_streams = scheme_streams(scheme)
        self.mrope_section = mrope_section if scheme in ("mrope", "mrope_time", "mrope_interleaved") else None
        self._cos_sin_cache = FixedCosSinCache()
        self._spreads = TableCache(SCALED_LAYOUTS)  # the spread of each stream of a layout's positions
        self._reference_spreads = TableCache(4)  # of the host's training input, per host and layout options
        self._time_periods = {}  # head dim -> (the time pairs' columns, their periods), fastest first
        self.init_non_persistent_buffers()
        self._check_riflex_k()

    def _frequencies(self, d: int):
        freqs = frequency_matrix(self.scheme, d, self.theta, self.mrope_section)
        if self.p < 1.0:
            with torch.device("cpu"):  # python numbers (also when built on the meta device)
                reads = stream_of_pairs(self.scheme, d // 2, self.mrope_section).tolist()
            freqs = freqs * p_rope_keep(reads, self.p)
        return freqs

    def init_non_persistent_buffers(self):
        for d in sorted({spec.head_dim for spec in self.host.layers}):
            old = getattr(self, f"freqs_{d}", None)
            freqs = self._frequencies(d)
            if self.scheme in TIME_SCHEMES:  # python numbers: no device sync at call time
                cols, time = self._time_frequencies(d)
                self._time_periods[d] = (cols, [rope_period(f) for f in time])
            if old is not None:
                freqs = freqs.to(old.device, old.dtype)  # where and how the model keeps it
            self.register_buffer(f"freqs_{d}", freqs, persistent=False)  # [S, d/2]

    def _time_frequencies(self, d: int) -> tuple[list[int], list[float]]:
        """(the columns of F whose pairs read the time stream, their frequencies), fastest first."""
        with torch.device("cpu"):
            time = self._frequencies(d)[0].tolist()
            reads = stream_of_pairs(self.scheme, d // 2, self.mrope_section).tolist()
        cols = [c for c, s in enumerate(reads) if s == 0]
        return cols, [time[c] for c in cols]

    def _check_riflex_k(self) -> None:
        if self.riflex_k is None and self.riflex_repeat is None:
            return
        if self.scheme not in TIME_SCHEMES or self.scheme == "hope":
            raise ValueError(f"riflex_k / riflex_repeat need a rotating time stream; scheme {self.scheme!r} has none "
                             f"(RIFLEx schemes: {', '.join(s for s in TIME_SCHEMES if s != 'hope')})")  # fmt: skip
        for d, (_, periods) in self._time_periods.items():
            k = self.riflex_k
            if k is not None and not 1 <= k <= len(periods):
                raise ValueError(f"riflex_k={k} is not among the {len(periods)} time pairs of head dim {d} (1 .. "
                                 f"{len(periods)})")  # fmt: skip
            if k is not None and periods[k - 1] == float("inf"):
                raise ValueError(f"riflex_k={k} names a time pair p-RoPE dropped (p={self.p}); choose a lower k")

    def layer_frequencies(self, i: int):
        """F [S, d/2] of layer i (fixed, shared by layers with the same head dim)."""
        return getattr(self, f"freqs_{self.host.layers[i].head_dim}")

    def _cos_sin(self, i: int, layout: TokenLayout):
        if layout.streams != self.num_streams:
            raise ValueError(
                f"RoPE scheme {self.scheme!r} reads {self.num_streams} position streams, the layout has "
                f"{layout.streams}; build it with visionpe.pos.mm_positions.segment_layout(..., {self.scheme!r})"
            )
        if self.position_mode in TIME_MODES:
            return self._riflex_cos_sin(i, layout)
        scaling, spread = self._scaling(layout)
        if scaling is None:
            return self._cos_sin_cache(layout, self.layer_frequencies(i))  # [P + N, d] each
        d = self.host.layers[i].head_dim
        ladder = base_ladder(self.theta, d // 2)  # theta^(-2c/d) over the d/2 pairs
        freqs = scale_frequencies(self.layer_frequencies(i), scaling, d, spread, single_ladder_exponents(d), ladder)
        return self._cos_sin_cache(layout, freqs, tag=scaling, gain=yarn_temperature(scaling))

    def riflex_change(self, i: int, layout: TokenLayout) -> tuple[int, float] | None:
        """(the column of F, its new frequency) of RIFLEx's intrinsic time frequency for layer i on `layout`; None
        when nothing changes (no rotating time stream, no intrinsic frequency, or the input within its period)."""
        cols, periods = self._time_periods.get(self.host.layers[i].head_dim, ((), ()))
        if not any(n < float("inf") for n in periods) or not layout.num_pos:
            return None
        train, test = self.reference_spread()[0], self._layout_spread(layout)[0]
        j = intrinsic_index(periods, train, self.riflex_k, self.riflex_repeat)
        if j is None or periods[j] == float("inf") or test <= periods[j]:  # the official training-free rule
            return None
        return cols[j], riflex_frequency(test)

    def _riflex_cos_sin(self, i: int, layout: TokenLayout):
        freqs, change = self.layer_frequencies(i), self.riflex_change(i, layout)
        if change is None:
            return self._cos_sin_cache(layout, freqs)
        col, freq = change
        freqs = freqs.clone()
        freqs[0, ..., col] = freqs[0, ..., col].ne(0) * freq  # where the time stream is read (per head: its heads)
        return self._cos_sin_cache(layout, freqs, tag=("riflex", col, freq))

    def _layout_spread(self, layout: TokenLayout) -> tuple[float, ...]:
        """The spread of each stream of the layout, kept for the last few layouts (a native batch holds one per
        grid)."""
        return self._spreads.lookup((), lambda: _spread(layout.pos), (layout.pos,))

    def reference_spread(self) -> tuple[float, ...]:
        """Spread (max - min + 1) of each stream's positions in the training input's layout: the host's
        `reference_segments` under this scheme, else the training clip alone (frames x grid)."""
        options = self.layout_options(False)  # delta, scheme options may be set after the build

        def spread():
            segments = self.host.reference_segments or [("video", (self.host.frames, *self.host.grid))]
            return _spread(segment_layout(segments, self.scheme, 0, None, **options).pos)

        return self._reference_spreads.lookup((self.host, repr(sorted(options.items()))), spread)

    def scaling(self, layout: TokenLayout) -> RopeScaling | None:
        """The ntk / yarn scaling of `layout` over the training input; None in another mode or when no stream
        reaches beyond training."""
        return self._scaling(layout)[0]

    def _scaling(self, layout: TokenLayout):
        """(ntk / yarn scaling of the layout over the training input, the training spreads), or (None, None)."""
        if self.position_mode not in SCALING_MODES or not layout.num_pos:
            return None, None
        ref = self.reference_spread()
        return rope_scaling(self.position_mode, self._layout_spread(layout), ref, self.yarn_ramp), ref

    def layout_options(self, training):
        return {**self.scheme_options, **runtime_options(self.scheme, training, self.delta, self.temporal_scale)}

    def context(self, i, layout, kv_layout=None, own=None):
        cos_q, sin_q = self._cos_sin(i, layout)
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout)

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)


def layout_scheme(pe: PosEncoding, default: str = "rope3d") -> str:
    """The position scheme a model must build its layouts with for `pe` (`default` when no PE reads one)."""
    return pe.layout_scheme or default
