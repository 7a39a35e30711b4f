"""Qwen-VL multimodal position ids as a reference: the 3-axis (t, h, w) M-RoPE ids of Qwen2-VL, Qwen2.5-VL and
Qwen3-VL for a sequence of text / image / video segments, single or packed, laid out as the Qwen processors lay out
their tokens, built on the mrope / mrope_time / mrope_interleaved schemes of `visionpe.pos.mm_positions`;
docs/multimodal_positions.md explains every rule.

Segments are in LLM tokens, after the vision tower's spatial merge: an image whose processor reports
`image_grid_thw = (1, 28, 40)` with `spatial_merge_size = 2` is `("image", (14, 20))`; a video of grid (8, 28, 40)
is `("video", (8, 14, 20))` (T counts temporal patches of `temporal_patch_size` frames). Text segments count the
text tokens between visuals, without the processor's markers, which `markers=True` adds:

- Qwen2-VL / Qwen2.5-VL: `<|vision_start|>` + the visual's pad tokens + `<|vision_end|>`, one block per image and one
  per whole video.
- Qwen3-VL: the same for an image; a video becomes one block per temporal patch, each after its timestamp text
  `<t seconds>` (`timestamp_tokens` of them, the count the user's tokenizer gives `qwen3_vl_timestamp_text(t)`).

The ids are those of the official Qwen code (`rule="official"`); `rule="transformers"` gives the installed
transformers' `get_rope_index` (5.25.0), which differs on Qwen2-VL / Qwen2.5-VL for the text after a video whose
temporal extent reaches max(H, W).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from .mm_schemes import parse_segments, position_ids, segment_kinds

__all__ = [
    "QWEN_MODELS",
    "QWEN_RULES",
    "qwen3_vl_timestamp_text",
    "qwen3_vl_timestamps",
    "qwen_vl_packed_position_ids",
    "qwen_vl_position_ids",
    "qwen_vl_token_layout",
]

QWEN_MODELS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
QWEN_RULES = ("official", "transformers")
_SCHEME = {"qwen2_vl": "mrope", "qwen2_5_vl": "mrope_time", "qwen3_vl": "mrope_interleaved"}
_AFTER_VISUAL = {"official": "max", "transformers": "hw"}  # the next-text rule of mm_positions' mrope schemes


def qwen3_vl_timestamps(frame_indices: Sequence[int], video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of each temporal patch as the Qwen3-VL processor writes them: the sampled frame indices, padded with
    the last one to a multiple of `temporal_patch_size`, over `video_fps`, then the mean of each patch's first and
    last frame."""
    indices = [int(i) for i in frame_indices]
    if not indices:
        raise ValueError("qwen3_vl_timestamps needs at least one frame index")
    if not float(video_fps) > 0:
        raise ValueError(f"video_fps must be positive, got {video_fps}")
    if int(temporal_patch_size) < 1:
        raise ValueError(f"temporal_patch_size must be at least 1, got {temporal_patch_size}")
    p = int(temporal_patch_size)
    indices += [indices[-1]] * (-len(indices) % p)
    seconds = [i / video_fps for i in indices]
    return [(seconds[i] + seconds[i + p - 1]) / 2 for i in range(0, len(seconds), p)]


def qwen3_vl_timestamp_text(seconds: float) -> str:
    """The text the Qwen3-VL processor puts before a temporal patch: `<1.5 seconds>`."""
    return f"<{seconds:.1f} seconds>"


# ---------------------------------------------------------------------------------------------- option checks


def _check_model(model: str, rule: str) -> None:
    if model not in QWEN_MODELS:
        raise ValueError(f"unknown Qwen-VL model {model!r}; choose one of {', '.join(QWEN_MODELS)}")
    if rule not in QWEN_RULES:
        raise ValueError(f"rule must be 'official' (the Qwen code) or 'transformers' (get_rope_index), got {rule!r}")


def _per_item(name: str, value, count: int, what: str, check) -> list:
    """A per-video / per-frame option: one value for all, or a sequence (or tensor, as a processor returns
    `second_per_grid_ts`) with exactly one per item."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    values = list(value) if isinstance(value, (list, tuple)) else [value] * count
    if len(values) != count:
        raise ValueError(f"{name} has {len(values)} values for {count} {what}; give one per {what[:-1]} or one for all")
    return [check(name, v) for v in values]


def _positive(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not float(v) > 0:
        raise ValueError(f"{name} values must be positive numbers, got {v!r}")
    return float(v)


def _count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
        raise ValueError(f"{name} values must be token counts (integers >= 0), got {v!r}")
    return int(v)


def _intervals(model, n_videos, fps, second_per_grid, tokens_per_second, temporal_patch_size) -> list[float]:
    """Qwen2.5-VL's temporal interval of each video, tokens_per_second x seconds per temporal patch, in float32 as
    transformers computes it (the processor's second_per_grid_ts = temporal_patch_size / fps is a float32 tensor)."""
    if model != "qwen2_5_vl":
        if fps is not None or second_per_grid is not None:
            carries = "timestamp text (timestamp_tokens)" if model == "qwen3_vl" else "nothing: t is the patch index"
            raise ValueError(f"{model} ids take no fps / second_per_grid; its time is {carries}")
        return []
    if fps is not None and second_per_grid is not None:
        raise ValueError("give fps (the sampled fps of each video) or second_per_grid (seconds per temporal patch), "
                         "not both")  # fmt: skip
    _positive("tokens_per_second", tokens_per_second)
    if fps is not None:
        spg = [int(temporal_patch_size) / f for f in _per_item("fps", fps, n_videos, "videos", _positive)]
    else:
        spg = _per_item("second_per_grid", 1.0 if second_per_grid is None else second_per_grid, n_videos, "videos",
                        _positive)  # fmt: skip
    tps = torch.tensor(tokens_per_second, dtype=torch.float32)
    return [float(tps * torch.tensor(s, dtype=torch.float32)) for s in spg]


# ------------------------------------------------------------------------------------------------ the layout


def _parsed(sequences) -> list[list[tuple[str, object]]]:
    """Each sequence as [(kind as written, size)], sizes normalised ((T, H, W) for visuals)."""
    return [list(zip(segment_kinds(s), (size for _, size in parse_segments(s)))) for s in sequences]


def _frames(model: str, seq) -> int:
    return sum(size[0] for kind, size in seq if kind == "video") if model == "qwen3_vl" else 0


def _expand(seq, model: str, markers: bool, stamps) -> list[tuple[str, object]]:
    """The processor's token layout of one sequence; stamps: an iterator of timestamp token counts (Qwen3-VL)."""
    out: list[tuple[str, object]] = []

    def block(kind, size):
        out.extend([("text", 1), (kind, size), ("text", 1)] if markers else [(kind, size)])

    for kind, size in seq:
        if kind == "text":
            out.append(("text", size))
        elif kind == "video" and model == "qwen3_vl":
            for _ in range(size[0]):
                n = next(stamps)
                if n:
                    out.append(("text", n))
                block("video", (1, *size[1:]))
        else:
            block(kind, size)
    return out


def _stamps(model, markers, timestamp_tokens, n_frames) -> list[int]:
    if model != "qwen3_vl":
        if timestamp_tokens is not None:
            raise ValueError(f"timestamp_tokens is Qwen3-VL's; {model} puts no timestamp text in a video")
        return []
    if timestamp_tokens is None:
        if markers and n_frames:
            raise ValueError(
                "Qwen3-VL writes a timestamp '<t seconds>' before every temporal patch of a video: pass "
                "timestamp_tokens= its token count (one for all, or one per patch; tokenize qwen3_vl_timestamp_text(t) "
                "for each t of qwen3_vl_timestamps(...)), or 0 for none"
            )
        timestamp_tokens = 0
    return _per_item("timestamp_tokens", timestamp_tokens, n_frames, "frames", _count)


class _Plan:
    """Checked options of one call over one or more sequences: per-video intervals, per-frame timestamp counts."""

    def __init__(self, sequences, model, rule, markers, fps, second_per_grid, tokens_per_second, temporal_patch_size,
                 timestamp_tokens):  # fmt: skip
        _check_model(model, rule)
        self.model, self.rule, self.markers = model, rule, bool(markers)
        self.seqs = _parsed(sequences)
        n_videos = sum(kind == "video" for seq in self.seqs for kind, _ in seq)
        n_frames = sum(_frames(model, seq) for seq in self.seqs)
        self.intervals = iter(_intervals(model, n_videos, fps, second_per_grid, tokens_per_second, temporal_patch_size))
        self.stamps = iter(_stamps(model, self.markers, timestamp_tokens, n_frames))

    def layout(self, seq) -> list[tuple[str, object]]:
        return _expand(seq, self.model, self.markers, self.stamps)

    def ids(self, seq, device) -> torch.Tensor:
        layout = self.layout(seq)
        scheme, options = _SCHEME[self.model], {}
        if self.model != "qwen3_vl":  # Qwen3-VL's frames are separate blocks: both rules agree
            options["after_visual"] = _AFTER_VISUAL[self.rule]
        if self.model == "qwen2_5_vl":  # one interval per visual block; an image has one frame, its t is 0
            per_block = [next(self.intervals) if kind == "video" else 1.0 for kind, _ in layout if kind != "text"]
            if per_block:
                options["temporal_interval"] = per_block
        pos = position_ids(layout, scheme, device=device, **options)  # float32 [N, 3], exact below 2^24
        return pos.t().to(torch.long)


def qwen_vl_token_layout(
    segments, model: str, *, markers: bool = True, timestamp_tokens: int | Sequence[int] | None = None
) -> list[tuple[str, object]]:
    """The sequence as the model's processor lays out its tokens: ("text", n), ("image", (1, H, W)) and
    ("video", (T, H, W)) segments with the vision start / end markers and (Qwen3-VL) the per-patch timestamp text as
    text segments; a Qwen3-VL video becomes one ("video", (1, H, W)) block per temporal patch."""
    plan = _Plan([segments], model, "official", markers, None, None, 2, 2, timestamp_tokens)
    return plan.layout(plan.seqs[0])


def qwen_vl_position_ids(
    segments,
    model: str,
    *,
    rule: str = "official",
    markers: bool = True,
    fps: float | Sequence[float] | None = None,
    second_per_grid: float | Sequence[float] | None = None,
    tokens_per_second: float = 2,
    temporal_patch_size: int = 2,
    timestamp_tokens: int | Sequence[int] | None = None,
    device=None,
) -> torch.Tensor:
    """Position ids long [3, N] (rows t, h, w) of one sequence under Qwen2-VL, Qwen2.5-VL or Qwen3-VL's M-RoPE.

    segments: a segment spec as in `visionpe.pos.mm_positions` (sizes in LLM tokens, after the spatial merge), e.g.
    "text:5 image:14x20 text:3 video:8x14x20 text:4"; markers: add the processor's <|vision_start|> / <|vision_end|>
    around each visual (N counts them); model: "qwen2_vl", "qwen2_5_vl" or "qwen3_vl"; rule: "official" (the Qwen
    code) or "transformers" (the installed transformers' `get_rope_index`).
    Qwen2.5-VL's temporal id of patch k is start + floor(k x tokens_per_second x seconds per patch): give each video's
    sampled `fps` (seconds per patch = temporal_patch_size / fps, as the processor computes `second_per_grid_ts`) or
    `second_per_grid` directly (default 1.0, i.e. 2 fps); one value for all videos or one per video.
    Qwen3-VL: `timestamp_tokens`, the token count of each temporal patch's timestamp text (one for all or one per
    patch), is required for a video when markers is on.
    Example: qwen_vl_position_ids("text:2 video:3x2x2 text:1", "qwen2_5_vl", fps=4)[0]
    -> 0 1 | 2 | 3 3 3 3 4 4 4 4 5 5 5 5 | 6 | 7: text, vision_start, t = 3 + floor(k x 2 x 0.5), vision_end, text.
    """
    plan = _Plan([segments], model, rule, markers, fps, second_per_grid, tokens_per_second, temporal_patch_size,
                 timestamp_tokens)  # fmt: skip
    return plan.ids(plan.seqs[0], device)


def qwen_vl_packed_position_ids(
    sequences: Sequence,
    model: str,
    *,
    text_row: bool = True,
    rule: str = "official",
    markers: bool = True,
    fps: float | Sequence[float] | None = None,
    second_per_grid: float | Sequence[float] | None = None,
    tokens_per_second: float = 2,
    temporal_patch_size: int = 2,
    timestamp_tokens: int | Sequence[int] | None = None,
    device=None,
) -> torch.Tensor:
    """Position ids of several sequences packed into one row: long [4, N] (a 1D text row, then t, h, w), or [3, N]
    with `text_row=False`. Every sequence's ids restart at 0, exactly its `qwen_vl_position_ids`; the text row is
    0, 1, ..., n_i - 1 per sequence, the row transformers' Qwen-VL models read from a [4, B, N] `position_ids` to
    find where packed sequences start. Per-video `fps` / `second_per_grid` and per-patch `timestamp_tokens` lists run
    over the videos of all sequences in order, as a processor's batch lists them."""
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence) or not sequences:
        raise ValueError("qwen_vl_packed_position_ids takes a non-empty list of segment specs, one per sequence")
    plan = _Plan(sequences, model, rule, markers, fps, second_per_grid, tokens_per_second, temporal_patch_size,
                 timestamp_tokens)  # fmt: skip
    ids = [plan.ids(seq, device) for seq in plan.seqs]
    if text_row:
        ids = [torch.cat([torch.arange(i.shape[1], device=i.device)[None], i]) for i in ids]
    return torch.cat(ids, dim=1)
