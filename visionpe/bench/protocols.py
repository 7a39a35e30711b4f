"""Evaluation at any height x width, clip length, token budget, aspect ratio and position mode under a protocol
(upsample, fov, frames, duration, native, patch; docs/benchmark.md); the engine's evaluation loop does the counting."""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..data.multires import collate_to_resolution, resize_to
from ..data.native.loader import build_native_eval_loader
from ..data.native.plan import NativePlan
from ..data.share import Share
from ..engine import DistContext, evaluate_loader
from ..engine.setup import run_model
from ..models.flexi_patch import at_patch_size

CLIP_PROTOCOLS = ("frames", "duration")  # protocols that change a clip's length (`Point.frames`)


def size_label(size: tuple[int, int]) -> str:
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


class Point(NamedTuple):
    """Where a model is evaluated: protocol, frame size and clip length (0 for images and the default length).
    native: `tokens` per image, height = width = 0 at each image's own aspect ratio, else every image on a canvas of
    aspect ratio width:height (small whole numbers, e.g. 1, 3 for 3:1). patch: the base size's pixels at `patch` px
    patches (more or fewer tokens), 0 the model's own."""

    protocol: str
    height: int
    width: int
    frames: int = 0
    tokens: int = 0
    patch: int = 0  # patch protocol: the patch size in px (0: the model's own)

    @property
    def size(self) -> tuple[int, int]:
        return self.height, self.width


def point_fields(point: Point) -> dict:
    """The point as a row's fields; `patch` only on the patch protocol's points (other rows keep their keys)."""
    fields = point._asdict()
    if point.protocol != "patch":
        del fields["patch"]
    return fields


def point_label(point: Point) -> str:
    """'48' (upsample), 'fov 48', '16 f' (frames), '144 tok' (native), '3:1 64 tok' (native, one aspect ratio),
    'patch 8' (patch)."""
    if point.protocol == "native":
        return f"{point.width}:{point.height} {point.tokens} tok" if point.height else f"{point.tokens} tok"
    if point.protocol == "patch":
        return f"patch {point.patch}" if point.patch else "own patch"
    if point.protocol == "frames":
        return f"{point.frames} f"
    if point.protocol == "duration":
        return f"dur {point.frames} f"
    label = size_label(point.size)
    return f"fov {label}" if point.protocol == "fov" else label


class _View(Dataset):
    """The first `limit` items of an evaluation set (all of them: 0)."""

    def __init__(self, dataset: Dataset, limit: int):
        self.dataset, self.length = dataset, min(len(dataset), limit) if limit else len(dataset)

    def __len__(self) -> int:
        return self.length


class SizedView(_View):
    """(image [C, H, W] or clip [C, T, H, W], target) at `size` under `protocol`; `base` is the training size (what
    canvas datasets upsample from), `frames` the clip length."""

    def __init__(self, dataset: Dataset, size: tuple, limit: int = 0, protocol: str = "upsample", base=None, frames=0):
        if protocol == "fov" and not callable(getattr(dataset, "render_canvas", None)):
            raise ValueError(
                f"the fov protocol needs a dataset that places items on canvases (e.g. fashion-mnist-canvas); "
                f"{type(dataset).__name__} has no render_canvas"
            )
        if protocol in ("frames", "duration") and frames < 1:
            raise ValueError(f"the {protocol} protocol needs a clip length of at least 1, got {frames}")
        if protocol == "duration" and not callable(getattr(dataset, "render_duration", None)):
            raise ValueError(
                f"the duration protocol needs a video dataset that renders clips at a fixed frame rate (e.g. "
                f"video-shapes); {type(dataset).__name__} has no render_duration"
            )
        super().__init__(dataset, limit)
        self.size, self.protocol, self.base, self.frames = size, protocol, base, frames
        self.render, self.canvas = getattr(dataset, "render", None), getattr(dataset, "render_canvas", None)

    def _load(self, index: int):
        if self.protocol == "fov":
            return self.canvas(index, self.size)
        if self.protocol == "frames":
            return self.render(index, self.size, self.frames)
        if self.protocol == "duration":
            return self.dataset.render_duration(index, self.size, self.frames)
        if self.canvas is not None and self.base is not None and not getattr(self.dataset, "renders_detail", False):
            return self.canvas(index, self.base)  # a canvas dataset's render(R) is a field of view: resize the base
        return self.render(index, max(self.size)) if self.render else self.dataset[index]

    def __getitem__(self, index: int):
        """(input at the view's size, class, size, unreadable files), as the engine's evaluation items: its collate
        leaves out (and counts) an unreadable file's item, whose input is None."""
        x, y = self._load(index)
        skipped = tuple(self.dataset.pop_skipped()) if hasattr(self.dataset, "pop_skipped") else ()
        if isinstance(x, dict) and "pixels" in x and tuple(x["pixels"].shape[-2:]) != self.size:
            x, y = self.render(index, self.size)  # image-text items: draw the image at the size asked for
        elif isinstance(x, torch.Tensor):
            x = resize_to(x, self.size)
        return x, int(y), self.size, skipped

    def loader(self, batch_size: int, workers: int = 0) -> DataLoader:
        collate = partial(collate_to_resolution, collate_inputs=getattr(self.dataset, "collate_inputs", None))
        return DataLoader(self, batch_size=batch_size, shuffle=False, num_workers=workers, collate_fn=collate)


class NativeView(_View):
    """Items of a set (one with `render_size`, e.g. fashion-mnist-native, or square items) at a native point: each
    image resized to `point.tokens` patches of `patch` px keeping its own aspect ratio, or drawn on a canvas of the
    point's aspect ratio; one image per row, padded to the budget."""

    def __init__(self, dataset: Dataset, point: Point, patch: int, limit: int = 0, resolution: int = 32):
        if point.height and not callable(getattr(dataset, "render_size", None)):
            raise ValueError(
                f"aspect ratio {point_label(point)} needs a dataset that draws items at any height x width "
                f"(render_size, e.g. fashion-mnist-native); {type(dataset).__name__} has none"
            )
        super().__init__(dataset, limit)
        self.point, self.patch, self.resolution = point, int(patch), int(resolution)
        own = getattr(dataset, "native_size", None)
        self.native_size = own if callable(own) and not point.height else self._size
        self.render_size, self.render = getattr(dataset, "render_size", None), getattr(dataset, "render", None)

    def _size(self, index: int) -> tuple[int, int]:
        """The point's aspect ratio (in units large enough for the budget's rounding), else the square size."""
        return (self.point.height * 1000, self.point.width * 1000) if self.point.height else (self.resolution,) * 2

    def __getitem__(self, index: int):
        return self.dataset[index]

    def loader(self, batch_size: int, workers: int = 0) -> DataLoader:
        tokens = self.point.tokens
        plan = NativePlan(self.patch, "padded", (tokens,), tokens * batch_size, tokens, 1)
        return build_native_eval_loader(self, plan, tokens, batch_size, self.resolution, Share(workers))


def view_of(evals: dict, point: Point, base: tuple[int, int], limit: int = 0, patch: int | None = None):
    """The inputs of one point: upsample reads the set built for its size, the others the base size's."""
    if point.protocol == "native":
        return NativeView(evals[max(base)], point, patch or 16, limit, max(base))
    if point.protocol in ("upsample", "patch"):  # patch: the base size's pixels, the model at another patch
        return SizedView(evals[max(point.size)], point.size, limit, "upsample", base)
    return SizedView(evals[max(base)], point.size, limit, point.protocol, base, point.frames)


def first_inputs(view: SizedView | NativeView, n: int):
    """The model inputs of the view's first n items as one batch (a tensor or a dict of tensors)."""
    return next(iter(view.loader(n))).inputs


def has_position_modes(model: nn.Module) -> bool:
    """Whether the model takes test-time position modes (vit: extrapolate, interpolate, ntk, yarn; vivit, mm:
    extrapolate, ntk, yarn, riflex); models with windowed or convolutional positions have one, and run as they are."""
    return len(getattr(model, "position_modes", None) or ()) > 1


def set_position_mode(model: nn.Module, mode: str) -> None:
    """A mode the model lacks is a ValueError that names its modes."""
    if has_position_modes(model):
        if mode not in model.position_modes:
            raise ValueError(f"has no position mode {mode!r} (its modes: {', '.join(model.position_modes)})")
        model.position_mode = mode


@torch.no_grad()
def modes_agree(model: nn.Module, x, modes: list[str]) -> bool:
    """Whether every mode gives the first mode's logits on `x` (e.g. a learned APE, which is resampled to the grid
    either way, or NoPE/CPE/LePE, which read no coordinates): then one evaluation serves all."""
    if not has_position_modes(model):
        return True
    was_training, mode = model.training, model.position_mode
    model.eval()
    try:
        outs = []
        for m in modes:
            set_position_mode(model, m)
            outs.append(run_model(model, x))
    finally:
        model.position_mode = mode
        model.train(was_training)
    return all(torch.allclose(outs[0], o, rtol=1e-5, atol=1e-6) for o in outs[1:])


def evaluate_view(model: nn.Module, view, mode: str, batch_size: int, device, amp, workers: int = 0) -> dict:
    """{'top1', 'top5', 'loss', 'images'} of `model` on a view (any protocol) in position `mode` (amp: a dtype or
    None)."""
    set_position_mode(model, mode)
    return evaluate_loader(model, view.loader(batch_size, workers), DistContext(device=device), amp)


def evaluate_point(model: nn.Module, view, point: Point, mode: str, batch_size: int, device, amp, workers=0) -> dict:
    """`evaluate_view` at a point; the patch protocol's at its patch size (the stem's kernel PI-resized, FlexiViT)."""
    patch = at_patch_size(model, point.patch) if point.protocol == "patch" and point.patch else nullcontext()
    with patch:
        return evaluate_view(model, view, mode, batch_size, device, amp, workers)


def row_point(row: dict) -> Point:
    return Point(row["protocol"], row["height"], row["width"], row["frames"], row.get("tokens", 0), row.get("patch", 0))
