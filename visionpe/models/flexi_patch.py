"""Training at a patch size drawn per batch (FlexiViT, Beyer et al. 2023; `data.patch_sizes`).

The model keeps one kernel, at its own patch size; for a batch at patch p the stem's kernel is PI-resized to p on
the fly (visionpe.layers.patch_resize), so the gradient reaches the one kernel, and the token grid is the image's
at patch p, which every PE reads from its layout (learned tables resampled to it as at any image size). The draw
of a batch's patch size is the data's (visionpe.data.multires.patch_size_of_batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.patch_resize import resize_kernel

__all__ = ["at_patch_size", "flexi_patch_refusal"]


def flexi_patch_refusal(model: nn.Module) -> str | None:
    """Why the model cannot train at a patch size per batch, or None if it can (a stem `patch_embed` with a
    non-overlapping patch conv `proj`: the vit, swin, vivit and mm families)."""
    stem = getattr(model, "patch_embed", None)
    proj = getattr(stem, "proj", None)
    if not isinstance(proj, (nn.Conv2d, nn.Conv3d)) or not hasattr(stem, "patch_size"):
        if hasattr(model, "stages"):  # CvT
            return (
                "its first embedding is an overlapping conv whose stride, kernel and padding scale together, only to "
                "sizes that keep them whole (set_input_size(patch_size=) resizes it once)"
            )
        return "it has no patch stem (patch_embed.proj, a patch conv)"
    if getattr(model, "token_merger", None) is not None:
        return "its token merger (ViTAR) reduces every patch grid to one grid, so the patch size sets no token count"
    if tuple(proj.stride[-2:]) != tuple(proj.kernel_size[-2:]):
        return "its patch conv overlaps (stride below the kernel)"
    return None


class _ResizedKernel(nn.Module):
    """The stem's conv seen at another patch size: weight PI-resized from the conv's own on every access."""

    def __init__(self, conv: nn.Conv2d | nn.Conv3d, size: tuple[int, int]):
        super().__init__()
        self.base = conv
        self.size = size

    @property
    def weight(self) -> torch.Tensor:
        return resize_kernel(self.base.weight, self.size)

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        conv = F.conv2d if w.ndim == 4 else F.conv3d
        return conv(x, w, self.bias, stride=w.shape[2:])


@contextlib.contextmanager
def at_patch_size(model: nn.Module, patch_size: int) -> Iterator[None]:
    """The model's forwards inside run at patch_size (its stem's kernel PI-resized on the fly, differentiably);
    the stem is restored on exit. A no-op at the model's own patch size."""
    stem = model.patch_embed
    conv, own = stem.proj, stem.patch_size
    size = (int(patch_size), int(patch_size))
    if size == tuple(own):
        yield
        return
    stem.proj, stem.patch_size = _ResizedKernel(conv, size), size
    try:
        yield
    finally:
        stem.proj, stem.patch_size = conv, own
