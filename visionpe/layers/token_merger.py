"""ViTAR's Adaptive Token Merger (ATM, Fan et al. 2024): any token grid merged down to a fixed G_h x G_w.

Each merge step partitions every axis into cells of at most two tokens and replaces each cell by one token:
query = the mean of the cell's tokens, keys/values = the cell's tokens (cross-attention, pre-norm), then an MLP;
the same weights serve every step. An axis longer than 2G is halved (an odd length gets one padding slot);
an axis in (G, 2G] goes to G in one step with cells of one or two tokens spread evenly (the padding slots of a
"pad to 2G" merge placed between tokens rather than at the end); an axis at G stays. Padding slots are masked out
of the mean and of the attention. From 1120 / 16 = 70: 70 -> 35 -> 18 -> 14.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from ..attention.backends import attend
from ..fx import fx_unsupported, is_fx_tracing

__all__ = ["AdaptiveTokenMerger", "merge_plan"]


def _cells(size: int, target: int) -> tuple[int, int]:
    """(cells, cell size) of one merge step along an axis of `size` tokens; (size, 1) when the axis is done."""
    if size > 2 * target:
        return -(-size // 2), 2
    if size > target:
        return target, 2
    return size, 1


def _axis_index(size: int, cells: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token index [cells, k] of each cell slot (`size` = the padding slot) and which slots are real."""
    t = torch.arange(cells, device=device)
    if cells == -(-size // 2):  # halving: cells (2t, 2t + 1), an odd size pads the last one
        start, end = 2 * t, (2 * t + 2).clamp(max=size)
    else:  # cells of one or two tokens spread evenly
        start, end = t * size // cells, (t + 1) * size // cells
    idx = start[:, None] + torch.arange(k, device=device)
    valid = idx < end[:, None]
    return torch.where(valid, idx, size), valid


def merge_plan(hw: tuple[int, int], grid: tuple[int, int]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The merge steps from a grid `hw` down to `grid`: ((cells, cell size) of the rows, of the columns) each."""
    h, w = hw
    if h < grid[0] or w < grid[1]:
        raise ValueError(
            f"the token merger reduces to {grid[0]} x {grid[1]} tokens but the input grid is only {h} x {w}; "
            "use a larger image or a smaller merger grid"
        )
    plan = []
    while (h, w) != tuple(grid):
        rows, cols = _cells(h, grid[0]), _cells(w, grid[1])
        plan.append((rows, cols))
        h, w = rows[0], cols[0]
    return plan


class AdaptiveTokenMerger(nn.Module):
    """Patch tokens [B, H, W, C] -> [B, G_h, G_w, C] by repeated cell cross-attention merges with shared weights."""

    def __init__(
        self,
        dim: int,
        grid: int | tuple[int, int],
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        act_layer: type[nn.Module] = nn.GELU,
        input_grid: tuple[int, int] | None = None,
    ):
        """grid: the output G (or (G_h, G_w)); input_grid: the reference input grid, checked at construction."""
        super().__init__()
        self.grid = (grid, grid) if isinstance(grid, int) else tuple(grid)
        if min(self.grid) < 1:
            raise ValueError(f"token merger grid must be at least 1 x 1, got {self.grid}")
        if input_grid is not None:
            merge_plan(tuple(input_grid), self.grid)  # raises when the merger grid is larger than the input
        if dim % num_heads:
            raise ValueError(f"token merger width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.norm_q = norm_layer(dim)
        self.norm_kv = norm_layer(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)

    def merge(self, x: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
        """One step: x [B, H, W, C] with (cells, cell size) per axis -> [B, cells_h, cells_w, C]."""
        B, H, W, C = x.shape
        idx_h, ok_h = _axis_index(H, *rows, "cpu")  # [Th, kh]; small, built on the host
        idx_w, ok_w = _axis_index(W, *cols, "cpu")  # [Tw, kw]
        (th, kh), (tw, kw) = rows, cols
        x = F.pad(x, (0, 0, 0, 1, 0, 1))  # a zero padding slot at index H (rows) and W (cols)
        cells = x[:, idx_h.to(x.device)][:, :, :, idx_w.to(x.device)]  # [B, Th, kh, Tw, kw, C]
        cells = cells.permute(0, 1, 3, 2, 4, 5).reshape(B * th * tw, kh * kw, C)  # [B*T, K, C]
        valid = (ok_h[:, None, :, None] & ok_w[None, :, None, :]).reshape(th * tw, kh * kw)  # [T, K]
        padded = th * kh != H or tw * kw != W  # cells partition each axis: slots beyond the tokens are padding
        valid = valid.to(x.device)
        weight = valid.to(x.dtype) / valid.sum(-1, keepdim=True)  # mean over the real tokens of a cell
        query = (cells.unflatten(0, (B, th * tw)) * weight[..., None]).sum(2).reshape(B * th * tw, 1, C)

        hd = C // self.num_heads
        q = self.q(self.norm_q(query)).reshape(-1, 1, self.num_heads, hd).transpose(1, 2)  # [B*T, h, 1, hd]
        k, v = self.kv(self.norm_kv(cells)).reshape(-1, kh * kw, 2, self.num_heads, hd).permute(2, 0, 3, 1, 4)
        mask = None
        if padded:  # padding slots take no attention
            mask = torch.zeros(valid.shape, dtype=x.dtype, device=x.device).masked_fill(~valid, float("-inf"))
            mask = mask.repeat(B, 1)[:, None, None, :]  # [B*T, 1, 1, K]
        out = attend(q, k, v, mask).transpose(1, 2).reshape(-1, 1, C)
        merged = query + self.proj(out)
        merged = merged + self.mlp(self.norm2(merged))
        return merged.reshape(B, th, tw, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_fx_tracing():
            fx_unsupported("ViTAR's token merger (its merge steps follow the input size)")
        for rows, cols in merge_plan(x.shape[1:3], self.grid):
            x = self.merge(x, rows, cols)
        return x
