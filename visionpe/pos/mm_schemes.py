"""Position ids of interleaved text / visual sequences for the RoPE schemes of video and multimodal transformers.

These builders live with the PE that reads them (RoPE-ND, visionpe.pos.rope_nd); the public API is
`visionpe.pos.mm_positions`, which gives these and the Qwen-VL reference ids (qwen_positions.py) built on them.

A sequence is a list of segments: `("text", n)`, `("video", (T, H, W))` or `("image", (H, W))` (an image is a video
with T = 1), or the same as a string, `"text:3 video:2x2x3 text:2"`. Every scheme assigns each token S position
streams (`position_ids` -> float32 [N, S]) and each rotary pair c reads one of them with frequency f_c
(`frequency_matrix` -> F [S, d/2]); the shared kernel computes angle[n, c] = sum_s pos[n, s] * F[s, c]
(visionpe.pos.rotary). Every scheme uses the 1D ladder f_c = theta^(-2c/d), so pure text is exactly 1D RoPE
(HoPE: 1D RoPE with its temporal pairs, the lowest-frequency quarter, at frequency 0).

M-RoPE's next-text rule: the released Qwen2-VL / Qwen2.5-VL code starts the text after a visual block at the max over
the block's three streams + 1 (`after_visual="max"`, the default). transformers 5.x's `get_rope_index` instead
advances the running index by max(H, W) (`after_visual="hw"`), ignoring T and the temporal interval; the two agree
whenever the block's temporal extent (T - 1) * interval is below max(H, W) (always for images).

| scheme    | S | positions                                                         | pair c reads                |
|-----------|---|-------------------------------------------------------------------|-----------------------------|
| rope1d    | 1 | raster order, +1 per token (the baseline)                         | the one stream              |
| rope3d    | 3 | (t, y, x) from the block start; text t = y = x; next text max + 1 | axis c mod 3 (t, y, x)      |
| mrope     | 3 | as rope3d (Qwen2-VL M-RoPE)                                       | sections [16, 24, 24] of 64 |
| mrope_time| 3 | as mrope, t = s + floor(k * interval) (Qwen2.5-VL, time-aligned)  | as mrope                    |
| videorope | 3 | t = s + 2 t, y/x centred on it (diagonal); next text last t + 1   | lowest quarter t, rest y, x |
| vrope     | 4 | a0..a3 = the four diagonals + t (H + W - 1) + s; text +1 after    | variant c mod 4             |
| v2pe      | 1 | text +1, visual +delta; closing text ceil(last) + 1               | the one stream              |
| mrope_interleaved | 3 | each frame: t = s, y/x = s + row/col; s += max(H, W) | T H W T H W ... T T (Qwen3-VL)  |
| hope      | 3 | as videorope with t = s + gamma t (gamma drawn in training)       | as videorope, t pairs fixed |

Qwen-VL reference: visionpe.pos.qwen_positions (`qwen_vl_position_ids`, `qwen_vl_packed_position_ids`) gives the
exact long ids of Qwen2-VL, Qwen2.5-VL (per-video fps) and Qwen3-VL (timestamps) for a processor's token layout, built
on the mrope, mrope_time and mrope_interleaved schemes here.

mrope_interleaved is Qwen3-VL's text M-RoPE: `get_rope_index` treats every video frame as its own visual block (the
processor separates frames by timestamp text), so frame k starts where the previous one advanced the running index by
max(H, W); pair c reads h when c % 3 == 1 and c < 3 h_sec, w when c % 3 == 2 and c < 3 w_sec, else t, with sections
[24, 20, 20] of 64 pairs scaled to the head dim. Its `spatial_reset` option (MRoPE-I / MHRoPE's position design,
Huang et al.) starts every frame's (h, w) at (0, 0); t and the running index are unchanged. hope (HoPE) keeps
VideoRoPE's layout but gives the temporal pairs frequency 0 (cos 1, sin 0: no temporal rotation) and scales the
temporal ids by gamma: drawn per visual segment from `scales` (0.5 .. 1.5) in training, the fixed `temporal_scale`
(0.75, HoPE's evaluation value) otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import lru_cache

import torch

from ..layout.tokens import TokenLayout
from .rotary import rope_frequencies

__all__ = [
    "HOPE_SCALES",
    "SCHEMES",
    "V2PE_DELTAS",
    "Segment",
    "frequency_matrix",
    "parse_segments",
    "position_ids",
    "runtime_options",
    "scheme_streams",
    "segment_kinds",
    "segment_layout",
    "segments_length",
    "stream_of_pairs",
]

Segment = tuple  # ("text", n) or ("video", (T, H, W)) after parsing

SCHEME_STREAMS = {
    "rope1d": 1,
    "rope3d": 3,
    "mrope": 3,
    "mrope_time": 3,
    "videorope": 3,
    "vrope": 4,
    "v2pe": 1,
    "mrope_interleaved": 3,
    "hope": 3,
}
SCHEMES = tuple(SCHEME_STREAMS)
SCHEME_OPTIONS = {  # options each scheme takes (besides device)
    "rope1d": (),
    "rope3d": (),
    "mrope": ("after_visual",),
    "mrope_time": ("temporal_interval", "after_visual"),
    "videorope": ("temporal_stride",),
    "vrope": (),
    "v2pe": ("delta", "training", "deltas", "generator"),
    "mrope_interleaved": ("spatial_reset",),
    "hope": ("temporal_scale", "training", "scales", "generator"),
}
V2PE_DELTAS = tuple(1.0 / 2**i for i in range(9))  # {1, 1/2, ..., 1/256}: V2PE's training draws
V2PE_EVAL_DELTA = 0.25
MROPE_SECTIONS = (16, 24, 24)  # of 64 pairs (Qwen2-VL, head dim 128)
MROPE_INTERLEAVED_SECTIONS = (24, 20, 20)  # (t, h, w) of 64 pairs (Qwen3-VL, head dim 128)
HOPE_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)  # HoPE's training draws of the temporal scale gamma
HOPE_EVAL_SCALE = 0.75  # HoPE's evaluation value (its V-NIAH script); the official code makes the user choose
# Qwen2.5-VL: tokens_per_second (2) x seconds per temporal token (temporal_patch_size 2 / fps 2 = 1)
MROPE_TIME_INTERVAL = 2.0
AFTER_VISUAL = ("max", "hw")
SPEC_FORMAT = "[('text', 3), ('video', (2, 2, 3)), ('image', (4, 4)), ...] or 'text:3 video:2x2x3 image:4x4'"


# ---------------------------------------------------------------------------------------------------- segments


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEME_STREAMS:
        import difflib

        close = difflib.get_close_matches(str(scheme), SCHEMES, n=2, cutoff=0.4)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown position scheme {scheme!r}{hint}; choose one of {', '.join(SCHEMES)}")


def scheme_streams(scheme: str) -> int:
    """Number of position streams S a scheme assigns per token."""
    _check_scheme(scheme)
    return SCHEME_STREAMS[scheme]


def _as_int(v, where: Callable[[], str]) -> int:
    if isinstance(v, torch.SymInt):  # a traced size (torch.compile with dynamic shapes, torch.export): keep it symbolic
        return v
    if isinstance(v, bool) or not isinstance(v, (int, str)) and not hasattr(v, "__index__"):
        raise ValueError(f"{where()}: expected an integer, got {v!r}")
    try:
        out = int(v)
    except ValueError:
        raise ValueError(f"{where()}: expected an integer, got {v!r}") from None
    if out < 1:
        raise ValueError(f"{where()}: sizes must be at least 1, got {out}")
    return out


def _parse_one(kind, size, where: Callable[[], str]) -> Segment:
    """where: builds the segment's name for an error, only when there is one (formatting a traced size while
    tracing would break the graph)."""
    if kind == "text":
        if isinstance(size, (tuple, list)):
            raise ValueError(f"{where()}: a text segment takes a token count, got {size!r}")
        return ("text", _as_int(size, where))
    if kind in ("video", "image"):
        if isinstance(size, str):
            size = size.lower().split("x")
        if not isinstance(size, (tuple, list)):
            raise ValueError(f"{where()}: a {kind} segment takes a shape tuple, got {size!r}")
        dims = tuple(_as_int(s, where) for s in size)
        if kind == "image" and len(dims) == 2:
            dims = (1, *dims)
        if len(dims) != 3 or (kind == "image" and dims[0] != 1):
            want = "(H, W)" if kind == "image" else "(T, H, W)"
            raise ValueError(f"{where()}: a {kind} segment takes {want} in tokens, got {size!r}")
        return ("video", dims)
    raise ValueError(f"{where()}: unknown segment kind {kind!r}; use 'text', 'image' or 'video'")


@lru_cache(maxsize=256)
def _parse_string(spec: str) -> tuple[Segment, ...]:
    parts = [p for p in re.split(r"[\s,;|]+", spec.strip()) if p]
    out = []
    for i, part in enumerate(parts):
        m = re.fullmatch(r"([A-Za-z]+)[:(=]([0-9xX]+)\)?", part)
        if m is None:
            raise ValueError(f"segment spec {spec!r}: cannot parse {part!r}; expected e.g. {SPEC_FORMAT}")
        kind, size = m.group(1).lower(), m.group(2)
        out.append(_parse_one(kind, size, lambda i=i, part=part: f"segment {i} ({part!r})"))
    return tuple(out)


def parse_segments(spec) -> tuple[Segment, ...]:
    """Normalise a segment spec to a tuple of ("text", n) / ("video", (T, H, W)) (images become T = 1)."""
    if isinstance(spec, str):
        out = _parse_string(spec)
    elif isinstance(spec, (list, tuple)):
        out = []
        for i, seg in enumerate(spec):
            if not isinstance(seg, (list, tuple)) or len(seg) != 2 or not isinstance(seg[0], str):
                raise ValueError(f"segment {i} is {seg!r}; expected a (kind, size) pair as in {SPEC_FORMAT}")
            out.append(_parse_one(seg[0].lower(), seg[1], lambda i=i, seg=seg: f"segment {i} ({seg!r})"))
        out = tuple(out)
    else:
        raise ValueError(f"cannot parse a segment spec of type {type(spec).__name__}; expected {SPEC_FORMAT}")
    if not out:
        raise ValueError(f"empty segment spec; expected {SPEC_FORMAT}")
    return out


def segment_kinds(spec) -> tuple[str, ...]:
    """The kind of each segment as written ('text', 'image' or 'video'); `parse_segments` turns an image into a
    one-frame video, which is the same for every scheme but not for a processor's token layout."""
    parse_segments(spec)  # validates
    if isinstance(spec, str):
        parts = [p for p in re.split(r"[\s,;|]+", spec.strip()) if p]
        return tuple(re.match(r"[A-Za-z]+", p).group(0).lower() for p in parts)
    return tuple(seg[0].lower() for seg in spec)


def segments_length(segments) -> int:
    """Total number of tokens N of a segment spec."""
    return sum(size if kind == "text" else math.prod(size) for kind, size in parse_segments(segments))


# --------------------------------------------------------------------------------------------------- positions


def _grid(t: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tt, hh, ww = torch.meshgrid(
        torch.arange(t, dtype=torch.float64),
        torch.arange(h, dtype=torch.float64),
        torch.arange(w, dtype=torch.float64),
        indexing="ij",
    )
    return tt.flatten(), hh.flatten(), ww.flatten()  # raster order, w fastest


def _rope1d(segments) -> torch.Tensor:
    return torch.arange(segments_length(segments), dtype=torch.float64)[:, None]


def _time_aligned(t: torch.Tensor, interval: float) -> torch.Tensor:
    """Qwen2.5-VL's temporal ids floor(k * interval), the product taken in float32 as its reference code does."""
    return (t.to(torch.float32) * torch.tensor(interval, dtype=torch.float32)).floor().to(torch.float64)


def _walk(segments, streams: int, visual) -> torch.Tensor:
    """Positions [N, streams] of a segment spec: a text token takes the running index on every stream, a visual
    block is placed by `visual(size, start) -> (its rows, the running index after it)`."""
    rows, nxt = [], 0.0
    for kind, size in segments:
        if kind == "text":
            rows.append((torch.arange(size, dtype=torch.float64) + nxt)[:, None].expand(-1, streams))
            nxt = nxt + size
        else:
            block, nxt = visual(size, nxt)
            rows.append(block)
    return torch.cat(rows)


def _three_stream(
    segments, scheme: str, temporal_stride: float = 2.0, interval=1.0, after_visual: str = "max"
) -> torch.Tensor:
    """rope3d / mrope / videorope: streams (t, y, x); text has t = y = x = running index. After a visual block the
    next token starts at the max over all streams + 1 (Qwen2-VL's rule), except VideoRoPE, whose official
    `get_t_scale_rope_index` continues from the block's last temporal index + 1 (its y / x streams, centred on t,
    may run past it). interval: one float for every visual block, or a tuple with one per visual block."""
    intervals = iter(interval if isinstance(interval, tuple) else ())

    def visual(size, nxt):
        T, H, W = size
        if scheme == "videorope":
            t, h, w = _diagonal_block(nxt, T, H, W, temporal_stride)
        else:
            t, h, w = _grid(T, H, W)
            if scheme == "mrope_time":
                t = _time_aligned(t, next(intervals) if isinstance(interval, tuple) else interval)
            t, h, w = nxt + t, nxt + h, nxt + w
        block = torch.stack([t, h, w], dim=1)
        if after_visual == "hw":
            return block, nxt + max(H, W)
        # a 0-d tensor: no host sync (torch.compile traces it without a graph break)
        return block, (t if scheme == "videorope" else block).max() + 1

    return _walk(segments, 3, visual)


def _diagonal_block(start, T: int, H: int, W: int, stride: float):
    """VideoRoPE's visual block: temporal spacing `stride`, each frame centred on its time index (diagonal)."""
    t, h, w = _grid(T, H, W)
    t = start + stride * t
    return t, t + h - (H - 1) // 2, t + w - (W - 1) // 2


def _hope(segments, scale: float, training: bool, scales: Sequence[float], generator) -> torch.Tensor:
    """HoPE's dynamic temporal scaling on VideoRoPE's layout: gamma per visual segment (drawn from `scales` in
    training); the next token starts at the block's last temporal index + 1."""

    def visual(size, nxt):
        gamma = _draw(scales, generator) if training else scale
        t, h, w = _diagonal_block(nxt, *size, gamma)
        return torch.stack([t, h, w], dim=1), t.max() + 1

    return _walk(segments, 3, visual)


def _interleaved_mrope(segments, spatial_reset: bool = False) -> torch.Tensor:
    """Qwen3-VL's ids: text t = h = w = running index; every frame of a visual block at t = s, (h, w) = s + (row,
    col), then s advances by max(H, W). spatial_reset (MRoPE-I's paper setting): (h, w) = (row, col) from 0 in every
    frame, only t carries s; s advances as without reset, so the next token's ids do not change."""

    def visual(size, nxt):
        T, H, W = size
        _, h, w = _grid(1, H, W)
        starts = [nxt + k * max(H, W) for k in range(T)]
        frames = [torch.stack([torch.full_like(h, s), h + (0 if spatial_reset else s), w + (0 if spatial_reset else s)],
                              dim=1) for s in starts]  # fmt: skip
        return torch.cat(frames), nxt + T * max(H, W)

    return _walk(segments, 3, visual)


def _check_reset(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"spatial_reset must be True or False, got {value!r}")
    return value


def _check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale > 0:
        raise ValueError(f"HoPE temporal_scale must be positive, got {scale}")
    return scale


def _vrope(segments) -> torch.Tensor:
    """Four symmetric diagonal indices per visual token; the running index advances T (H + W - 1) per video."""

    def visual(size, nxt):
        T, H, W = size
        t, h, w = _grid(T, H, W)
        base = t * (H + W - 1) + nxt
        hr, wr = (H - 1) - h, (W - 1) - w
        return torch.stack([h + w, h + wr, hr + w, hr + wr], dim=1) + base[:, None], nxt + T * (H + W - 1)

    return _walk(segments, 4, visual)


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 < delta <= 1:
        raise ValueError(f"V2PE delta must be in (0, 1], got {delta}")
    return delta


def _v2pe(segments, delta: float, training: bool, deltas: Sequence[float], generator) -> torch.Tensor:
    """1 stream: text +1, visual +delta (drawn per visual segment from `deltas` in training). Around a visual block
    the opening text token (marker) sits at p, visual token k (1-based) at p + k delta, the next text token at
    ceil(p + N delta) + 1; a sequence that starts with a visual block starts at 0."""
    rows, last, after_visual = [], None, False
    for kind, size in segments:
        if kind == "text":
            start = 0.0 if last is None else (math.ceil(last) + 1 if after_visual else last + 1)
            rows.append(torch.arange(size, dtype=torch.float64) + start)
            last, after_visual = start + size - 1, False
            continue
        n = math.prod(size)
        d = _draw(deltas, generator) if training else delta
        first = 0.0 if last is None else last + d
        rows.append(first + d * torch.arange(n, dtype=torch.float64))
        last, after_visual = first + d * (n - 1), True
    return torch.cat(rows)[:, None]


def _per_segment(options: dict, key: str, default: float, many: str, defaults, check) -> tuple[float, tuple]:
    """A setting drawn per visual segment in training (HoPE's temporal scale, V2PE's delta): (its evaluation value
    `options[key]`, the training candidates `options[many]`), each value checked by `check`."""
    candidates = tuple(check(v) for v in options.get(many, defaults))
    if not candidates:
        raise ValueError(f"`{many}` needs at least one candidate {key}, got none")
    return check(options.get(key, default)), candidates


def _draw(candidates, generator) -> float:
    """One of the candidates, drawn from `generator` (per visual segment in training)."""
    return float(candidates[int(torch.randint(len(candidates), (1,), generator=generator))])


def _check_interval(interval, segments):
    """mrope_time's temporal interval: a positive float, or a tuple with one per visual segment."""
    many = isinstance(interval, (tuple, list))
    values = [float(v) for v in (interval if many else [interval])]
    bad = [v for v in values if not v > 0]
    if bad:
        raise ValueError(f"M-RoPE temporal_interval (tokens_per_second x seconds per grid) must be > 0, got {bad[0]}")
    if not many:
        return values[0]
    visuals = sum(kind != "text" for kind, _ in segments)
    if len(values) != visuals:
        raise ValueError(
            f"temporal_interval has {len(values)} values for {visuals} visual segments; give one per visual segment "
            "(any value for an image) or a single float"
        )
    return tuple(values)


def _compute(segments, scheme: str, options: dict) -> torch.Tensor:
    if scheme == "rope1d":
        pos = _rope1d(segments)
    elif scheme == "mrope_interleaved":
        pos = _interleaved_mrope(segments, _check_reset(options.get("spatial_reset", False)))
    elif scheme == "hope":
        scale, scales = _per_segment(options, "temporal_scale", HOPE_EVAL_SCALE, "scales", HOPE_SCALES, _check_scale)
        pos = _hope(segments, scale, bool(options.get("training", False)), scales, options.get("generator"))
    elif scheme == "vrope":
        pos = _vrope(segments)
    elif scheme == "v2pe":
        delta, deltas = _per_segment(options, "delta", V2PE_EVAL_DELTA, "deltas", V2PE_DELTAS, _check_delta)
        pos = _v2pe(segments, delta, bool(options.get("training", False)), deltas, options.get("generator"))
    else:
        stride = float(options.get("temporal_stride", 2.0))
        if stride <= 0:
            raise ValueError(f"VideoRoPE temporal_stride must be positive, got {stride}")
        interval = _check_interval(options.get("temporal_interval", MROPE_TIME_INTERVAL), segments)
        after = options.get("after_visual", "max")
        if after not in AFTER_VISUAL:
            raise ValueError(
                f"after_visual must be 'max' (released Qwen code) or 'hw' (transformers 5.x), got {after!r}"
            )
        pos = _three_stream(segments, scheme, stride, interval, after)
    return pos.to(torch.float32)


@lru_cache(maxsize=128)
@torch.inference_mode(False)  # cached tensors must also serve autograd after an inference-mode first call
def _cached(segments: tuple, scheme: str, options: tuple, device: str) -> torch.Tensor:
    # computed on the host (also inside a torch.device("meta") context), then moved; traced: as it comes
    with nullcontext() if torch.compiler.is_compiling() else torch.device("cpu"):
        pos = _compute(segments, scheme, dict(options))
    return pos.to(device)


def _check_options(scheme: str, options: dict) -> None:
    unknown = set(options) - set(SCHEME_OPTIONS[scheme])
    if unknown:
        valid = ", ".join(SCHEME_OPTIONS[scheme]) or "none"
        raise ValueError(f"scheme {scheme!r} does not take options {sorted(unknown)}; it takes: {valid}")


def _positions(segments, scheme: str, device, options: dict) -> torch.Tensor:
    _check_scheme(scheme)
    segments = parse_segments(segments)
    _check_options(scheme, options)
    device = str(torch.device(device) if device is not None else torch.device("cpu"))
    if scheme in ("v2pe", "hope") and options.get("training"):  # random: never cached
        return _compute(segments, scheme, options).to(device)
    if scheme in ("v2pe", "hope"):
        options = {k: (tuple(v) if k in ("deltas", "scales") else v) for k, v in options.items() if k != "generator"}
    if isinstance(options.get("temporal_interval"), list):  # hashable for the cache
        options = {**options, "temporal_interval": tuple(options["temporal_interval"])}
    return _cached(segments, scheme, tuple(sorted(options.items())), device)


def position_ids(segments, scheme: str, device=None, **options) -> torch.Tensor:
    """Position streams float32 [N, S] of an interleaved text / visual sequence under `scheme`.

    Options: videorope `temporal_stride` (2); mrope_time `temporal_interval` (tokens_per_second x seconds per
    temporal token, 2; a float, or a tuple with one per visual segment); mrope / mrope_time `after_visual` ("max":
    released Qwen code, "hw": transformers 5.x); mrope_interleaved `spatial_reset` (False; True: h / w from 0 in
    every frame);
    v2pe `delta` (fixed, default 1/4), `training` (draw delta per visual segment from `deltas`, default
    {1, 1/2, ..., 1/256}), `generator` (for the draws); hope `temporal_scale` (fixed gamma, default 0.75),
    `training` (draw gamma per visual segment from `scales`, default 0.5 .. 1.5), `generator`.
    Example: position_ids([("text", 3), ("video", (2, 2, 3)), ("text", 2)], "vrope")[:, 0]
    -> 0 1 2 | 3 4 5 4 5 6 | 7 8 9 8 9 10 | 11 12.
    """
    return _positions(segments, scheme, device, options).clone()


def runtime_options(
    scheme: str, training: bool = False, v2pe_delta: float = V2PE_EVAL_DELTA, temporal_scale: float = HOPE_EVAL_SCALE
) -> dict:
    """Per-forward options a model passes to `segment_layout`: V2PE draws delta in training and uses v2pe_delta
    at inference; HoPE draws gamma in training and uses temporal_scale at inference; the other schemes take none."""
    if scheme == "v2pe":
        return {"training": bool(training), "delta": v2pe_delta}
    if scheme == "hope":
        return {"training": bool(training), "temporal_scale": temporal_scale}
    return {}


def segment_layout(segments, scheme: str, num_prefix: int = 0, device=None, **options) -> TokenLayout:
    """A TokenLayout for a sequence: grid (T, H, W) when it is one visual segment, else None (interleaved)."""
    parsed = parse_segments(segments)
    pos = _positions(parsed, scheme, device, options)
    grid = parsed[0][1] if len(parsed) == 1 and parsed[0][0] == "video" else None
    return TokenLayout(num_prefix, grid, pos)


# ------------------------------------------------------------------------------------------ frequency matrices


def _mrope_sections(pairs: int, sections: Sequence[int] | None) -> tuple[int, int, int]:
    if sections is not None:
        sections = tuple(int(s) for s in sections)
        if len(sections) != 3 or sum(sections) != pairs or min(sections) < 1:
            raise ValueError(f"mrope_section must be 3 positive counts summing to {pairs} pairs, got {sections}")
        return sections
    t = pairs * MROPE_SECTIONS[0] // sum(MROPE_SECTIONS)  # [16, 24, 24] of 64 scaled to the head dim
    h = (pairs - t) // 2
    return t, h, pairs - t - h


def _interleaved_sections(pairs: int, sections: Sequence[int] | None) -> tuple[int, int, int]:
    if sections is None:  # [24, 20, 20] of 64 scaled to the head dim (h = w, t takes the rest)
        h = pairs * MROPE_INTERLEAVED_SECTIONS[1] // sum(MROPE_INTERLEAVED_SECTIONS)
        return pairs - 2 * h, h, h
    t, h, w = _mrope_sections(pairs, sections)
    if 3 * max(h, w) - 1 > pairs:
        raise ValueError(
            f"interleaved mrope_section {tuple(sections)}: h and w pairs sit at c % 3 == 1, 2 below 3 x section, "
            f"so 3 x max(h, w) - 1 must be at most {pairs} pairs"
        )
    return t, h, w


def stream_of_pairs(scheme: str, pairs: int, mrope_section: Sequence[int] | None = None) -> torch.Tensor:
    """Which stream each rotary pair reads: long [d/2]."""
    _check_scheme(scheme)
    c = torch.arange(pairs)
    if scheme in ("rope1d", "v2pe"):
        return torch.zeros(pairs, dtype=torch.long)
    if scheme == "rope3d":
        return c % 3
    if scheme == "vrope":
        return c % 4
    if scheme in ("mrope", "mrope_time"):
        t, h, w = _mrope_sections(pairs, mrope_section)
        return torch.cat([torch.full((t,), 0), torch.full((h,), 1), torch.full((w,), 2)]).long()
    if scheme == "mrope_interleaved":
        _, h, w = _interleaved_sections(pairs, mrope_section)
        out = torch.zeros(pairs, dtype=torch.long)
        out[(c % 3 == 1) & (c < 3 * h)] = 1
        out[(c % 3 == 2) & (c < 3 * w)] = 2
        return out
    # videorope / hope: the lowest-frequency quarter (the last pairs) reads t; the rest alternate h, w
    n_t = max(1, pairs // 4)
    out = 1 + c % 2
    out[pairs - n_t :] = 0
    return out


def frequency_matrix(
    scheme: str, head_dim: int, theta: float = 10000.0, mrope_section: Sequence[int] | None = None
) -> torch.Tensor:
    """F [S, d/2]: F[s, c] = theta^(-2c/d) when pair c reads stream s, else 0 (one stream per pair); HoPE's
    temporal pairs get frequency 0 (an exact identity)."""
    streams = scheme_streams(scheme)
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {head_dim}")
    pairs = head_dim // 2
    if pairs < streams:
        raise ValueError(f"scheme {scheme!r} has {streams} streams but head dim {head_dim} has only {pairs} pairs")
    reads = stream_of_pairs(scheme, pairs, mrope_section)
    freqs = torch.zeros(streams, pairs)
    freqs[reads, torch.arange(pairs)] = rope_frequencies(pairs, theta)
    if scheme == "hope":
        freqs[0] = 0.0
    return freqs
