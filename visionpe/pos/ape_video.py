"""Separable learned APE for video: a spatial table (resampled bicubically) plus a temporal table (resampled
linearly), pe[t, y, x] = space[y, x] + time[t] (ViViT's factorised embedding). Works at any clip length and size."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed, trunc_normal_
from torch import nn

from ..layout.tokens import TokenLayout
from .base import PEHost, PosEncoding

__all__ = ["SpaceTimeAPE"]


class SpaceTimeAPE(PosEncoding):
    """`space` [1, H0*W0, C] and `time` [1, T0, C] on the reference tubelet grid (T0 = host.frames, the
    number of token frames); prefix tokens get an entry of their own in `prefix` when host.embed_prefix."""

    def __init__(self, host: PEHost, std: float = 0.02):
        super().__init__(host)
        self.std = float(std)
        self.grid = tuple(host.grid)
        self.frames = int(host.frames)
        self.space = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], host.dim))
        self.time = nn.Parameter(torch.zeros(1, self.frames, host.dim))
        self.num_prefix_entries = host.num_prefix if host.embed_prefix else 0
        self.prefix = (
            nn.Parameter(torch.zeros(1, self.num_prefix_entries, host.dim)) if self.num_prefix_entries else None
        )
        self.reset_parameters()

    def reset_parameters(self):
        for p in (self.space, self.time, self.prefix):
            if p is not None:
                trunc_normal_(p, std=self.std)

    def space_table(self, hw: tuple[int, int]) -> torch.Tensor:
        """[1, H*W, C]"""
        if tuple(hw) == self.grid:
            return self.space
        return resample_abs_pos_embed(self.space, new_size=list(hw), old_size=list(self.grid), num_prefix_tokens=0)

    def time_table(self, t: int) -> torch.Tensor:
        """[1, T, C]"""
        if t == self.frames:
            return self.time
        return F.interpolate(self.time.transpose(1, 2), size=t, mode="linear", align_corners=False).transpose(1, 2)

    def table(self, grid: tuple[int, int, int]) -> torch.Tensor:
        """[1, T*H*W, C] in raster order (x fastest)."""
        t, h, w = grid
        pe = self.time_table(t)[:, :, None, :] + self.space_table((h, w))[:, None, :, :]  # [1, T, H*W, C]
        return pe.flatten(1, 2)

    def tokens(self, x, layout: TokenLayout):
        if layout.grid is None:
            raise ValueError("the space-time APE needs a (T, H, W) token grid; interleaved sequences have none")
        pe = self.table(layout.grid).to(x.dtype)
        p = layout.num_prefix
        if self.prefix is not None:
            pe = torch.cat([self.prefix.to(x.dtype), pe], dim=1)
            p -= self.num_prefix_entries
        return torch.cat([x[:, :p], x[:, p:] + pe], dim=1) if p else x + pe

    def set_grid(self, grid):
        self.regrid_table("space", grid, self.space_table)

    def no_weight_decay(self):
        return {"space", "time"} | ({"prefix"} if self.prefix is not None else set())
