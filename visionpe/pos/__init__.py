"""Positional encodings: one module per PE family, all with the interface in base.py."""

from .absolute import LearnedAPE, SinCos2D
from .base import AttnSpec, PEHost, PosContext, PosEncoding, PosStack, merge_contexts
from .presets import PE_KINDS, PE_PRESETS, build_pos_encoding
from .rope2d import RoPE2D

__all__ = [
    "AttnSpec",
    "LearnedAPE",
    "PEHost",
    "PE_KINDS",
    "PE_PRESETS",
    "PosContext",
    "PosEncoding",
    "PosStack",
    "RoPE2D",
    "SinCos2D",
    "build_pos_encoding",
    "merge_contexts",
]
