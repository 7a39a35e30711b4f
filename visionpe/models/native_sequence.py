"""Native batches through the multimodal encoder: one visual input per row (an image or clip of its own size, as
tubelets with (t, y, x) coordinates, `visionpe.native`) inside that row's text sequence.

Row b's tokens are [prefix, text[:k], <img>, visual (T x H x W raster), </img>, text[k:]], then padding; rows whose
visual grids agree form one group, whose layout is the one the encoder gives that sequence alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..native import BatchLayout, ImageGroup, check_native, native_layout

__all__ = ["embed_native_sequence"]


def embed_native_sequence(model, batch: dict, text_ids: torch.Tensor | None, text_split: int | None):
    """-> tokens [B, L, D] (before the token-site PEs) and their BatchLayout (one sequence per row)."""
    if "image_ids" in batch:
        raise ValueError("the multimodal encoder takes one visual input per row (a padded native batch, no image_ids)")
    proj = model.patch_embed.proj
    weight = proj.weight.permute(0, 2, 3, 4, 1).flatten(1)  # (pt, ph, pw, c)-flattened tubelets
    patches, coords, ids = check_native(batch, weight.shape[1], 3)
    vis = native_layout(coords, ids, 0, lambda grid: None)  # cells of each row's visual grid
    e = F.linear(patches.to(weight.dtype), weight, proj.bias).flatten(0, 1)  # [B * N, D]
    b, d = patches.shape[0], e.shape[-1]
    text = model.checked_text(text_ids, b, e.device)
    k = model.text_split if text_split is None else text_split
    k = min(k, text.shape[1]) if text_split is None else k
    if not 0 <= k <= text.shape[1]:
        raise ValueError(f"text_split={k} is outside [0, {text.shape[1]}] for {text.shape[1]} text ids")
    words = model.text_embed(text)  # [B, Lt, D]
    p = model.num_prefix_tokens
    sizes = [p + text.shape[1] + 2 + g.index.shape[1] for g in vis.groups]
    length = max(sizes)
    x = e.new_zeros(b * length, d)
    tokens = torch.full((b, length), -1, dtype=torch.long, device=e.device)
    groups = []
    for group, size in zip(vis.groups, sizes):
        rows = group.rows
        opening, closing = (m.view(1, 1, d).expand(rows.numel(), 1, d) for m in model.markers)
        seq = torch.cat([words[rows, :k], opening, e[group.index], closing, words[rows, k:]], dim=1)
        index = rows[:, None] * length + torch.arange(size, device=e.device)
        x = x.index_copy(0, index.flatten(), model.add_prefix(seq).flatten(0, 1))
        tokens[rows, :size] = 0
        layout = model.scheme_layout(model.segments(text.shape[1], group.grid, k), e.device)
        groups.append(ImageGroup(group.grid, layout, index, rows, rows, torch.zeros_like(rows)))
    return x.view(b, length, d), BatchLayout(p, 1, tokens, tuple(groups), b)
