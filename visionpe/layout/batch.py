"""Native-resolution batches: images of any size and aspect ratio in one batch, padded (timm's NaFlex) or packed
(NaViT), and the `BatchLayout` that says where each image's tokens sit.

Input format (a dict; the same keys and layout as timm 1.0.31's NaFlex, so `timm.data`'s `Patchify` and
`NaFlexCollator` feed the models unchanged):

    patches      float [B, N, P*P*C]  normalised, flattened patches, each in (ph, pw, c) order (timm's Patchify,
                                      channels last); P the model's patch size, C its input channels;
                                      [B, N, P, P, C] (timm's unflattened patches) is flattened; unflattened
                                      patches may have their own P (the kernel is PI-resized to it, FlexiViT)
    patch_coord  int   [B, N, 2]      (y, x) patch coordinates within the patch's own image
    patch_valid  bool  [B, N]         True for a patch, False for padding (anywhere in the row)
    image_ids    int   [B, N]         optional (packed rows): the image each patch belongs to within its row,
                                      0, 1, ... without gaps (-1 for padding); absent: one image per row

Other keys: `seq_len` (timm's collator) is ignored; anything else is an error.
Each image must come whole: its patches cover the full grid (max y + 1) x (max x + 1) exactly once, in any order.
Every row of a padded batch holds one image; a packed row holds any number (possibly none).

Outputs (every vit model): `forward` gives logits [I, classes], one row per image in row order, then image-id order;
`forward_features` a dict (patches: tokens [B, L, C] after the final norm, patch_valid: bool [B, L] the tokens of
an image, layout: the BatchLayout) that `forward_head` pools per image, padding excluded; `forward_intermediates`
takes output_fmt='NLC' only and gives [B, N, C] at the input's patch positions (prefix tokens [B, K * Pfx, C]),
padding zero. `pack_images` builds such a dict from image tensors (timm's own patchify).

Clips (video ViTs): the same keys, `patches` [B, N, Tt*P*P*C] tubelets flattened in (pt, ph, pw, c) order and
`patch_coord` [B, N, 3] (t, y, x) (`patchify_clip`, `pack_images(..., tubelet=)`). The multimodal encoder takes
the clip dict with text_ids [I, Lt], one text row per visual input (sequence), padded or packed
(`visionpe/models/native_sequence.py`).

Inside the model the tokens of a batch are [B, L, C] with L = K * Pfx + N: K = the most images a row holds, Pfx =
the model's prefix tokens (CLS, registers); image j of a row has its prefix tokens at [j * Pfx, (j + 1) * Pfx) and
its patches where the input put them (K * Pfx + n). Attention is blocked between images; the padding of a row
attends to itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention.masks import AttnMask
from .tokens import TokenLayout

__all__ = [
    "NATIVE_KEYS",
    "ImageGroup",
    "BatchLayout",
    "check_native",
    "is_native_batch",
    "native_layout",
    "pack_images",
    "regrid_layout",
]

NATIVE_KEYS = ("patches", "patch_coord", "patch_valid", "image_ids")


def is_native_batch(x) -> bool:
    """Whether x is a native-resolution batch (a NaFlex dict) rather than an image tensor."""
    return isinstance(x, dict) and "patches" in x


@dataclass(frozen=True, eq=False)
class ImageGroup:
    """Images of one batch that share a token grid.

    grid: (H, W) of their tokens ((T, H, W) for clips); layout: the TokenLayout the model gives one such image
    alone (prefix included); index: long [G, Pfx + H*W] flat indices into the batch's [B * L] tokens (prefix,
    then patches in raster order); images: long [G] the output rows of these images; rows / slots: long [G] their
    batch row and image id."""

    grid: tuple[int, ...]
    layout: TokenLayout
    index: torch.Tensor
    images: torch.Tensor
    rows: torch.Tensor
    slots: torch.Tensor


@dataclass(frozen=True, eq=False)
class BatchLayout:
    """Where each image's tokens sit in a [B, L, C] batch of several images (see the module docstring).

    ids: long [B, L], the image id within its row of each token, -1 for padding; slots: K, the prefix slots per
    row; groups: the images grouped by grid; num_images: the outputs of the batch."""

    num_prefix: int
    slots: int
    ids: torch.Tensor
    groups: tuple[ImageGroup, ...]
    num_images: int

    @property
    def batch(self) -> int:
        return self.ids.shape[0]

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    @property
    def prefix_length(self) -> int:
        """Tokens before the patches of every row (K prefix slots)."""
        return self.slots * self.num_prefix

    @functools.cached_property
    def valid(self) -> torch.Tensor:
        """bool [B, L]: tokens that belong to an image."""
        return self.ids >= 0

    def gather(self, x: torch.Tensor, group: ImageGroup) -> torch.Tensor:
        """x [B, L, ...] -> the group's images as an ordinary batch [G, Pfx + H*W, ...]."""
        return x.flatten(0, 1).index_select(0, group.index.flatten()).unflatten(0, group.index.shape)

    def scatter(self, x: torch.Tensor, group: ImageGroup, values: torch.Tensor) -> torch.Tensor:
        """x with the group's tokens replaced by values [G, Pfx + H*W, ...] (out of place, autograd-safe)."""
        flat = x.flatten(0, 1).index_copy(0, group.index.flatten(), values.flatten(0, 1).to(x.dtype))
        return flat.view_as(x)

    @functools.cached_property
    def mask(self) -> AttnMask:
        """The attention mask of the batch: each image (with its prefix) attends to itself, padding to padding."""
        return AttnMask(self.ids)

    def map_images(self, x: torch.Tensor, fn: Callable[[torch.Tensor, TokenLayout], torch.Tensor]) -> torch.Tensor:
        """Apply fn(tokens [G, Pfx + H*W, C], layout) to every group of images; padding is left as it is."""
        for group in self.groups:
            x = self.scatter(x, group, fn(self.gather(x, group), group.layout))
        return x


def patchify_clip(clip: torch.Tensor, tubelet: int, patch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A clip [C, T, H, W] -> tubelets [N, tubelet * patch * patch * C] flattened in (pt, ph, pw, c) order and their
    (t, y, x) coordinates [N, 3], raster order; T, H, W padded with zeros up to whole tubelets."""
    c, t, h, w = clip.shape
    gt, gh, gw = -(-t // tubelet), -(-h // patch), -(-w // patch)
    clip = F.pad(clip, (0, gw * patch - w, 0, gh * patch - h, 0, gt * tubelet - t))
    cells = clip.reshape(c, gt, tubelet, gh, patch, gw, patch).permute(1, 3, 5, 2, 4, 6, 0)
    coords = torch.stack(torch.meshgrid(torch.arange(gt), torch.arange(gh), torch.arange(gw), indexing="ij"), -1)
    return cells.reshape(gt * gh * gw, -1), coords.reshape(-1, 3)


def pack_images(rows: list, patch_size: int, length: int | None = None, tubelet: int | None = None) -> dict:
    """A native batch from images [C, H, W]: `rows` a list of images (padded: one per row) or of lists of images
    (packed: `image_ids` added). Patches as timm's Patchify makes them (sizes padded up to whole patches); length:
    the row length N (default the longest row). tubelet: the items are clips [C, T, H, W] (`patchify_clip`)."""
    from timm.data.naflex_transforms import patchify_image

    def patchify(item):
        if tubelet is None:
            return patchify_image(item, (patch_size, patch_size))[:2]
        return patchify_clip(item, tubelet, patch_size)

    packed = any(isinstance(r, (list, tuple)) for r in rows)
    rows = [list(r) if isinstance(r, (list, tuple)) else [r] for r in rows]
    for b, row in enumerate(rows):
        for j, item in enumerate(row):
            if 0 in item.shape[1:]:
                size = " x ".join(map(str, item.shape[1:]))
                raise ValueError(f"pack_images: image {j} of row {b} is empty ({size} px); every image needs pixels")
    per_row = [[patchify(img) for img in row] for row in rows]
    sizes = [sum(p[0].shape[0] for p in row) for row in per_row]
    n = max(sizes, default=0) if length is None else length
    if n < max(sizes, default=0):
        raise ValueError(f"pack_images: a row needs {max(sizes)} patches, more than length={n}")
    dim = per_row[0][0][0].shape[1] if per_row and per_row[0] else 0
    out = dict(
        patches=torch.zeros(len(rows), n, dim),
        patch_coord=torch.zeros(len(rows), n, 2 if tubelet is None else 3, dtype=torch.long),
        patch_valid=torch.zeros(len(rows), n, dtype=torch.bool),
    )
    ids = torch.full((len(rows), n), -1, dtype=torch.long)
    for b, row in enumerate(per_row):
        start = 0
        for j, (patches, coord) in enumerate(row):
            stop = start + patches.shape[0]
            out["patches"][b, start:stop], out["patch_coord"][b, start:stop] = patches, coord
            out["patch_valid"][b, start:stop], ids[b, start:stop] = True, j
            start = stop
    return {**out, "image_ids": ids} if packed else out


def _tensor(batch: dict, key: str, shape: tuple, names: str) -> torch.Tensor:
    t = batch.get(key)
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"native batch: {key!r} must be {names} = {list(shape)} (patches [B, N, D]), got {got}")
    return t


def check_native(batch: dict, patch_dim: int, dims: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a NaFlex dict; returns (patches [B, N, D], coords long [B, N, dims], ids long [B, N], -1 padding).
    dims: 2 for (y, x) image patches, 3 for (t, y, x) video tubelets."""
    unknown = set(batch) - set(NATIVE_KEYS) - {"seq_len"}  # timm's NaFlexCollator adds seq_len (an int)
    if unknown:
        why = "; the mask comes from patch_valid / image_ids" if "attn_mask" in unknown else ""
        raise ValueError(f"native batch: unknown keys {sorted(unknown)}; expected {', '.join(NATIVE_KEYS)}{why}")
    patches = batch.get("patches")
    if isinstance(patches, torch.Tensor) and patches.ndim == 3 + dims:  # timm's unflattened [B, N, Ph, Pw, C]
        patches = patches.flatten(2)
    if not isinstance(patches, torch.Tensor) or patches.ndim != 3 or patches.shape[-1] != patch_dim:
        got = tuple(patches.shape) if isinstance(patches, torch.Tensor) else type(patches).__name__
        raise ValueError(
            f"native batch: 'patches' must be [B, N, {patch_dim}] (P*P*C, flattened), got {got}; patches of "
            "another patch size come unflattened, [B, N, P, P, C] (timm's NaFlex loader with patch_size_choices)"
        )
    if not patches.is_floating_point():  # a cast of uint8 pixels would feed the model 0..255
        raise ValueError(
            f"native batch: 'patches' are {str(patches.dtype).removeprefix('torch.')}; give float patches normalised "
            "as for the model's images ((pixels / 255 - mean) / std, what timm's NaFlex transforms produce)"
        )
    b, n = patches.shape[:2]
    coords = _tensor(batch, "patch_coord", (b, n, dims), f"[B, N, {dims}]").long()
    valid = _tensor(batch, "patch_valid", (b, n), "[B, N]").bool()
    ids = batch.get("image_ids")
    ids = (
        torch.zeros_like(valid, dtype=torch.long)
        if ids is None
        else _tensor(batch, "image_ids", (b, n), "[B, N]").long()
    )
    if bool((valid & (ids < 0)).any()):
        raise ValueError("native batch: a valid patch has image_ids < 0; use 0, 1, ... for images, -1 for padding")
    ids = torch.where(valid, ids, -1)
    if "image_ids" in batch:
        _check_numbering(ids)
    if bool(((coords < 0) & valid[..., None]).any()):
        raise ValueError("native batch: patch_coord has negative (y, x) coordinates")
    if "image_ids" not in batch and n and bool((~valid.any(1)).any()):
        row = int((~valid.any(1)).nonzero()[0])
        raise ValueError(f"native batch: row {row} has no valid patch (a padded batch holds one image per row)")
    return patches, coords, ids


def _check_numbering(ids: torch.Tensor) -> None:
    """A packed row numbers its images 0, 1, ... without a gap (a missing id is an image without patches, whose
    output row would vanish and move every later one up), each id below the row length N; checked before any
    table sized by the largest id is allocated."""
    b, n = ids.shape
    top = int(ids.max()) if ids.numel() else -1
    if top >= n:
        row = int((ids == top).any(1).nonzero()[0])
        raise ValueError(
            f"native batch: row {row} has image_ids {top}, not below its {n} patches; number each row's images "
            "0, 1, ... without gaps (-1 for padding)"
        )
    if top < 0:
        return
    present = torch.zeros(b, top + 2, dtype=torch.bool, device=ids.device)
    present.scatter_(1, ids + 1, True)  # column 0 collects the padding (-1)
    gap = present[:, 2:] & ~present[:, 1:-1]  # image j + 1 has patches, image j none
    if bool(gap.any()):
        row, j = (int(v) for v in gap.nonzero()[0])
        raise ValueError(
            f"native batch: row {row} has image_ids {j + 1} but no patches with image_ids {j} (an empty image?); "
            "number each row's images 0, 1, ... without gaps, every image with at least one patch"
        )


def native_layout(
    coords: torch.Tensor, ids: torch.Tensor, num_prefix: int, image_layout: Callable[[tuple], TokenLayout]
) -> BatchLayout:
    """The BatchLayout of checked coords [B, N, D] ((y, x) or (t, y, x)) and ids [B, N]; image_layout(grid) gives
    the layout of one image (clip) of that grid alone."""
    b, n = ids.shape
    device = ids.device
    k = int(ids.max()) + 1 if ids.numel() else 0
    length = k * num_prefix + n
    valid = ids >= 0
    key = (torch.arange(b, device=device)[:, None] * k + ids)[valid]  # image key b * K + j of each valid patch
    pos = [coords[..., axis][valid] for axis in range(coords.shape[-1])]
    size = max(b * k, 1)
    count = torch.bincount(key, minlength=size)
    present = count > 0
    keys = present.nonzero().flatten()  # sorted: row order, then image order
    zeros = torch.zeros(size, dtype=torch.long, device=device)
    extent = torch.stack([zeros.scatter_reduce(0, key, c, "amax")[keys] + 1 for c in pos], dim=1)  # [I, D]
    cells = extent.prod(dim=1)
    bad = (count[keys] != cells).nonzero().flatten()
    if bad.numel():
        i = int(keys[bad[0]])
        grid = " x ".join(str(int(e)) for e in extent[bad[0]])
        raise ValueError(
            f"native batch: image {i % k} of row {i // k} has {int(count[i])} patches, not a full {grid} grid "
            "(max coordinate + 1 along each axis)"
        )
    out_index = torch.full((size,), -1, dtype=torch.long, device=device)
    out_index[keys] = torch.arange(keys.numel(), device=device)
    img = out_index[key]  # output row of each valid patch
    raster = torch.zeros_like(key)
    for axis, c in enumerate(pos):  # row-major cell index, the last axis (x) fastest
        raster = raster * extent[img, axis] + c
    table = torch.full(
        (keys.numel(), max(int(cells.max()) if keys.numel() else 0, 1)), -1, dtype=torch.long, device=device
    )
    token = (torch.arange(b, device=device)[:, None] * length + k * num_prefix + torch.arange(n, device=device))[valid]
    table[img, raster] = token
    groups = _groups(keys, extent, table, k, length, num_prefix, image_layout)
    slot_ids = torch.arange(k, device=device).repeat_interleave(num_prefix).expand(b, -1)
    has = present.view(b, k) if k else present[:0].view(b, 0)
    slot_ids = torch.where(has.repeat_interleave(num_prefix, dim=1), slot_ids, -1)
    return BatchLayout(num_prefix, k, torch.cat([slot_ids, ids], dim=1), groups, keys.numel())


def _groups(keys, extent, table, k, length, num_prefix, image_layout) -> tuple[ImageGroup, ...]:
    """Images grouped by grid, each group's flat token indices (prefix slots, then raster cells)."""
    device = table.device
    by_grid: dict[tuple[int, ...], list[int]] = {}
    for i, grid in enumerate(map(tuple, extent.tolist())):
        by_grid.setdefault(grid, []).append(i)
    groups = []
    for grid, images in by_grid.items():
        images = torch.tensor(images, dtype=torch.long, device=device)
        cells = table[images, : math.prod(grid)]
        if bool((cells < 0).any()):
            raise ValueError(f"native batch: an image of grid {' x '.join(map(str, grid))} repeats a coordinate")
        row, slot = keys[images] // k, keys[images] % k
        prefix = row[:, None] * length + slot[:, None] * num_prefix + torch.arange(num_prefix, device=device)
        index = torch.cat([prefix, cells], dim=1)
        groups.append(ImageGroup(grid, image_layout(grid), index, images, row, slot))
    return tuple(groups)


def regrid_layout(layout: BatchLayout, grid: tuple[int, int], image_layout) -> BatchLayout:
    """The same images and prefix slots, each image now a `grid` of tokens (ViTAR's token merger), an image's tokens
    after the prefix slots one image after another in its row (image-id order)."""
    device = layout.ids.device
    rows = torch.cat([g.rows for g in layout.groups])
    slots = torch.cat([g.slots for g in layout.groups])
    images = torch.cat([g.images for g in layout.groups])
    order = torch.empty_like(images)
    order[images] = torch.arange(images.numel(), device=device)
    rows, slots = rows[order], slots[order]  # in output order: row, then image id
    per_row = torch.bincount(rows, minlength=layout.batch)
    rank = torch.arange(rows.numel(), device=device) - (torch.cumsum(per_row, 0) - per_row)[rows]
    cells = grid[0] * grid[1]
    start = layout.prefix_length
    length = start + int(per_row.max()) * cells if rows.numel() else start
    p = layout.num_prefix
    arange_p, arange_c = torch.arange(p, device=device), torch.arange(cells, device=device)
    prefix = rows[:, None] * length + slots[:, None] * p + arange_p
    body = rows[:, None] * length + start + (rank * cells)[:, None] + arange_c
    ids = torch.full((layout.batch, length), -1, dtype=torch.long, device=device)
    ids[:, :start] = layout.ids[:, :start]
    ids.view(-1)[body.flatten()] = slots.repeat_interleave(cells)
    out = torch.arange(rows.numel(), device=device)
    group = ImageGroup(tuple(grid), image_layout(tuple(grid)), torch.cat([prefix, body], 1), out, rows, slots)
    return BatchLayout(p, layout.slots, ids, (group,), layout.num_images)
