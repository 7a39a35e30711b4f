"""iRPE's tables from published checkpoints: the iRPE authors' DeiT (microsoft/Cream iRPE) and Swin's relative
position bias (timm's and the official Swin).

Official iRPE, per block i: on q / k `blocks.{i}.attn.rpe_{q|k}.lookup_table_weight` [heads | 1, d, buckets] (ours
`tables.{q|k}.{i}` [buckets, d] shared or [heads, buckets, d]), on v [heads | 1, buckets, d] (ours `tables.v.{i}`),
bias mode `lookup_table_bias` [heads | 1, buckets] (ours `bias_tables.{i}` / `q_bias_tables.{i}` [buckets, heads | 1]).
Both number the buckets the same way (product: row bucket * (2B + 1) + column bucket; the prefix bucket last).

Swin: `layers.{s}.blocks.{j}.attn.relative_position_bias_table` [(2ws-1)^2, heads] is `bias_tables.{i}` with i the
block index over all stages (the same layout: the product mapping with an identity index); tables trained for another
window are resized bicubically, as timm does.
"""

from __future__ import annotations

import re

import torch
from timm.layers import resize_rel_pos_bias_table

from .base import CheckpointMismatch, CheckpointSource

__all__ = ["IRPE_KEYS", "SWIN_TABLE", "irpe_tables", "swin_tables"]

IRPE_KEYS = r"^blocks\.\d+\.attn\.rpe_"
SWIN_TABLE = r"^layers\.(\d+)\.blocks\.(\d+)\.attn\.relative_position_bias_table$"


def irpe_tables(irpe, entries: dict[str, torch.Tensor], source: CheckpointSource) -> dict[str, torch.Tensor]:
    """blocks.{i}.attn.rpe_{t}.lookup_table_{weight|bias} (official iRPE) -> our table names and layouts."""
    out = {}
    for key, v in entries.items():
        block, rest = key[len("blocks.") :].split(".attn.rpe_")
        target, kind = rest.split(".lookup_table_")
        if target not in irpe.targets:
            raise CheckpointMismatch(irpe.absent_message(key, source))
        mode = "bias" if kind == "bias" else "contextual"
        if irpe.mode != mode:
            raise CheckpointMismatch(
                f"the checkpoint's iRPE is {mode} ({key}), the model's {irpe.mode}; pass mode={mode!r}"
            )
        if mode == "bias":
            name = f"{'q_' if target == 'q' else ''}bias_tables.{block}"
            v = v.t()  # [heads | 1, R] -> [R, heads | 1]
        else:
            name = f"tables.{target}.{block}"
            if target != "v":
                v = v.transpose(-1, -2)  # [heads | 1, d, R] -> [heads | 1, R, d]
            if irpe.shared_heads:
                if v.shape[0] != 1:
                    raise CheckpointMismatch(f"{key} has a table per head; build the model with shared_heads=False")
                v = v[0]
        out[name] = v.contiguous()
    return out


def swin_tables(irpe, entries: dict[str, torch.Tensor], source: CheckpointSource) -> dict[str, torch.Tensor]:
    """layers.{s}.blocks.{j}.attn.relative_position_bias_table -> bias_tables.{i}, resized to the model's window."""
    if entries and (irpe.mode != "bias" or "k" not in irpe.targets):
        raise CheckpointMismatch(irpe.absent_message(next(iter(entries)), source))
    starts = tuple(irpe.host.stage_starts) + (irpe.host.depth,)
    out = {}
    for key, v in entries.items():
        s, j = (int(g) for g in re.match(SWIN_TABLE, key).groups())
        if s + 1 >= len(starts) or starts[s] + j >= starts[s + 1]:
            raise CheckpointMismatch(f"the checkpoint has more blocks than the model; it is {source.describe()}")
        i = starts[s] + j
        target = irpe.table_shape(i)
        if v.shape[0] != target[0] and v.shape[1] == target[1]:
            v = resize_rel_pos_bias_table(v, new_window_size=irpe.host.layers[i].grid, new_bias_shape=tuple(target))
        out[f"bias_tables.{i}"] = v
    return out
