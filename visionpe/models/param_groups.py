"""Optimizer groups of PE parameters for timm's `group_matcher` / `no_weight_decay` (layer-wise lr decay, no decay).

Each PE says which attention layer each of its parameters serves (`PosEncoding.layer_of`): a parameter of layer i
lands in the group of block i, as timm's Swin puts its relative position bias table; shared parameters (APE, sin-cos,
fuzzy tables) stay in the stem group; one tensor for every layer (EVERY_LAYER) is left unmatched, which puts it in
the top group (lr scale 1, with the head), as timm's eva does for its RoPE. The rules name each parameter
exactly, so a backbone's own rules never catch a PE parameter.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable

from torch import nn

from ..pos.base import EVERY_LAYER, PosEncoding

__all__ = ["exact_no_weight_decay", "pe_layer_rules", "pe_stem", "stage_block"]


def _by_layer(pe: PosEncoding) -> dict[str, int | str | None]:
    return {name: pe.layer_of(name) for name, _ in pe.named_parameters()}


def pe_stem(pe: PosEncoding, others: str) -> str:
    """Stem regex: `others` plus the PE's shared parameters (model attribute `pe`)."""
    shared = [rf"^pe\.{re.escape(n)}$" for n, layer in _by_layer(pe).items() if layer is None]
    return "|".join([others, *shared])


def pe_layer_rules(pe: PosEncoding, ordinal: Callable[[int], tuple[int, ...]]) -> list[tuple[str, tuple]]:
    """(regex, ordinal(i)) for every per-layer PE parameter of layer i; `ordinal` is the suffix the backbone's
    block rules give block i (`(i,)` for a ViT, `(stage, block)` for a staged backbone)."""
    return [
        (rf"^pe\.{re.escape(n)}$", ordinal(layer))
        for n, layer in _by_layer(pe).items()
        if layer is not None and layer != EVERY_LAYER
    ]


def stage_block(stage_starts: list[int] | tuple[int, ...]) -> Callable[[int], tuple[int, int]]:
    """Global block index -> (stage, block within the stage)."""

    def ordinal(i: int) -> tuple[int, int]:
        s = max(j for j, start in enumerate(stage_starts) if start <= i)
        return s, i - stage_starts[s]

    return ordinal


def exact_no_weight_decay(model: nn.Module, names: Iterable[str]) -> set[str]:
    """`names` with wildcard entries (a PE's `tables.*`) expanded to the exact parameter names, so the
    set works with any timm version (wildcards in no_weight_decay need timm >= 1.0.21)."""
    params = [n for n, _ in model.named_parameters()]
    out: set[str] = set()
    for name in names:
        if any(c in name for c in "*?["):
            out.update(fnmatch.filter(params, name))
        else:
            out.add(name)
    return out
