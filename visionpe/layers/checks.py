"""Input checks shared by the backbones: bad input gets an error that names the problem and the fix."""

from __future__ import annotations

import torch

from ..fx import is_fx_tracing

__all__ = ["check_images", "check_tensor", "patch_grid"]


def check_tensor(x, what: str, axes: str, hints: dict[int, str]) -> None:
    """A TypeError unless x is a tensor, a ValueError unless it has one dim per axis (`axes` e.g. "B, C, H, W");
    hints: a fix for a tensor of that many dims."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a tensor of {what} [{axes}], got {type(x).__name__}")
    if x.ndim != axes.count(",") + 1:
        hint = f" ({hints[x.ndim]})" if x.ndim in hints else ""
        raise ValueError(f"expected {what} of shape [{axes}], got a {x.ndim}-D tensor {tuple(x.shape)}{hint}")


def check_images(x: torch.Tensor, in_chans: int, min_size: int, what: str = "patch") -> tuple[int, int]:
    """Validate an image batch [B, C, H, W]; returns (H, W) (unchecked sizes of an FX proxy while tracing)."""
    if is_fx_tracing():
        return x.shape[-2:]
    check_tensor(x, "images", "B, C, H, W", {3: "add a batch dimension with x.unsqueeze(0)"})
    if x.shape[1] != in_chans:
        raise ValueError(
            f"expected {in_chans} input channels, got {x.shape[1]} (shape {tuple(x.shape)}); "
            f"convert the images or build the model with in_chans={x.shape[1]}"
        )
    h, w = x.shape[-2:]
    if h < min_size or w < min_size:
        raise ValueError(f"image {h} x {w} is smaller than one {what} ({min_size} px); resize it to at least that")
    return h, w


def patch_grid(h: int, w: int, patch: int) -> tuple[int, int]:
    """Grid of patches for an H x W image; sizes not divisible by the patch are zero-padded at the bottom/right."""
    return -(-h // patch), -(-w // patch)
