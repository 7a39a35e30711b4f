"""Reusable layers: attention with a PE context, transformer blocks."""

from .attention_layer import Attention, attention_core
from .block import Block, PreNormBlock

__all__ = ["Attention", "Block", "PreNormBlock", "attention_core"]
