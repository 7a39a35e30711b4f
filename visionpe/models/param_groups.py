"""Optimizer groups of PE parameters for timm's `group_matcher` / `no_weight_decay` (layer-wise lr decay, no decay).

Every PE parameter that serves one attention layer lives in that layer's block (`blocks.{i}.attn.pos.<kind>.*`),
so the backbone's block rules put it in block i's group, as timm's Swin does for its relative position bias table.
The model-level PE (`pe.*`: APE and the other token-site tables, FIRE's stage MLPs) is matched by the stem rule:
it sits at the model's root, where timm's eva keeps its RoPE, and is read before the first block.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from torch import nn

__all__ = ["exact_no_weight_decay"]


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
