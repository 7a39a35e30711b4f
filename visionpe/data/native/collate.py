"""Native-aspect items into timm's NaFlex dict: padded rows (one image each) or packed rows (several, `image_ids`).

    patches [R, L, P*P*C] float, patch_coord [R, L, 2] long (y, x), patch_valid [R, L] bool
    + image_ids [R, L] long (packed: the image's index within its row, -1 for padding)

The padded dict is the one timm's NaFlexCollator builds (without its `seq_len` entry, which is L); targets come in
row order, then image order within a row (the order of the model's outputs).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .sampler import NativeKey

__all__ = ["NativeBatch", "collate_native"]


class NativeBatch(NamedTuple):
    inputs: dict  # the NaFlex dict above
    targets: torch.Tensor  # [images] class ids
    resolution: None  # batches have no single resolution (Batch's field, kept for the loops that read it)
    skipped: tuple[str, ...]
    tokens: int  # valid patch tokens
    slots: int  # R x L
    images: int


def collate_native(items: list[tuple[dict, int, NativeKey]]) -> NativeBatch:
    """(patch dict, target, key) items of one batch -> a NativeBatch; each key names its row and the row length."""
    items = sorted(items, key=lambda it: it[2].row)  # stable: images keep their order within a row
    key = items[0][2]
    rows, length, dim = key.rows, key.row_len, items[0][0]["patches"].shape[-1]
    patches = torch.zeros(rows, length, dim, dtype=torch.float32)
    coord = torch.zeros(rows, length, 2, dtype=torch.int64)
    valid = torch.zeros(rows, length, dtype=torch.bool)
    ids = torch.full((rows, length), -1, dtype=torch.int64)
    fill, count = [0] * rows, [0] * rows
    for p, _, k in items:
        n, at = p["patches"].shape[0], fill[k.row]
        if at + n > length:
            raise ValueError(f"row {k.row} holds {length} tokens; its images need more ({at + n})")
        patches[k.row, at : at + n] = p["patches"]
        coord[k.row, at : at + n] = p["patch_coord"]
        valid[k.row, at : at + n] = p["patch_valid"]
        ids[k.row, at : at + n] = count[k.row]
        fill[k.row], count[k.row] = at + n, count[k.row] + 1
    inputs = {"patches": patches, "patch_coord": coord, "patch_valid": valid}
    if key.packed:
        inputs["image_ids"] = ids
    targets = [t for _, t, _ in items]
    targets = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.as_tensor(targets)
    return NativeBatch(inputs, targets, None, (), int(valid.sum()), rows * length, len(items))
