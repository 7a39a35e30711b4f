"""`image-text-shapes`: questions about the colour or the shape at a named position, answered by class.

An image holds a G x G board (G = 3 by default); every cell has a shape (disk, square, triangle) in a colour (red,
green, blue, yellow). The question is four token ids [ASK, COLOUR | SHAPE, ROW_r, COL_c]; the answer is the colour
(classes 0..3) or the shape (classes 4..6) in row r, column c. The same image gets different answers for different
positions, so a model must bind the text's position words to where visual tokens are. Items are
({"pixels": [3, H, W], "text_ids": long [4]}, class); rendered at any resolution, no download.
"""

from __future__ import annotations

import torch

from ..registry import register_dataset
from ..splits import split_size
from .rendered import RenderedDataset, no_files, side_pair

__all__ = ["ImageTextShapes", "CLASS_NAMES", "COLOURS", "SHAPES", "image_text_shapes", "question_ids", "vocab_size"]

COLOURS = {"red": (0.9, 0.15, 0.1), "green": (0.1, 0.75, 0.2), "blue": (0.1, 0.3, 0.95), "yellow": (0.95, 0.85, 0.1)}
SHAPES = ("disk", "square", "triangle")
CLASS_NAMES = tuple(COLOURS) + SHAPES  # colour answers 0..3, shape answers 4..6
PAD, ASK, ASK_COLOUR, ASK_SHAPE = 0, 1, 2, 3  # token ids; ROW_r = 4 + r, COL_c = 4 + G + c
MEAN, STD = 0.5, 0.25
DEFAULT_SIZES = {"train": 6000, "val": 1000}


def vocab_size(grid: int = 3) -> int:
    """Number of token ids the questions use for a G x G board."""
    return 4 + 2 * grid


def question_ids(kind: str, row: int, col: int, grid: int = 3) -> torch.Tensor:
    """[ASK, COLOUR | SHAPE, ROW_row, COL_col] as long [4]."""
    if kind not in ("colour", "shape"):
        raise ValueError(f"question kind must be 'colour' or 'shape', got {kind!r}")
    if not (0 <= row < grid and 0 <= col < grid):
        raise ValueError(f"cell ({row}, {col}) is outside a {grid} x {grid} board")
    return torch.tensor([ASK, ASK_COLOUR if kind == "colour" else ASK_SHAPE, 4 + row, 4 + grid + col])


def render_board(colours: list[int], shapes: list[int], grid: int, resolution, bg: float = 0.2) -> torch.Tensor:
    """The board as an image [3, H, W] in [0, 1]; cell i = row * G + col."""
    h, w = side_pair(resolution)
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h * grid  # in cell units
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w * grid
    row, col = ys.floor().clamp(max=grid - 1), xs.floor().clamp(max=grid - 1)
    v = (ys - row - 0.5).view(h, 1)  # cell-local coordinates in [-0.5, 0.5], y down
    u = (xs - col - 0.5).view(1, w)
    cell = (row.view(h, 1) * grid + col.view(1, w)).long()  # [H, W]
    shape = torch.tensor(shapes)[cell]
    colour = torch.tensor(list(COLOURS.values()))[torch.tensor(colours)[cell]]  # [H, W, 3]
    r = 0.32
    disk = u * u + v * v <= r * r
    square = (u.abs() <= 0.85 * r) & (v.abs() <= 0.85 * r)
    triangle = (v <= r) & (v >= -r) & (u.abs() <= (v + r) / 2)  # apex up
    inside = torch.where(shape == 0, disk, torch.where(shape == 1, square, triangle))
    img = torch.where(inside.unsqueeze(-1), colour, torch.full_like(colour, bg))
    return img.permute(2, 0, 1).contiguous()


class ImageTextShapes(RenderedDataset, classes=CLASS_NAMES, default_sizes=DEFAULT_SIZES):
    """({"pixels", "text_ids"}, class) items; `render(i, resolution)` draws item i at any size."""

    def __init__(self, split: str = "train", resolution=32, grid: int = 3, **draw):
        """draw: num_samples (default: the class's split sizes), seed, noise (see RenderedDataset)."""
        super().__init__(split, **draw)
        if grid < 2:
            raise ValueError(f"the board needs at least 2 x 2 cells for positions to matter, got grid={grid}")
        self.resolution = side_pair(resolution)
        self.grid = int(grid)
        self.vocab_size = vocab_size(self.grid)

    def scene(self, index: int) -> dict:
        """The board and the question of item `index` (resolution-free)."""
        g = self._generator(index)
        n = self.grid * self.grid
        colours = torch.randint(len(COLOURS), (n,), generator=g).tolist()
        shapes = torch.randint(len(SHAPES), (n,), generator=g).tolist()
        kind = "colour" if index % 2 == 0 else "shape"
        cell = int(torch.randint(n, (1,), generator=g))
        row, col = divmod(cell, self.grid)
        target = colours[cell] if kind == "colour" else len(COLOURS) + shapes[cell]
        return dict(colours=colours, shapes=shapes, kind=kind, row=row, col=col, target=target)

    def render(self, index: int, resolution=None) -> tuple[dict, int]:
        """Item `index` ({"pixels": [3, H, W], "text_ids": long [4]}, class) at `resolution` (default size if None)."""
        res = self.resolution if resolution is None else side_pair(resolution)
        s = self.checked_scene(index)
        img = render_board(s["colours"], s["shapes"], self.grid, res)
        if self.noise > 0:
            img = img + self.noise * torch.randn(img.shape, generator=self._generator(index, res[0] * 257 + res[1]))
        text = question_ids(s["kind"], s["row"], s["col"], self.grid)
        return {"pixels": (img - MEAN) / STD, "text_ids": text}, s["target"]


@register_dataset("image-text-shapes", num_classes=len(CLASS_NAMES), in_chans=3, kind="image_text")
def image_text_shapes(
    split: str = "train",
    resolution=32,
    root: str | None = None,
    grid: int = 3,
    num_samples: int | None = None,
    seed: int = 0,
    noise: float = 0.05,
    num_train: int | None = None,
    num_val: int | None = None,
) -> ImageTextShapes:
    """7 answer classes (4 colours, 3 shapes) to [ASK, COLOUR|SHAPE, ROW, COL] questions about a G x G board;
    6000 / 1000 items unless num_train / num_val (or num_samples, both splits) say otherwise."""
    no_files("image-text-shapes", root)
    return ImageTextShapes(
        split, resolution, grid, num_samples=split_size(split, num_samples, num_train, num_val), seed=seed, noise=noise
    )
