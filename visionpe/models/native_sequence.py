"""Native batches through the multimodal encoder: sequences of (visual input + its text), each visual input an
image or clip of its own size as tubelets with (t, y, x) coordinates (`visionpe.layout`).

Padded (no image_ids): one sequence per row. Packed (image_ids): sequence j of a row is the visual input whose
patches have image_ids j; a row's sequences are numbered 0, 1, ... without gaps. Text: text_ids [I, Lt], one row
per sequence in output order (row order, then sequence order; for a padded batch I = B, the padded convention),
split by the same text_split for every sequence.

Row b's tokens are [prefix of sequence 0, ..., prefix of sequence K-1, body 0, body 1, ..., padding], each body
[text[:k], <img>, visual (T x H x W raster), </img>, text[k:]]. Sequences whose visual grids agree form one group,
whose layout is the one the encoder gives that sequence alone (its position ids start as if it were alone);
attention is blocked between sequences (the BatchLayout's mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layout.batch import BatchLayout, ImageGroup, check_native, native_layout
from .native_batch import stem_weight

__all__ = ["embed_native_sequence"]


def _text(model, text_ids, count: int, packed: bool, text_split: int | None, device):
    """-> (text ids [I, Lt], the split k)."""
    if packed and isinstance(text_ids, torch.Tensor) and text_ids.ndim == 2 and text_ids.shape[0] != count:
        raise ValueError(
            f"text_ids has {text_ids.shape[0]} rows but the packed batch holds {count} sequences: give one text "
            "row per sequence (row order, then image_ids order)"
        )
    text = model.checked_text(text_ids, count, device)
    k = model.text_split if text_split is None else text_split
    k = min(k, text.shape[1]) if text_split is None else k
    if not 0 <= k <= text.shape[1]:
        raise ValueError(f"text_split={k} is outside [0, {text.shape[1]}] for {text.shape[1]} text ids")
    return text, k


def _body_offsets(vis: BatchLayout, body: torch.Tensor) -> torch.Tensor:
    """Start of each sequence's body among its row's bodies (sequences in output order) from body lengths [I]."""
    rows = torch.empty_like(body)
    for group in vis.groups:
        rows[group.images] = group.rows
    before = torch.cumsum(body, 0) - body
    totals = body.new_zeros(vis.batch).index_add(0, rows, body)
    return before - (torch.cumsum(totals, 0) - totals)[rows]


def embed_native_sequence(model, batch: dict, text_ids: torch.Tensor | None, text_split: int | None):
    """-> tokens [B, L, D] (before the token-site PEs) and their BatchLayout (one entry per sequence)."""
    proj = model.patch_embed.proj
    weight = stem_weight(proj, batch.get("patches"))  # (pt, ph, pw, c)-flattened tubelets, at the batch's patch
    patches, coords, ids = check_native(batch, weight.shape[1], 3)
    packed = "image_ids" in batch  # (check_native refused gaps in each row's numbering)
    vis = native_layout(coords, ids, 0, lambda grid: None)  # cells of each sequence's visual grid
    e = F.linear(patches.to(weight.dtype), weight, proj.bias).flatten(0, 1)  # [B * N, D]
    b, d, device = patches.shape[0], e.shape[-1], e.device
    text, k = _text(model, text_ids, vis.num_images, packed, text_split, device)
    words = model.text_embed(text)  # [I, Lt, D]
    p, slots = model.num_prefix_tokens, vis.slots
    body = torch.zeros(vis.num_images, dtype=torch.long, device=device)
    for group in vis.groups:
        body[group.images] = text.shape[1] + 2 + group.index.shape[1]
    offsets = _body_offsets(vis, body)
    length = slots * p + (int((offsets + body).max()) if body.numel() else 0)
    x = e.new_zeros(b * length, d)
    tokens = torch.full((b * length,), -1, dtype=torch.long, device=device)
    groups = []
    for group in vis.groups:
        rows, slot, images = group.rows, group.slots, group.images
        opening, closing = (m.view(1, 1, d).expand(rows.numel(), 1, d) for m in model.markers)
        seq = torch.cat([words[images, :k], opening, e[group.index], closing, words[images, k:]], dim=1)
        start = rows[:, None] * length
        prefix = start + slot[:, None] * p + torch.arange(p, device=device)
        cells = start + slots * p + offsets[images, None] + torch.arange(seq.shape[1], device=device)
        index = torch.cat([prefix, cells], dim=1)
        x = x.index_copy(0, index.flatten(), model.add_prefix(seq).flatten(0, 1))
        tokens[index.flatten()] = slot.repeat_interleave(index.shape[1])
        layout = model.scheme_layout(model.segments(text.shape[1], group.grid, k), device)
        groups.append(ImageGroup(group.grid, layout, index, images, rows, slot))
    return x.view(b, length, d), BatchLayout(p, slots, tokens.view(b, length), tuple(groups), vis.num_images)
