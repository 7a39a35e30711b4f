"""CPE / PEG (Chu et al., CPVT): a conditional position encoding generated from the tokens themselves.

The kind is `cpe` (class `CPE`; the paper calls the module a PEG). After the chosen
blocks (default: the first block of every stage the host declares, i.e. block 0 of a ViT) the patch tokens are
reshaped to their grid [B, C, H, W] and x + DWConv3x3(x) replaces them (depthwise, with bias); prefix tokens (CLS,
registers) pass through unchanged. Zero padding at the borders is what gives the absolute-position cue, so it works
at any grid size and needs no APE.
Block i in `blocks` holds its conv (`blocks.{i}.attn.pos.cpe.weight` [C, 1, k, k] and `.bias` [C]; flat names, as
in checkpoints before each layer owned its state: `convs.{i}.weight`, `convs.{i}.bias`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layout.tokens import TokenLayout
from .base import PEHost, PosEncoding

__all__ = ["CPE", "grid_tokens", "tokens_from_grid"]


def grid_tokens(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Patch tokens [B, N, C] -> feature map [B, C, H, W] (raster order, x fastest), a channels-last view."""
    return x.reshape(x.shape[0], *hw, x.shape[2]).permute(0, 3, 1, 2)


def tokens_from_grid(x: torch.Tensor) -> torch.Tensor:
    """Feature map [B, C, H, W] -> tokens [B, H*W, C] (a view when x is channels-last)."""
    return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])


class CPE(PosEncoding):
    """x + DWConv(x) on the patch tokens after each block in `blocks`; width per block from host.layers[i].dim.
    blocks=None: after the first block of every stage (host.stage_starts; Twins' placement on hierarchical models)."""

    def __init__(self, host: PEHost, blocks: tuple[int, ...] | list[int] | int | None = None, kernel_size: int = 3):
        super().__init__(host)
        if blocks is None:
            blocks = host.stage_starts
        blocks = (blocks,) if isinstance(blocks, int) else tuple(blocks)
        bad = [i for i in blocks if not 0 <= i < host.depth]
        if bad or not blocks:
            raise ValueError(f"CPE blocks must be block indices in [0, {host.depth}), got {blocks}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"CPE kernel_size must be odd and positive (same-size output), got {kernel_size}")
        self.blocks = tuple(sorted(set(blocks)))
        self.kernel_size = kernel_size

    layer_names = {r"convs\.(?P<i>\d+)\.(?P<name>weight|bias)": "{name}"}

    def layer(self, i):
        d, k = self.host.layers[i].dim, self.kernel_size
        return nn.Conv2d(d, d, k, padding=k // 2, groups=d) if i in self.blocks else None

    def block(self, i: int, x: torch.Tensor, layout: TokenLayout, own=None) -> torch.Tensor:
        conv = own
        if conv is None:
            return x
        p = layout.num_prefix
        feat = grid_tokens(x[:, p:], layout.hw)  # [B, C, H, W]
        patches = tokens_from_grid(feat + conv(feat))  # [B, N, C]
        return torch.cat([x[:, :p], patches], dim=1) if p else patches
