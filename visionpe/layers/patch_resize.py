"""Patch embeddings at another patch size: FlexiViT's pseudo-inverse resize (Beyer et al., CVPR 2023), through
timm's `resample_patch_embed`.

For a patch x and an embedding w, the resized w' = pinv(B)^T w (B the bicubic, antialiased resize of a patch from
p to p') keeps <B x, w'> = <x, w> whenever B has full column rank (p' >= p: a token of an image resized patch by
patch is the token of the original); for p' < p it is the least-squares best such w'. Every stem here resizes its
kernels with these functions: the ViT's and Swin's patch conv (timm's PatchEmbed), the video tubelet (spatially,
per frame of the tubelet), the multimodal stem, CvT's overlapping first conv and a native batch's patches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from timm.layers import resample_patch_embed
from torch import nn

__all__ = ["check_patch_size", "resize_kernel", "resized_conv"]


def check_patch_size(patch_size, what: str = "patch_size") -> int:
    """A patch size as a positive int (square patches), or a clear error."""
    if isinstance(patch_size, (tuple, list)) and len(patch_size) == 2 and patch_size[0] == patch_size[1]:
        patch_size = patch_size[0]
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"{what} must be a positive integer (square patches, in px), got {patch_size!r}")
    return patch_size


def resize_kernel(weight: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A conv kernel [O, I, (kt,) kh, kw] resized spatially to size (kh', kw') with FlexiViT's PI-resize; the
    leading axes (channels, a tubelet's frames) are resized independently, each as its own 2D kernel."""
    if tuple(weight.shape[-2:]) == tuple(size):
        return weight
    lead = weight.shape[:-2]
    flat = weight.reshape(lead[0], -1, *weight.shape[-2:])  # [O, I * kt, kh, kw]
    return resample_patch_embed(flat, list(size)).reshape(*lead, *size)


def resized_conv(
    conv: nn.Conv2d | nn.Conv3d,
    kernel,
    stride,
    padding,
    resize: Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor] | None = None,
) -> nn.Conv2d | nn.Conv3d:
    """A copy of conv with a new kernel, stride and padding; bias, device, dtype, requires_grad and train / eval
    mode kept. Its weight is resize(weight, new kernel size), by default PI-resized spatially (`resize_kernel`)."""
    new = type(conv)(
        conv.in_channels,
        conv.out_channels,
        kernel_size=kernel,
        stride=stride,
        padding=padding,
        bias=conv.bias is not None,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        if resize is None:
            new.weight.copy_(resize_kernel(conv.weight, new.kernel_size[-2:]))
        else:
            new.weight.copy_(resize(conv.weight, new.kernel_size))
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    new.weight.requires_grad_(conv.weight.requires_grad)
    if conv.bias is not None:
        new.bias.requires_grad_(conv.bias.requires_grad)
    return new.train(conv.training)
