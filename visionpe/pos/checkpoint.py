"""Handing a published checkpoint's PE entries to the PEs that own them.

A backbone's checkpoint filter calls `split_pe_entries` with the checkpoint in its source layout: every key a PE
kind declares (`checkpoint_keys[layout]`) goes to the model's PE of that kind, which converts it to its own names
(`convert_checkpoint`, flat names); keys of PE buffers (`checkpoint_buffers[layout]`) are dropped; a key of a kind
the model's PE lacks is a CheckpointMismatch with that kind's message (the preset to use). The backbone maps the rest.

`place_flat_entries` puts flat names (`pe.encodings.<kind>.tables.k.3`: what `convert_checkpoint` returns, and every
visionpe checkpoint written before each layer owned its state) where the model keeps them now: a per-layer tensor
under its layer's module (`blocks.3.attn.pos.<kind>.k`, through the PE's `layer_entries`). Entries already in the
model's names pass unchanged.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .base import CheckpointMismatch, CheckpointSource, LayerPos, PosStack
from .presets import PE_KINDS

__all__ = ["is_visionpe_layout", "place_flat_entries", "split_pe_entries"]


def _matches(patterns: dict[str, str], layout: str, key: str) -> bool:
    pattern = patterns.get(layout)
    return pattern is not None and re.search(pattern, key) is not None


def split_pe_entries(
    pe: PosStack, state_dict: dict[str, torch.Tensor], source: CheckpointSource, prefix: str = "pe."
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the PE entries under the model's names `{prefix}encodings.<kind>.<name>`, every other entry unchanged)."""
    claimed: dict[str, dict[str, torch.Tensor]] = {kind: {} for kind in PE_KINDS}
    rest = {}
    for key, value in state_dict.items():
        if any(_matches(cls.checkpoint_buffers, source.layout, key) for cls in PE_KINDS.values()):
            continue
        kind = next((k for k, cls in PE_KINDS.items() if _matches(cls.checkpoint_keys, source.layout, key)), None)
        if kind is None:
            rest[key] = value
        else:
            claimed[kind][key] = value
    out = {}
    for kind, enc in pe.encodings.items():
        entries = claimed.pop(kind, {})
        if source.layout in enc.checkpoint_keys:  # a PE with nothing in this layout trains from its own init
            out.update({f"{prefix}encodings.{kind}.{n}": v for n, v in enc.convert_checkpoint(entries, source).items()})
    for kind, entries in claimed.items():
        if entries:
            raise CheckpointMismatch(PE_KINDS[kind].absent_message(next(iter(entries)), source))
    return out, rest


def is_visionpe_layout(state_dict: dict) -> bool:
    """Whether a state dict is visionpe's own: PE entries at the model level (`pe.*`, any release) or under a
    layer's attention (`*.attn.pos.*`, a model whose PE state is all per layer, e.g. RoPE-Mixed)."""
    return any(k.startswith("pe.") or ".attn.pos." in k for k in state_dict)


def place_flat_entries(model: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str = "pe.") -> dict:
    """`state_dict` with its flat PE entries (`{prefix}encodings.<kind>.<flat name>` the model lacks) moved under
    the model's per-layer modules; every other entry unchanged."""
    names = set(model.state_dict().keys())
    flat: dict[str, dict[str, torch.Tensor]] = {}
    out = {}
    for key, value in state_dict.items():
        parts = key[len(prefix) :].split(".", 2) if key.startswith(prefix + "encodings.") else []
        if key in names or len(parts) < 3 or parts[1] not in model.pe.encodings:
            out[key] = value
        else:
            flat.setdefault(parts[1], {})[parts[2]] = value
    layers = {m.index: name for name, m in model.named_modules() if isinstance(m, LayerPos)}
    for kind, entries in flat.items():
        own, per_layer = model.pe.encodings[kind].layer_entries(entries)
        out.update({f"{prefix}encodings.{kind}.{n}": v for n, v in own.items()})
        for i, named in per_layer.items():
            if i not in layers:
                raise CheckpointMismatch(
                    f"the checkpoint has {kind} tensors of attention layer {i}, the model {len(layers)} layers"
                )
            out.update({f"{layers[i]}.{kind}.{n}": v for n, v in named.items()})
    return out
