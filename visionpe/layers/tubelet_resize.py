"""A tubelet kernel at another length and patch size: FlexiViT's pseudo-inverse resize in 3D.

A tubelet x [C, t, p, p] resampled to [C, t', p', p'] is B x with B = B_t (x) B_s (Kronecker): B_t resizes each pixel's
t frames to t' (bicubic, antialiased, as timm's spatial resize, along time), B_s each frame's p x p patch to p' x p'
(timm's `resample_patch_embed` matrix). The kernel w' = pinv(B)^T w keeps <B x, w'> = <x, w> where B has full column
rank (t' >= t and p' >= p), else it is the least-squares best; pinv(B_t (x) B_s) = pinv(B_t) (x) pinv(B_s), so the
resize is the temporal one (this module, per pixel) after the spatial one (visionpe.layers.patch_resize, per frame).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .patch_resize import check_patch_size, resize_kernel, resized_conv

__all__ = ["check_tubelet", "resize_tubelet", "resized_tubelet_conv", "time_resize_matrix"]


def check_tubelet(patch_size, tubelet: int) -> tuple[int, int]:
    """(t, p) from a patch size p (the tubelet's length kept), (p, p) or a tubelet (t, p, p); a clear error else."""
    if isinstance(patch_size, (tuple, list)) and len(patch_size) == 3:
        t = patch_size[0]
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"a tubelet's length (patch_size[0] of (t, p, p)) must be a positive integer, got {t!r}")
        return t, check_patch_size(tuple(patch_size[1:]), "patch_size[1:] of (t, p, p)")
    return tubelet, check_patch_size(patch_size)


def time_resize_matrix(t: int, t_new: int) -> torch.Tensor:
    """B_t [t_new, t] (float64): column j is frame j's unit impulse resized from t to t_new frames."""
    # along the last axis: PyTorch's antialiased bicubic mis-resizes the height of an [.., t, 1] image (torch 2.14)
    eye = torch.eye(t, dtype=torch.float64).reshape(t, 1, 1, t)
    out = F.interpolate(eye, size=(1, t_new), mode="bicubic", antialias=True, align_corners=False)
    return out.reshape(t, t_new).T


def resize_tubelet(weight: torch.Tensor, size: tuple[int, int, int]) -> torch.Tensor:
    """A Conv3d kernel [O, I, t, p, p] -> [O, I, t', p', p']: PI-resized in space (per frame), then in time."""
    weight = resize_kernel(weight, size[1:])
    t, t_new = weight.shape[2], int(size[0])
    if t == t_new:
        return weight
    pinv_t = torch.linalg.pinv(time_resize_matrix(t, t_new).T)  # [t_new, t]
    out = torch.einsum("nt,oithw->oinhw", pinv_t.to(weight.device), weight.double())
    return out.to(weight.dtype)


def resized_tubelet_conv(conv: nn.Conv3d, size: tuple[int, int, int]) -> nn.Conv3d:
    """A copy of a tubelet conv (stride = kernel) at a new kernel size, its weight PI-resized in space and time;
    bias, device, dtype, requires_grad and train / eval mode kept."""
    return resized_conv(conv, size, size, 0, resize=resize_tubelet)
