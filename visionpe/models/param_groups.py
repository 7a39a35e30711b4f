"""Optimizer groups of PE parameters for timm's `group_matcher` / `no_weight_decay` (layer-wise lr decay, no decay).

A PE stores the parameters of attention layer i under a dotted index i (`pe.encodings.<kind>.<...>.{i}[.<...>]`:
iRPE `tables.k.{i}` / `bias_tables.{i}`, LePE and CPE `convs.{i}`, per-layer RoPE-Mixed `freqs.{i}`), so with layer
decay each lands in the group of block i, as timm's Swin puts its relative position bias table. Parameters shared by
all layers (APE, sin-cos, fuzzy tables, prefix tokens) stay in the stem group. RoPE-Mixed's single frequency tensor
`rope2d.freqs` [2, depth, ...] holds every layer at once: it is left unmatched, which puts it in the top group
(lr scale 1, with the head), as timm's eva does for its `rope.freqs`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from torch import nn

__all__ = ["exact_no_weight_decay", "pe_block_rules", "pe_layer_regex", "pe_stem"]

# the PE parameter names that carry a layer index: components before the index do not start with a digit
_INDEXED = r"\.encodings\.[^.]+\.(?:[^.\d][^.]*\.)*"  # after "pe"
_ALL_LAYERS = r"\.encodings\.rope2d\.freqs$"  # one tensor for every layer (RoPE-Mixed, uniform heads)


def pe_layer_regex(i: int | None = None) -> str:
    """Regex of the PE parameters of layer i (any layer, index captured, when i is None)."""
    index = r"(\d+)" if i is None else str(int(i))
    return rf"^pe{_INDEXED}{index}(?:\.|$)"


def pe_stem(others: str = "") -> str:
    """Stem regex: `others` plus every PE parameter that is neither per-layer nor all-layers."""
    pe = rf"^pe(?!{_INDEXED}\d+(?:\.|$))(?!{_ALL_LAYERS})"
    return f"{others}|{pe}" if others else pe


def pe_block_rules(stage_starts: Sequence[int], depths: Sequence[int]) -> list[tuple[str, tuple[int, int]]]:
    """(regex, (stage, block)) for the PE parameters of every layer of a staged backbone (global index i of
    block b of stage s is stage_starts[s] + b), matching block rules of the form `(stage, block)`."""
    return [(pe_layer_regex(s0 + b), (s, b)) for s, (s0, d) in enumerate(zip(stage_starts, depths)) for b in range(d)]


def exact_no_weight_decay(model: nn.Module, names: Iterable[str]) -> set[str]:
    """`names` with wildcard entries (`pe.encodings.irpe.tables.*`) expanded to the exact parameter names, so the
    set works with any timm version (wildcards in no_weight_decay need timm >= 1.0.21)."""
    params = [n for n, _ in model.named_parameters()]
    out: set[str] = set()
    for name in names:
        if any(c in name for c in "*?["):
            out.update(fnmatch.filter(params, name))
        else:
            out.add(name)
    return out
