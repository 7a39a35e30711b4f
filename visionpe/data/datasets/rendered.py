"""What the drawn datasets (synthetic-shapes, image-text-shapes, video-shapes) share: a split of a given size, a
seed and pixel noise, every item drawn from its own generator (so any item renders alike at any size, in any order,
in any worker)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..splits import split_kind

__all__ = ["RenderedDataset", "no_files", "side_pair"]


def side_pair(resolution) -> tuple[int, int]:
    """(H, W) of a resolution given as one side or a pair; a clear error unless both are positive."""
    h, w = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
    if h < 1 or w < 1:
        raise ValueError(f"resolution must be positive, got {resolution!r}")
    return int(h), int(w)


def no_files(name: str, root: str | None) -> None:
    """The one-line error of a generated dataset given a data root."""
    if root:
        raise ValueError(f"{name} is generated, it reads no files; drop data.root (got {root!r})")


class RenderedDataset(Dataset):
    """A split of `num_samples` drawn items (default: the class's `default_sizes` of the split kind). A subclass
    describes item i in `scene(i)`, draws it in `render(i, resolution)` and names its classes and split sizes in
    its class line:
    `class Shapes(RenderedDataset, classes=CLASS_NAMES, default_sizes={"train": 5000, "val": 1000})`."""

    classes: tuple[str, ...] = ()
    num_classes = 0
    default_sizes: dict[str, int] = {"train": 5000, "val": 1000}

    def __init_subclass__(cls, classes: tuple[str, ...] = (), default_sizes: dict[str, int] | None = None, **kw):
        super().__init_subclass__(**kw)
        cls.classes, cls.num_classes = tuple(classes), len(classes)
        cls.default_sizes = default_sizes or cls.default_sizes

    def __init__(self, split: str, num_samples: int | None = None, seed: int = 0, noise: float = 0.05):
        kind = split_kind(split)
        self.split_id = 0 if kind == "train" else 1
        self.num_samples = int(num_samples if num_samples is not None else self.default_sizes[kind])
        if self.num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {self.num_samples}")
        self.seed = int(seed)
        self.noise = float(noise)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        """Item `index` at the dataset's own size (a subclass sets `resolution` and draws in `render`)."""
        return self.render(index, self.resolution)

    def checked_scene(self, index: int) -> dict:
        """The resolution-free description of item `index` (the subclass's `scene`); an IndexError outside the
        split."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        return self.scene(index)

    def _generator(self, index: int, salt: int = 0) -> torch.Generator:
        """The generator of item `index` (salt: another stream of the same item, e.g. its noise at one size)."""
        return torch.Generator().manual_seed(((self.seed * 2 + self.split_id) * 1_000_003 + index) * 7919 + salt)
