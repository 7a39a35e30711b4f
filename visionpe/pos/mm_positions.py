"""Multimodal position ids, the public API (docs/multimodal_positions.md): the position streams each RoPE scheme of
the video and multimodal models gives a sequence of text / image / video segments (`position_ids`,
`frequency_matrix`, `segment_layout`, ...: mm_schemes.py), and the exact Qwen2-VL, Qwen2.5-VL and Qwen3-VL ids for a
processor's token layout, single or packed (`qwen_vl_position_ids`, `qwen_vl_packed_position_ids`, ...:
qwen_positions.py, built on those schemes). The two modules hold the code; this one names it in one place."""

from __future__ import annotations

from .mm_schemes import (
    HOPE_EVAL_SCALE,
    HOPE_SCALES,
    SCHEMES,
    V2PE_DELTAS,
    V2PE_EVAL_DELTA,
    Segment,
    frequency_matrix,
    parse_segments,
    position_ids,
    runtime_options,
    scheme_streams,
    segment_kinds,
    segment_layout,
    segments_length,
    stream_of_pairs,
)
from .qwen_positions import (
    QWEN_MODELS,
    QWEN_RULES,
    qwen3_vl_timestamp_text,
    qwen3_vl_timestamps,
    qwen_vl_packed_position_ids,
    qwen_vl_position_ids,
    qwen_vl_token_layout,
)

__all__ = [
    "HOPE_EVAL_SCALE",
    "HOPE_SCALES",
    "QWEN_MODELS",
    "QWEN_RULES",
    "SCHEMES",
    "V2PE_DELTAS",
    "V2PE_EVAL_DELTA",
    "Segment",
    "frequency_matrix",
    "parse_segments",
    "position_ids",
    "qwen3_vl_timestamp_text",
    "qwen3_vl_timestamps",
    "qwen_vl_packed_position_ids",
    "qwen_vl_position_ids",
    "qwen_vl_token_layout",
    "runtime_options",
    "scheme_streams",
    "segment_kinds",
    "segment_layout",
    "segments_length",
    "stream_of_pairs",
]
