"""Reusable layers: attention with a PE context, transformer blocks."""

from .attention import Attention, attention_core
from .block import Block

__all__ = ["Attention", "Block", "attention_core"]
