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
"""

from __future__ import annotations

from collections.abc import Sequence

from ..layout import TokenLayout
from .base import PEHost, PosContext, PosEncoding
from .mm_positions import (
    HOPE_EVAL_SCALE,
    SCHEMES,
    V2PE_EVAL_DELTA,
    frequency_matrix,
    position_ids,
    runtime_options,
    scheme_streams,
    segment_layout,
)
from .rope_scaling import (
    SCALING_MODES,
    RopeScaling,
    base_ladder,
    check_yarn_ramp,
    rope_scaling,
    scale_frequencies,
    single_ladder_exponents,
    yarn_temperature,
)
from .rotary import FixedCosSinCache, apply_rotary

__all__ = ["RoPEND", "layout_scheme"]

SCALED_LAYOUTS = 32  # layouts whose ntk / yarn scaling is kept (as many as the cos/sin cache keeps)


def _spread(pos) -> tuple[float, ...]:
    """max - min + 1 of each position stream of pos [N, S]."""
    return tuple((pos.amax(0) - pos.amin(0) + 1).tolist())


class RoPEND(PosEncoding):
    """Rotates q/k by the layout's position streams under one scheme of visionpe.pos.mm_positions; prefix tokens are
    not rotated. theta: base of the 1D ladder f_c = theta^(-2c/d) every scheme uses (100 suits vision grids, 10000 is
    the language-model default); delta: V2PE's visual step at inference (drawn per visual segment in training);
    temporal_scale: HoPE's temporal scale gamma at inference (drawn per visual segment in training);
    scheme_options: fixed position options of the scheme (mrope / mrope_time `after_visual`, mrope_time
    `temporal_interval`, videorope `temporal_stride`; see visionpe.pos.mm_positions.position_ids); yarn_ramp: the
    `yarn` mode's ramp, 'reference' (the reference code) or 'paper' (visionpe.pos.rope_scaling)."""

    positive_options = ("theta", "delta")

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
    ):
        super().__init__(host)
        self.yarn_ramp = check_yarn_ramp(yarn_ramp)
        if scheme not in SCHEMES:
            raise ValueError(f"unknown RoPE scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
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
        self._scaled = []  # [(positions tensor, (its ntk / yarn scaling, the training spreads))]
        self._reference_spread = None  # (options, spreads) of the host's training input
        self.init_non_persistent_buffers()

    def init_non_persistent_buffers(self):
        for d in sorted({spec.head_dim for spec in self.host.layers}):
            old = getattr(self, f"freqs_{d}", None)
            freqs = frequency_matrix(self.scheme, d, self.theta, self.mrope_section)
            if old is not None:
                freqs = freqs.to(old.device, old.dtype)  # where and how the model keeps it
            self.register_buffer(f"freqs_{d}", freqs, persistent=False)  # [S, d/2]
        self._cos_sin_cache.clear()

    def layer_frequencies(self, i: int):
        """F [S, d/2] of layer i (fixed, shared by layers with the same head dim)."""
        return getattr(self, f"freqs_{self.host.layers[i].head_dim}")

    def _cos_sin(self, i: int, layout: TokenLayout):
        if layout.streams != self.num_streams:
            raise ValueError(
                f"RoPE scheme {self.scheme!r} reads {self.num_streams} position streams, the layout has "
                f"{layout.streams}; build it with visionpe.pos.mm_positions.segment_layout(..., {self.scheme!r})"
            )
        scaling, spread = self._scaling(layout)
        if scaling is None:
            return self._cos_sin_cache(layout, self.layer_frequencies(i))  # [P + N, d] each
        d = self.host.layers[i].head_dim
        ladder = base_ladder(self.theta, d // 2)  # theta^(-2c/d) over the d/2 pairs
        freqs = scale_frequencies(self.layer_frequencies(i), scaling, d, spread, single_ladder_exponents(d), ladder)
        return self._cos_sin_cache(layout, freqs, tag=scaling, gain=yarn_temperature(scaling))

    def reference_spread(self) -> tuple[float, ...]:
        """Spread (max - min + 1) of each stream's positions in the training input's layout: the host's
        `reference_segments` under this scheme, else the training clip alone (frames x grid)."""
        options = self.layout_options(False)
        key = repr(sorted(options.items()))  # kept per host and options (delta, scheme options may be set later)
        if self._reference_spread is None or self._reference_spread[0] != key:
            segments = self.host.reference_segments or [("video", (self.host.frames, *self.host.grid))]
            self._reference_spread = (key, _spread(segment_layout(segments, self.scheme, 0, None, **options).pos))
        return self._reference_spread[1]

    def scaling(self, layout: TokenLayout) -> RopeScaling | None:
        """The ntk / yarn scaling of `layout` over the training input; None in another mode or when no stream
        reaches beyond training."""
        return self._scaling(layout)[0]

    def _scaling(self, layout: TokenLayout):
        """(ntk / yarn scaling of the layout over the training input, the training spreads), or (None, None);
        kept for the last few layouts (a native batch holds one per grid), each entry holding its positions."""
        if self.host.position_mode not in SCALING_MODES or not layout.num_pos:
            return None, None
        for pos, scaled in self._scaled:
            if pos is layout.pos:
                return scaled
        ref = self.reference_spread()
        scaled = (rope_scaling(self.host.position_mode, _spread(layout.pos), ref, self.yarn_ramp), ref)
        self._scaled = [*self._scaled, (layout.pos, scaled)][-SCALED_LAYOUTS:]
        return scaled

    def set_host(self, host: PEHost) -> None:
        super().set_host(host)
        self._scaled, self._reference_spread = [], None

    def layout_options(self, training):
        return {**self.scheme_options, **runtime_options(self.scheme, training, self.delta, self.temporal_scale)}

    def context(self, i, layout, kv_layout=None):
        cos_q, sin_q = self._cos_sin(i, layout)
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout)

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)


def layout_scheme(pe: PosEncoding, default: str = "rope3d") -> str:
    """The position scheme a model must build its layouts with for `pe` (`default` when no PE reads one)."""
    return pe.layout_scheme or default
