"""Absolute encodings added to the tokens: learned APE (resampled bicubically) and fixed 2D sin-cos."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed, trunc_normal_
from torch import nn

from ..layout.tokens import TokenLayout, is_symbolic
from .base import CheckpointMismatch, PEHost, PosEncoding

__all__ = ["APE_RESAMPLE", "LearnedAPE", "SinCos2D", "resample_bicubic", "sincos_2d"]

# how a learned table reaches another grid: "timm" = timm's resample_abs_pos_embed (bicubic, antialiased when
# shrinking; what timm's DeiT / ViT weights are evaluated with); "bicubic" = plain bicubic, align_corners=False, no
# antialias (naver's RoPE-ViT +APE models, whose paper numbers at other resolutions come from it)
APE_RESAMPLE = ("timm", "bicubic")


def resample_bicubic(
    table: torch.Tensor, old: tuple[int, int], new: tuple[int, int], prefix: int = 0, antialias: bool = False
) -> torch.Tensor:
    """Bicubic resampling (align_corners=False; antialiased when shrinking if `antialias`, as timm's
    resample_abs_pos_embed does) of a [1, prefix + H0*W0, C] table to [1, prefix + H*W, C] (prefix rows kept)."""
    head, grid = table[:, :prefix], table[:, prefix:]
    c = grid.shape[-1]
    img = grid.reshape(1, old[0], old[1], c).permute(0, 3, 1, 2).float()
    img = F.interpolate(img, size=tuple(new), mode="bicubic", align_corners=False, antialias=antialias)
    grid = img.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], c).to(table.dtype)
    return torch.cat([head, grid], dim=1) if prefix else grid


class LearnedAPE(PosEncoding):
    """A learned table for the reference grid, resampled bicubically to other (also rectangular) grids.

    `pos_embed` [1, E + H0*W0, C], E = num_prefix when prefix tokens have entries (timm DeiT) else 0
    (`no_embed_class`, as in the RoPE-ViT +APE models). resample: "timm" (antialiased, timm's) or "bicubic"
    (plain, naver RoPE-ViT's); see APE_RESAMPLE. Published ViT checkpoints name it `pos_embed` (timm's layout).
    """

    checkpoint_keys = {"vit": r"^pos_embed$"}

    def __init__(self, host: PEHost, std: float = 0.02, resample: str = "timm"):
        super().__init__(host)
        if resample not in APE_RESAMPLE:
            raise ValueError(f"APE resample must be one of {APE_RESAMPLE}, got {resample!r}")
        self.resample = resample
        self.std = float(std)
        self.grid = tuple(host.grid)
        self.num_prefix_entries = host.num_prefix if host.embed_prefix else 0
        num = self.num_prefix_entries + self.grid[0] * self.grid[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, num, host.dim))
        trunc_normal_(self.pos_embed, std=std)

    def table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The table at `grid` (H, W): [1, E + H*W, C].

        With symbolic sizes (torch.export / torch.compile with dynamic shapes) the table is always resampled: a
        "same grid, no resampling" branch would specialize the traced graph to the example's size. Resampling to the
        stored grid reproduces the table (bicubic weights at zero offset are exactly 0, 1, 0, 0)."""
        if is_symbolic(grid):
            antialias = self.resample == "timm"
            return resample_bicubic(self.pos_embed, self.grid, tuple(grid), self.num_prefix_entries, antialias)
        if tuple(grid) == self.grid:
            return self.pos_embed
        if self.resample == "bicubic":
            return resample_bicubic(self.pos_embed, self.grid, tuple(grid), self.num_prefix_entries)
        return resample_abs_pos_embed(
            self.pos_embed, new_size=list(grid), old_size=list(self.grid), num_prefix_tokens=self.num_prefix_entries
        )

    def tokens(self, x, layout: TokenLayout):
        pe = self.table(layout.hw).to(x.dtype)
        skip = layout.num_prefix - self.num_prefix_entries  # prefix tokens without an entry
        if skip == 0:
            return x + pe
        return torch.cat([x[:, :skip], x[:, skip:] + pe], dim=1)

    def reset_parameters(self):
        trunc_normal_(self.pos_embed, std=self.std)

    def set_grid(self, grid):
        self.regrid_table("pos_embed", grid, self.table)

    def no_weight_decay(self):
        return {"pos_embed"}

    def convert_checkpoint(self, entries, source):
        """A checkpoint's `pos_embed` [1, E + S*S, C]: its prefix entries must be ours; another grid is resampled."""
        if not entries:
            raise CheckpointMismatch(
                f"the model's PE {source.pe_name!r} has a learned APE the checkpoint lacks; use a preset without 'ape'"
            )
        v = entries["pos_embed"]
        prefix = self._checkpoint_prefix(v.shape[1])
        if prefix != self.num_prefix_entries:
            fix = "no_embed_class=True" if prefix == 0 else "no_embed_class=False"
            raise CheckpointMismatch(
                f"the checkpoint's APE has {prefix} prefix entries, the model {self.num_prefix_entries}; "
                f"build it with {fix}"
            )
        side = math.isqrt(v.shape[1] - prefix)
        if (side, side) != self.grid:
            v = resample_abs_pos_embed(v, new_size=list(self.grid), old_size=[side, side], num_prefix_tokens=prefix)
        return {"pos_embed": v}

    def _checkpoint_prefix(self, num: int) -> int:
        """How many prefix entries a checkpoint's table of `num` rows has (0 or the host's prefix count)."""
        p = self.host.num_prefix
        if math.isqrt(num) ** 2 == num:
            return 0
        if p and math.isqrt(num - p) ** 2 == num - p:
            return p
        raise CheckpointMismatch(f"cannot tell the grid of a pos_embed with {num} entries (not a square grid + prefix)")

    @classmethod
    def absent_message(cls, key, source):
        return (
            f"the checkpoint has a learned APE ({key}) but the model's PE {source.pe_name!r} has none; "
            "use an *_ape preset (e.g. vit_s_ape, vit_s_rope2d_ape)"
        )


def sincos_2d(pos: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2D sin-cos embedding [N, dim] of (x, y) positions [N, 2]: [sin x, cos x, sin y, cos y] (MoCo v3)."""
    if dim % 4:
        raise ValueError(f"2D sin-cos needs a width divisible by 4, got {dim}")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32, device=pos.device) / quarter)
    ox = pos[:, 0:1].float() * omega
    oy = pos[:, 1:2].float() * omega
    return torch.cat([ox.sin(), ox.cos(), oy.sin(), oy.cos()], dim=1)


class SinCos2D(PosEncoding):
    """Fixed 2D sin-cos on patch tokens, computed from the layout's positions (works at any grid size)."""

    positive_options = ("temperature",)

    def __init__(self, host: PEHost, temperature: float = 10000.0):
        super().__init__(host)
        self.temperature = temperature
        self.dim = host.dim

    def tokens(self, x, layout: TokenLayout):
        pe = sincos_2d(layout.pos, self.dim, self.temperature).to(x.dtype)
        p = layout.num_prefix
        return torch.cat([x[:, :p], x[:, p:] + pe], dim=1) if p else x + pe
