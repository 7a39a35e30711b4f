"""RADIO's cropped position embedding (CPE; Ranzinger et al., AM-RADIO, CVPR 2024, arXiv:2312.06709; rules read
from NVlabs/RADIO's `vit_patch_generator.py` and transformers' `models/radio`).

A learned table for a grid larger than the training grid (R x R). Training: each image reads its own random window
of the table, area fraction s^2 with s ~ U(sqrt(min_area), 1), aspect a = exp(U(-ln max_aspect, ln max_aspect)),
sides (s a, s / a) clamped to 1, offset uniform inside the table, sampled at H x W evenly spaced points
(`grid_sample`, bilinear, align_corners=True, zero padding); with probability `pos_dropout` an image's whole PE is
zeroed. Evaluation: the table resized bilinearly (align_corners=False) to m x m, m = max(H, W), then its top-left
H x W window. An input grid equal to the table's reads the table itself in both modes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_function
from torch import nn

from ..layout.tokens import TokenLayout, is_symbolic
from .base import PEHost, PosEncoding

__all__ = ["CroppedAPE", "radio_crop_grid", "radio_eval_table", "radio_train_pe", "window_sample"]

TABLE_SCALE = 4  # default table side: this many times the reference grid's longer side (visionpe's choice)


def radio_eval_table(img: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """RADIO's evaluation rule on a table image [1, C, R, R'] -> [1, C, H, W]: bilinear resize (align_corners=False)
    to max(H, W) a side, then the top-left H x W window (RADIO's last resize never applies: the resize is square).
    With symbolic sizes (torch.export, dynamic shapes) the same window is sampled directly (`window_sample`): a slice
    of a max-sized resize would pin the traced graph to the example's aspect."""
    h, w = grid
    if is_symbolic(grid):
        return window_sample(img, grid)
    m = max(h, w)
    return F.interpolate(img.float(), size=(m, m), mode="bilinear", align_corners=False)[..., :h, :w]


def window_sample(img: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The top-left H x W of an m x m bilinear resize (align_corners=False), m = max(H, W), as one `grid_sample`:
    output cell i of the resize reads the table at (i + 1/2) R / m - 1/2, clamped to the table (border padding),
    which is (2 i + 1) / m - 1 in grid_sample's align_corners=False coordinates."""
    h, w = grid
    m = torch.sym_max(h, w)
    xs = (2 * torch.arange(w, device=img.device, dtype=torch.float32) + 1) / m - 1
    ys = (2 * torch.arange(h, device=img.device, dtype=torch.float32) + 1) / m - 1
    where = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1)[None]  # [1, H, W, (x, y)]
    return F.grid_sample(img.float(), where, "bilinear", "border", align_corners=False)


def radio_crop_grid(batch: int, grid: tuple[int, int], min_area: float, max_aspect: float, device=None) -> torch.Tensor:
    """Random crop windows as `grid_sample` grids [B, H, W, 2] in [-1, 1] (x, y): per image a window of sides
    (s a, s / a) <= 1 (fractions of the table) at a uniform offset, sampled at H x W evenly spaced points."""
    h, w = grid
    lo = math.sqrt(min_area)
    scale = torch.rand(batch, 1, 1, device=device) * (1 - lo) + lo
    log_a = math.log(max_aspect)
    aspect = torch.exp(torch.rand(batch, 1, 1, device=device) * 2 * log_a - log_a)
    sides = torch.stack([scale * aspect, scale / aspect], dim=-1).clamp(0, 1)  # [B, 1, 1, 2]
    offset = torch.rand(batch, 1, 1, 2, device=device) * (1 - sides)
    ys, xs = torch.meshgrid(
        torch.linspace(0, 1, h, device=device), torch.linspace(0, 1, w, device=device), indexing="ij"
    )
    unit = torch.stack([xs, ys], dim=-1)[None]  # [1, H, W, 2]
    return (unit * sides + offset) * 2 - 1


@register_notrace_function  # FX: a graph leaf, so a traced model draws new crops at every call
def radio_train_pe(
    img: torch.Tensor, x: torch.Tensor, grid: tuple[int, int], min_area: float, max_aspect: float, dropout: float
) -> torch.Tensor:
    """The training PE [B, H*W, C] of a table image [1, C, R, R] for tokens x [B, ...]: one random crop per image
    (`radio_crop_grid`), each image's PE zeroed with probability `dropout`."""
    batch = x.shape[0]
    where = radio_crop_grid(batch, grid, min_area, max_aspect, img.device)
    out = F.grid_sample(img.float().expand(batch, -1, -1, -1), where, "bilinear", "zeros", align_corners=True)
    out = out.flatten(2).transpose(1, 2)
    if dropout > 0:
        out = out * (torch.rand(batch, 1, 1, device=out.device) > dropout)
    return out.to(x.dtype)


torch.fx.wrap("radio_train_pe")


class CroppedAPE(PosEncoding):
    """RADIO's CPE on patch tokens (prefix tokens get nothing, as in RADIO).

    max_grid: the table's side R (default: 4 x the reference grid's longer side; RADIO's models use 2048 px / patch
    16 = 128); pos_dropout (RADIO's 0.1), min_area (0.1) and max_aspect (4/3) of the training crops. `pos_embed`
    [1, R * R, C], drawn as randn * C^-1/2. The table does not follow the reference grid (timm's set_input_size).
    """

    positive_options = ("max_grid", "min_area", "max_aspect")

    def __init__(
        self,
        host: PEHost,
        max_grid: int | None = None,
        pos_dropout: float = 0.1,
        min_area: float = 0.1,
        max_aspect: float = 4 / 3,
    ):
        super().__init__(host)
        if not 0 <= pos_dropout < 1:
            raise ValueError(f"CroppedAPE pos_dropout is a probability in [0, 1), got {pos_dropout}")
        if not 0 < min_area <= 1 or max_aspect < 1:
            raise ValueError(f"CroppedAPE needs 0 < min_area <= 1 and max_aspect >= 1, got {min_area}, {max_aspect}")
        side = int(max_grid) if max_grid is not None else TABLE_SCALE * max(host.grid)
        self.grid = (side, side)  # the table's grid
        self.pos_dropout, self.min_area, self.max_aspect = float(pos_dropout), float(min_area), float(max_aspect)
        self.pos_embed = nn.Parameter(torch.empty(1, side * side, host.dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.pos_embed.normal_().mul_(self.host.dim**-0.5)

    def _image(self) -> torch.Tensor:
        return self.pos_embed.reshape(1, *self.grid, -1).permute(0, 3, 1, 2)

    def table(self, grid: tuple[int, int]) -> torch.Tensor:
        """The evaluation PE of an H x W grid: [1, H*W, C]."""
        if not is_symbolic(grid) and tuple(grid) == self.grid:
            return self.pos_embed
        return radio_eval_table(self._image(), tuple(grid)).flatten(2).transpose(1, 2).to(self.pos_embed.dtype)

    def tokens(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        grid = tuple(layout.hw)
        if not self.training:
            pe = self.table(grid).to(x.dtype)
        elif not is_symbolic(grid) and grid == self.grid:  # the table's own grid: no crop (RADIO)
            pe = radio_train_pe(self._image(), x, grid, 1.0, 1.0, self.pos_dropout)
        else:
            pe = radio_train_pe(self._image(), x, grid, self.min_area, self.max_aspect, self.pos_dropout)
        p = layout.num_prefix
        return torch.cat([x[:, :p], x[:, p:] + pe], dim=1) if p else x + pe

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}
