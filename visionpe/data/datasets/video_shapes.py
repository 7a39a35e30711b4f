"""`video-shapes`: a procedural video set whose classes need temporal order and position, rendered at any size/length.

Each clip shows a red disk and a blue square. One of them moves first (during the first half of the clip), then the
other (during the second half), both in the same direction. The class is (which moves first) x (direction: right,
left, down, up) = 8 classes. Any single frame, or the frames as an unordered set, cannot tell the classes apart:
playing a clip backwards gives exactly a clip of the opposite direction with the other shape first
(`reverse_scene`). Scenes live in continuous time and [0, 1]^2 space, so the same item renders at any T x H x W.
"""

from __future__ import annotations

import torch

from ..registry import register_dataset
from ..splits import split_size
from .rendered import RenderedDataset, no_files, side_pair

__all__ = ["VideoShapes", "CLASS_NAMES", "DIRECTIONS", "render_scene", "reverse_scene", "video_shapes"]

DIRECTIONS = ("right", "left", "down", "up")
_STEP = {0: (1.0, 0.0), 1: (-1.0, 0.0), 2: (0.0, 1.0), 3: (0.0, -1.0)}  # (dx, dy), y grows downwards
ORDERS = ("red-first", "blue-first")
CLASS_NAMES = tuple(f"{o}-{d}" for o in ORDERS for d in DIRECTIONS)  # class = order * 4 + direction
COLOURS = ((0.9, 0.15, 0.1), (0.1, 0.3, 0.95))  # red disk, blue square
TRAVEL = 0.35  # distance each shape moves, as a fraction of the frame
MEAN, STD = 0.5, 0.25
DEFAULT_SIZES = {"train": 4000, "val": 800}


def render_scene(
    scene: dict, frames: int, resolution, noise: float = 0.0, generator=None, event_frames: int | None = None
) -> torch.Tensor:
    """A scene as a normalised clip [3, T, H, W]. Frame f samples time (f + 0.5) / T; the first mover moves during
    time [0, 1/2], the second during [1/2, 1]. With `event_frames` the frame rate is fixed instead: the event takes
    that many frames, centred in the clip, and the other frames show the still scene before and after it."""
    h, w = side_pair(resolution)
    span = frames if event_frames is None else int(event_frames)
    tau = (torch.arange(frames, dtype=torch.float32) + 0.5 - (frames - span) / 2) / span  # [T]
    progress = [(2 * tau).clamp(0, 1), (2 * tau - 1).clamp(0, 1)]  # first mover, second mover
    ys = ((torch.arange(h, dtype=torch.float32) + 0.5) / h).view(1, h, 1)
    xs = ((torch.arange(w, dtype=torch.float32) + 0.5) / w).view(1, 1, w)
    clip = torch.tensor(scene["bg"]).view(3, 1, 1, 1).expand(3, frames, h, w).clone()
    dx, dy = _STEP[scene["direction"]]
    for obj in (0, 1):  # red disk, then blue square drawn over it
        p = progress[0 if obj == scene["first"] else 1].view(frames, 1, 1)
        cx, cy = scene["start"][obj]
        cx, cy = cx + dx * scene["travel"] * p, cy + dy * scene["travel"] * p  # [T, 1, 1]
        r = scene["radius"]
        if obj == 0:
            inside = (xs - cx) ** 2 + (ys - cy) ** 2 <= r * r
        else:
            inside = ((xs - cx).abs() <= 0.85 * r) & ((ys - cy).abs() <= 0.85 * r)
        colour = torch.tensor(COLOURS[obj]).view(3, 1, 1, 1)
        clip = torch.where(inside.unsqueeze(0), colour, clip)
    if noise > 0:
        clip = clip + noise * torch.randn(clip.shape, generator=generator)
    return (clip - MEAN) / STD


def reverse_scene(scene: dict) -> dict:
    """The scene played backwards: shapes start where they ended, move the other way, in the other order."""
    dx, dy = _STEP[scene["direction"]]
    ends = [(x + dx * scene["travel"], y + dy * scene["travel"]) for x, y in scene["start"]]
    opposite = {0: 1, 1: 0, 2: 3, 3: 2}[scene["direction"]]
    first = 1 - scene["first"]
    return {**scene, "start": ends, "direction": opposite, "first": first, "target": first * 4 + opposite}


class VideoShapes(RenderedDataset, classes=CLASS_NAMES, default_sizes=DEFAULT_SIZES):
    """Clips [3, T, H, W] and their class; `render(i, resolution, frames)` draws item i at any size and length."""

    def __init__(self, split: str = "train", resolution=32, frames: int = 8, **draw):
        """draw: num_samples (default: the class's split sizes), seed, noise (see RenderedDataset)."""
        super().__init__(split, **draw)
        if frames < 2:
            raise ValueError(f"video-shapes needs at least 2 frames to show an order of motion, got {frames}")
        self.resolution = side_pair(resolution)
        self.frames = int(frames)

    def scene(self, index: int) -> dict:
        """The resolution- and length-free description of item `index` (classes cycle, so splits are balanced)."""
        u = torch.rand(9, generator=self._generator(index)).tolist()
        target = index % len(CLASS_NAMES)
        first, direction = divmod(target, len(DIRECTIONS))
        radius = 0.08 + 0.04 * u[0]
        travel = TRAVEL * (0.85 + 0.3 * u[1])
        margin = radius + 0.02
        dx, dy = _STEP[direction]
        starts = []
        for k in range(2):  # along the motion: room for the travel; across it: anywhere inside
            a, b = u[2 + 2 * k], u[3 + 2 * k]
            along = margin + (1 - 2 * margin - travel) * a
            along = along if dx + dy > 0 else 1 - along
            across = margin + (1 - 2 * margin) * b
            starts.append((along, across) if dx else (across, along))
        bg = [0.15 + 0.25 * v for v in u[6:9]]
        return dict(target=target, first=first, direction=direction, start=starts, radius=radius, travel=travel, bg=bg)

    def render(self, index: int, resolution=None, frames: int | None = None) -> tuple[torch.Tensor, int]:
        """Item `index` as a clip [3, T, H, W] (default length and size unless given) and its class."""
        frames = self.frames if frames is None else int(frames)
        res = self.resolution if resolution is None else side_pair(resolution)
        s = self.checked_scene(index)
        clip = render_scene(
            s, frames, res, self.noise, self._generator(index, salt=frames * 65537 + res[0] * 257 + res[1])
        )
        return clip, s["target"]

    def render_duration(self, index: int, resolution=None, frames: int | None = None) -> tuple[torch.Tensor, int]:
        """Item `index` as a clip of `frames` at the training frame rate: the event takes the dataset's clip length,
        centred, with the still scene before and after (a longer clip covers more time, not a slower event)."""
        frames = self.frames if frames is None else int(frames)
        res = self.resolution if resolution is None else side_pair(resolution)
        s = self.checked_scene(index)
        salt = frames * 65537 + res[0] * 257 + res[1]
        clip = render_scene(s, frames, res, self.noise, self._generator(index, salt=salt), event_frames=self.frames)
        return clip, s["target"]


@register_dataset("video-shapes", num_classes=len(CLASS_NAMES), in_chans=3, kind="video")
def video_shapes(
    split: str = "train",
    resolution=32,
    root: str | None = None,
    frames: int = 8,
    num_samples: int | None = None,
    seed: int = 0,
    noise: float = 0.05,
    num_train: int | None = None,
    num_val: int | None = None,
) -> VideoShapes:
    """8 classes (which shape moves first x direction) of clips [3, T, H, W] at any length and size; 4000 / 800
    items unless num_train / num_val (or num_samples, both splits) say otherwise."""
    no_files("video-shapes", root)
    return VideoShapes(
        split,
        resolution,
        frames,
        num_samples=split_size(split, num_samples, num_train, num_val),
        seed=seed,
        noise=noise,
    )
