"""Evaluation at any height x width (square or not) in a chosen test-time position mode.

The engine's evaluation loop (`visionpe.engine.evaluate_loader`) does the counting; this file only brings the
evaluation images to the size asked for: datasets that render any resolution draw each item at max(H, W) and are
resized to H x W (a stretched aspect ratio, the image content unchanged), others are resized from their own size.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..data.multires import Batch
from ..engine import DistContext, evaluate_loader

__all__ = [
    "SizedView",
    "parse_size",
    "size_label",
    "has_position_modes",
    "set_position_mode",
    "modes_agree",
    "evaluate_size",
]


def parse_size(value) -> tuple[int, int]:
    """28 -> (28, 28); '28x56' or [28, 56] -> (28, 56) (height, width)."""
    if isinstance(value, int) and not isinstance(value, bool):
        h = w = value
    elif isinstance(value, str) and "x" in value.lower():
        parts = value.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"a size is H or HxW in pixels (e.g. 28 or 28x56), got {value!r}")
        h, w = (int(p) for p in parts)
    elif isinstance(value, str) and value.strip().isdigit():
        h = w = int(value)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        h, w = (int(v) for v in value)
    else:
        raise ValueError(f"a size is H or HxW in pixels (e.g. 28 or 28x56), got {value!r}")
    if h <= 0 or w <= 0:
        raise ValueError(f"sizes must be positive, got {value!r}")
    return h, w


def size_label(size: tuple[int, int]) -> str:
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


class SizedView(Dataset):
    """The first `limit` items of an evaluation set as (image [C, H, W], target)."""

    def __init__(self, dataset: Dataset, size: tuple[int, int], limit: int = 0):
        self.dataset, self.size = dataset, size
        self.render = getattr(dataset, "render", None)
        self.length = min(len(dataset), limit) if limit else len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        h, w = self.size
        x, y = self.render(index, max(h, w)) if self.render else self.dataset[index]
        if not isinstance(x, torch.Tensor) or x.ndim != 3:
            raise TypeError(
                f"the extrapolation benchmark evaluates images [C, H, W]; the dataset gave "
                f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}"
            )
        if tuple(x.shape[-2:]) != (h, w):
            shrink = h < x.shape[-2] or w < x.shape[-1]
            x = F.interpolate(x[None].float(), size=(h, w), mode="bilinear", align_corners=False, antialias=shrink)[0]
        return x, int(y)


def _collate(items, size: tuple[int, int]) -> Batch:
    xs, ys = zip(*items)
    return Batch(torch.stack(xs), torch.as_tensor(ys), size[0], ())


def loader(view: SizedView, batch_size: int, workers: int = 0) -> DataLoader:
    return DataLoader(
        view, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=partial(_collate, size=view.size)
    )


def has_position_modes(model: nn.Module) -> bool:
    return callable(getattr(model, "set_position_mode", None))


def set_position_mode(model: nn.Module, mode: str) -> None:
    """Models without test-time position modes (windowed or convolutional positions) run as they are."""
    if has_position_modes(model):
        model.set_position_mode(mode)


@torch.no_grad()
def modes_agree(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether the two position modes give the same logits on `x` (e.g. a learned APE, which is resampled to the
    grid either way, or NoPE/CPE/LePE, which read no coordinates): then one evaluation serves both."""
    if not has_position_modes(model):
        return True
    was_training, mode = model.training, getattr(model, "position_mode", "extrapolate")
    model.eval()
    try:
        model.set_position_mode("extrapolate")
        a = model(x)
        model.set_position_mode("interpolate")
        b = model(x)
    finally:
        model.set_position_mode(mode)
        model.train(was_training)
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def evaluate_size(
    model: nn.Module,
    dataset: Dataset,
    size: tuple[int, int],
    mode: str,
    limit: int,
    batch_size: int,
    device: torch.device,
    amp: torch.dtype | None,
    workers: int = 0,
) -> dict:
    """{'top1', 'top5', 'loss', 'images'} of `model` on the first `limit` items at `size` in position `mode`."""
    set_position_mode(model, mode)
    return evaluate_loader(
        model, loader(SizedView(dataset, size, limit), batch_size, workers), DistContext(device=device), amp
    )
