"""Positional encodings: one module per PE family, all with the interface in base.py."""

from .absolute import LearnedAPE, SinCos2D
from .base import (
    AttnSpec,
    CheckpointMismatch,
    CheckpointSource,
    LayerPos,
    PEHost,
    PosContext,
    PosEncoding,
    Positions,
    PosStack,
    merge_contexts,
)
from .cpe import CPE
from .fuzzy import FuzzyPE
from .irpe import IRPE, piecewise_index, relative_bucket_ids
from .lepe import LePE
from .presets import PE_KINDS, PE_PRESETS, build_pos_encoding
from .rope2d import RoPE2D

__all__ = [
    "AttnSpec",
    "CPE",
    "CheckpointMismatch",
    "CheckpointSource",
    "FuzzyPE",
    "IRPE",
    "LePE",
    "LearnedAPE",
    "LayerPos",
    "PEHost",
    "PE_KINDS",
    "PE_PRESETS",
    "PosContext",
    "Positions",
    "PosEncoding",
    "PosStack",
    "RoPE2D",
    "SinCos2D",
    "build_pos_encoding",
    "merge_contexts",
    "piecewise_index",
    "relative_bucket_ids",
]
