"""Test-time position modes: how a model reads positions at an input larger than its training one. The one list,
read by the models (the modes each family takes), the PEs (the modes each acts on), the CLI and the benchmark.

A model owns its mode: set at build (`position_mode=`), changed with `set_position_mode` (assigning the
`position_mode` property calls it), which sets it on every PE of the model (`PosEncoding.position_mode`)."""

from __future__ import annotations

__all__ = [
    "EXTRAPOLATE",
    "INTERPOLATE",
    "SCALING_MODES",
    "TIME_MODES",
    "IMAGE_MODES",
    "VIDEO_MODES",
    "ALL_MODES",
    "BENCH_MODES",
    "check_position_mode",
]

EXTRAPOLATE = "extrapolate"  # raw positions at any size: every PE, the default
INTERPOLATE = "interpolate"  # the ViT's layout rescaled onto the reference grid (the counterpart of APE resampling)
SCALING_MODES = ("ntk", "yarn")  # every rotary PE rescales its frequencies (visionpe.pos.rope_scaling)
TIME_MODES = ("riflex",)  # the rotary PEs with a time axis lower its intrinsic frequency (visionpe.pos.rope_nd)

IMAGE_MODES = (EXTRAPOLATE, INTERPOLATE, *SCALING_MODES)  # vit
VIDEO_MODES = (EXTRAPOLATE, *SCALING_MODES, *TIME_MODES)  # vivit, the multimodal encoder
ALL_MODES = tuple(dict.fromkeys((*IMAGE_MODES, *VIDEO_MODES)))  # what bench.position_modes accepts
BENCH_MODES = (EXTRAPOLATE, INTERPOLATE)  # bench.position_modes' default


def check_position_mode(mode: str, modes: tuple[str, ...]) -> str:
    """`mode` if it is one of a model's `modes`, else a ValueError naming them."""
    if mode not in modes:
        raise ValueError(f"position_mode must be one of {modes}, got {mode!r}")
    return mode
