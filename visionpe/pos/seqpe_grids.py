"""SeqPE on backbones whose layers attend over grids of their own (Swin's windows, CvT's stages).

A layer whose AttnSpec has a grid reads its positions in that grid's units (Swin: window-local 0..ws-1; CvT: its
stage's query grid) and takes that grid as its reference (interpolate mode, the transfer objective). Keys with a
layout of their own (CvT's stride-2 keys at the centres of the query cells they cover) read the query grid's PEs at
their position: bilinear between the four cells around it, the edge cell past the grid's border (for stride 2 the
mean of the covered cells inside the grid).
"""

from __future__ import annotations

import torch

from .base import PEHost

__all__ = ["default_max_position", "own_grids", "sample_cells", "transfer_grid"]


def own_grids(host: PEHost) -> bool:
    """True when the backbone gives every layer its own grid (Swin, CvT), False for one grid for all (ViT)."""
    return any(spec.grid is not None for spec in host.layers)


def layer_grid(host: PEHost, i: int) -> tuple[int, int]:
    """Layer i's reference grid: its own, else the model's."""
    grid = host.layers[i].grid
    return tuple(host.grid if grid is None else grid)


def transfer_grid(host: PEHost) -> tuple[int, int]:
    """The grid the transfer objective shifts: the largest of the layers' own grids (Swin: the window, CvT: the
    first stage's), else the model's."""
    if not own_grids(host):
        return tuple(host.grid)
    grids = [layer_grid(host, i) for i in range(host.depth)]
    return max(g[0] for g in grids), max(g[1] for g in grids)


def default_max_position(grid: tuple[int, int]) -> int:
    """The paper's 100 (2 digits), or the least power of ten that holds the transfer objective's shifted blocks
    (twice the grid's longer side) where 100 does not (CvT's first stage: 56 x 56 at 224 px -> 1000)."""
    need, m = 2 * max(grid), 100
    while m < need:
        m *= 10
    return m


def sample_cells(cells: torch.Tensor, grid: tuple[int, int], pos: torch.Tensor) -> torch.Tensor:
    """Bilinear reads of a grid's PEs cells [h * w, D] (raster order) at (x, y) positions pos [M, 2] in its cell
    units, clamped to the grid (border) -> [M, D]."""
    h, w = grid
    x, y = pos[:, 0].to(cells.dtype), pos[:, 1].to(cells.dtype)
    x0, y0 = x.floor(), y.floor()
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]

    def at(yy, xx):
        idx = yy.clamp(0, h - 1).long() * w + xx.clamp(0, w - 1).long()
        return cells[idx]

    top = at(y0, x0) * (1 - fx) + at(y0, x0 + 1) * fx
    bottom = at(y0 + 1, x0) * (1 - fx) + at(y0 + 1, x0 + 1) * fx
    return top * (1 - fy) + bottom * fy
