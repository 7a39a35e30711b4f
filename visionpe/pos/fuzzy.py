"""Fuzzy positional encoding (ViTAR, Fan et al. 2024): a learned table sampled at jittered coordinates.

The table `pos_embed` [1, H0 * W0, C] covers the reference grid (H0, W0) (with ViTAR's token merger: the merged
G x G grid). Each patch token gets a reference coordinate in table units: its layout position with the layout's
span mapped onto [0, W0 - 1] x [0, H0 - 1] (align-corners; at the reference grid that is the position itself).
- training: every token's coordinate gets an independent offset U[-jitter, jitter] per axis (jitter 0.5), drawn
  once per forward and shared by the images of the batch; the PE is the bilinear sample of the table there
  (grid_sample, align_corners=True, border padding), so it stays within the range of the neighbouring entries;
- eval: no offset; at the reference grid the exact table values, elsewhere the bilinear resample.
Prefix tokens get no PE. The table has the layout of a learned APE without prefix entries (`no_embed_class`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function, resample_abs_pos_embed, trunc_normal_
from torch import nn

from ..layout.tokens import TokenLayout
from .base import PEHost, PosEncoding

__all__ = ["FuzzyPE", "jittered"]


@register_notrace_function  # FX: a graph leaf, so a traced model draws new offsets at every call
def jittered(coords: torch.Tensor, jitter: float, x: torch.Tensor) -> torch.Tensor:
    """coords + U[-jitter, jitter] per entry; x (the tokens) only ties the draw to the graph's input."""
    return coords.to(x.device) + (torch.rand(coords.shape, device=x.device, dtype=coords.dtype) * 2 - 1) * jitter


torch.fx.wrap("jittered")


class FuzzyPE(PosEncoding):
    """Learned table sampled bilinearly at (jittered in training) reference coordinates of the patch tokens."""

    def __init__(self, host: PEHost, jitter: float = 0.5, std: float = 0.02):
        super().__init__(host)
        if not 0 <= jitter <= 1:
            raise ValueError(f"fuzzy PE jitter is an offset in table cells and must be in [0, 1], got {jitter}")
        self.jitter = float(jitter)
        self.std = float(std)
        self.grid = tuple(host.grid)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], host.dim))
        trunc_normal_(self.pos_embed, std=std)

    def reference_coords(self, layout: TokenLayout) -> torch.Tensor:
        """(x, y) [N, 2] of the patch tokens in table units: the layout's span mapped onto the table's."""
        if layout.streams != 2:
            raise ValueError(f"fuzzy PE needs (x, y) positions, got a layout with {layout.streams} streams")
        pos = layout.pos
        lo, hi = pos.amin(0), pos.amax(0)
        extent = torch.tensor([self.grid[1] - 1, self.grid[0] - 1], dtype=pos.dtype, device=pos.device)
        span = hi - lo
        # a single row/column sits at the table's centre
        return torch.where(span > 0, (pos - lo) * extent / span.clamp(min=1e-6), extent / 2)

    def sample(self, coords: torch.Tensor) -> torch.Tensor:
        """Bilinear samples [1, N, C] of the table at (x, y) coords [N, 2] in table units (border-clamped)."""
        h0, w0 = self.grid
        extent = torch.tensor([max(w0 - 1, 1), max(h0 - 1, 1)], dtype=coords.dtype, device=coords.device)
        norm = coords / extent * 2 - 1  # align_corners=True: -1 and 1 are the centres of the corner entries
        table = self.pos_embed.transpose(1, 2).reshape(1, -1, h0, w0)  # [1, C, H0, W0]
        grid = norm[None, None].to(table.dtype)  # the table's precision (also float64 / bfloat16 models)
        out = F.grid_sample(table, grid, mode="bilinear", padding_mode="border", align_corners=True)
        return out[:, :, 0].transpose(1, 2)  # [1, N, C]

    def tokens(self, x, layout: TokenLayout):
        if not self.training and layout.grid == (1, *self.grid):
            pe = self.pos_embed  # the exact table values
        else:
            coords = self.reference_coords(layout)
            if self.training and self.jitter:
                coords = jittered(coords, self.jitter, x)
            pe = self.sample(coords)
        pe = pe.to(x.dtype)
        p = layout.num_prefix
        return torch.cat([x[:, :p], x[:, p:] + pe], dim=1) if p else x + pe

    def set_grid(self, grid):
        self.regrid_table("pos_embed", grid, self._resampled)

    def _resampled(self, grid) -> torch.Tensor:
        old, new = list(self.grid), list(grid)
        return resample_abs_pos_embed(self.pos_embed, new_size=new, old_size=old, num_prefix_tokens=0)

    def reset_parameters(self):
        trunc_normal_(self.pos_embed, std=self.std)

    def no_weight_decay(self):
        return {"pos_embed"}
