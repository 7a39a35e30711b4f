"""An image's size at a token budget, keeping its aspect ratio, and the image cut into timm's NaFlex patches.

The size comes from timm's `get_image_size_for_seq` (the largest scale at which the image, rounded up to whole
patches, needs at most `max_tokens` patches), so our pipeline and timm's NaFlex transforms agree on every size; the
patches from timm's `patchify_image` (flattened in (ph, pw, c) order, (y, x) coordinates).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.data.naflex_transforms import get_image_size_for_seq, patchify_image

__all__ = ["budget_size", "resize_hw", "patchify"]


def budget_size(size: tuple[int, int], patch: int, max_tokens: int) -> tuple[int, int]:
    """(H, W) in px, multiples of `patch`, for an image of `size` (h, w) at a budget of `max_tokens` patches:
    H / W is h / w to within one patch in each dimension, (H / patch) * (W / patch) <= max_tokens."""
    h, w = int(size[0]), int(size[1])
    if h < 1 or w < 1:
        raise ValueError(f"an image must be at least 1 x 1 px, got {h} x {w}")
    if max_tokens < 1:
        raise ValueError(f"the token budget must be at least 1 patch, got {max_tokens}")
    _, (H, W) = get_image_size_for_seq((h, w), patch, max_tokens)
    return int(H), int(W)


def resize_hw(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """An image [C, h, w] resized to [C, H, W] (bilinear, antialiased when shrinking)."""
    if x.ndim != 3:
        raise ValueError(f"native-aspect batches take images [C, H, W], got shape {tuple(x.shape)}")
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    shrink = size[0] < x.shape[-2] or size[1] < x.shape[-1]
    out = F.interpolate(x[None].float(), size=tuple(size), mode="bilinear", align_corners=False, antialias=shrink)
    return out[0].to(x.dtype)


def patchify(x: torch.Tensor, patch: int) -> dict[str, torch.Tensor]:
    """An image [C, H, W] (H, W multiples of `patch`) as timm's Patchify gives it: patches [N, P*P*C],
    patch_coord [N, 2] (y, x), patch_valid [N]."""
    if x.shape[-2] % patch or x.shape[-1] % patch:
        raise ValueError(f"a {x.shape[-2]} x {x.shape[-1]} px image is not whole {patch} px patches")
    patches, coord, valid = patchify_image(x, (patch, patch))
    return {"patches": patches, "patch_coord": coord, "patch_valid": valid}
