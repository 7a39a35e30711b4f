"""`fashion-mnist`: Zalando's 28 x 28 grey clothing images (10 classes) read from the standard IDX files.

By default the files come from Debian's `dataset-fashion-mnist` package (/usr/share/datasets/fashion-mnist); any folder
holding `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` works through `data.root`. Files are parsed by torchvision's
MNIST reader (a .gz is decompressed to a temporary file first), after checks that name a truncated or malformed file;
labels outside the 10 classes are an error. The whole split is read once into
a uint8 tensor (47 MB for train); items are resized to the requested resolution on the fly, so one dataset serves
every resolution (`render(i, resolution)`). Without per-item augmentation (evaluation, or the canvas dataset's items)
the split is resized in one call instead and kept for the last resolution asked for, up to RESIZED_CACHE_BYTES.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

from ..registry import register_dataset
from ..splits import split_kind, split_size

__all__ = ["FashionMNIST", "read_idx", "fashion_mnist", "DEFAULT_ROOT", "CLASS_NAMES"]

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
MEAN, STD = 0.2860, 0.3530  # over the training images
BLACK = (0.0 - MEAN) / STD  # a black pixel, normalised (the background of the images, and of canvases around them)
RESIZED_CACHE_BYTES = 128 * 2**20  # the most a split resized once may take (FashionMNIST._resized)


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """An IDX file (optionally gzipped) of unsigned bytes -> uint8 tensor of its shape, parsed by torchvision's
    MNIST reader after our checks (which name the file and what is wrong with it)."""
    path = Path(path)
    if path.suffix != ".gz":
        return _read_plain(path, path)
    with tempfile.TemporaryDirectory(prefix="visionpe-idx-") as tmp:  # torchvision reads plain files by path
        plain = Path(tmp) / path.stem
        try:
            with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise ValueError(f"{path} is truncated or not gzip data ({e}); download or copy it again") from None
        return _read_plain(plain, path)


def _read_plain(plain: Path, shown: Path) -> torch.Tensor:
    """Check the header of the uncompressed IDX file `plain` (errors name `shown`), then parse it with torchvision."""
    size = plain.stat().st_size
    with open(plain, "rb") as f:
        head = f.read(4)
        if len(head) < 4 or head[0] != 0 or head[1] != 0:
            raise ValueError(f"{shown} is not an IDX file (bad magic number)")
        if head[2] != 0x08:
            raise ValueError(f"{shown}: only unsigned-byte IDX files are supported, got type code {head[2]:#x}")
        raw = f.read(4 * head[3])
    dims = [int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(len(raw) // 4)]
    expected = math.prod(dims) if len(dims) == head[3] else -1
    if not 1 <= head[3] <= 3 or size - 4 - 4 * head[3] != expected:
        raise ValueError(
            f"{shown}: header says {dims} ({expected} bytes) in {head[3]} dimension(s) but the file holds "
            f"{size - 4 - len(raw)} bytes of data (1 to 3 dimensions are read)"
        )
    return read_sn3_pascalvincent_tensor(str(plain), strict=True)


def _find(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}[.gz] not found in {root}; install Debian's package "
        f"(apt-get install dataset-fashion-mnist, files land in {DEFAULT_ROOT}) or set data.root to a folder with "
        f"the four IDX files"
    )


@lru_cache(maxsize=4)
def _load(root: str, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = read_idx(_find(Path(root), FILES[kind][0]))
    labels = read_idx(_find(Path(root), FILES[kind][1])).long()
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(
            f"Fashion-MNIST {kind} files in {root} disagree: images {tuple(images.shape)}, labels {tuple(labels.shape)}"
        )
    bad = (labels < 0) | (labels >= len(CLASS_NAMES))
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"Fashion-MNIST {kind} labels in {root} hold {int(bad.sum())} value(s) outside the "
            f"{len(CLASS_NAMES)} classes 0..{len(CLASS_NAMES) - 1} (e.g. {int(labels[i])} at item {i}); "
            f"the labels file is corrupt or from another dataset"
        )
    return images, labels


class FashionMNIST(Dataset):
    """Items are (image [1, R, R] normalised, class). Training items are shifted by up to `shift` px and flipped."""

    num_classes = len(CLASS_NAMES)
    classes = CLASS_NAMES

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        resolution: int = 28,
        augment: bool = False,
        shift: int = 2,
        num_samples: int | None = None,
        crop_scale: tuple[float, float] | None = None,
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: float = 0.5,
    ):
        """crop_scale: random resized crops of this area range (the papers' protocol) in place of the shift."""
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(
                f"Fashion-MNIST directory {root} does not exist; install Debian's package (apt-get install "
                f"dataset-fashion-mnist) or set data.root to a folder with the IDX files"
            )
        self.images, self.labels = _load(str(root), split_kind(split))
        if num_samples is not None:
            self.images, self.labels = self.images[:num_samples], self.labels[:num_samples]
        self.resolution = int(resolution)
        self.augment = augment
        self.shift = int(shift)
        self.crop_scale, self.crop_ratio, self.hflip = crop_scale, crop_ratio, float(hflip)
        self._cache: tuple[int, torch.Tensor] | None = None  # (resolution, every item resized), see _resized

    def __len__(self) -> int:
        return len(self.labels)

    def render(self, index: int, resolution: int) -> tuple[torch.Tensor, int]:
        if not self._random_items():  # every item is a fixed function of its image: resize the split once
            items = self._resized(resolution)
            if items is not None:
                return items[index].clone(), int(self.labels[index])
        x = self.images[index].float().div_(255).unsqueeze(0)  # (1, 28, 28)
        if self.augment:  # random translation by zero-padding + crop, then a horizontal flip (global torch RNG)
            if self.crop_scale:  # random resized crop (torchvision's sampling, global torch RNG) straight to size
                from torchvision.transforms import RandomResizedCrop

                i, j, h, w = RandomResizedCrop.get_params(x, list(self.crop_scale), list(self.crop_ratio))
                x = F.interpolate(
                    x[None, :, i : i + h, j : j + w],
                    size=(resolution, resolution),
                    mode="bilinear",
                    align_corners=False,
                    antialias=resolution < max(h, w),
                )[0]
            elif self.shift:
                s = self.shift
                dx, dy = torch.randint(0, 2 * s + 1, (2,)).tolist()
                x = F.pad(x, (s, s, s, s))[:, dy : dy + 28, dx : dx + 28]
            if torch.rand(()) < self.hflip:
                x = x.flip(-1)
        return _normalised_at(x[None], resolution)[0], int(self.labels[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.render(index, self.resolution)

    def _random_items(self) -> bool:
        return self.augment and bool(self.crop_scale or self.shift or self.hflip > 0)

    def _resized(self, resolution: int) -> torch.Tensor | None:
        """The whole split at `resolution`, normalised as `render` does each item (`_normalised_at`); computed once
        and kept for the last resolution asked for. None when it would take more than RESIZED_CACHE_BYTES (the items
        are then resized one by one)."""
        if self._cache is not None and self._cache[0] == resolution:
            return self._cache[1]
        if len(self.images) * resolution * resolution * 4 > RESIZED_CACHE_BYTES:
            return None
        chunks = [
            _normalised_at(self.images[start : start + 4096].float().div_(255).unsqueeze(1), resolution)
            for start in range(0, len(self.images), 4096)
        ]
        self._cache = (resolution, torch.cat(chunks))
        return self._cache[1]


def _normalised_at(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """Images [N, 1, h, w] in [0, 1] resized to `resolution` (bilinear, antialiased when shrinking) and normalised:
    the last step of every item, whether rendered alone or with its whole split."""
    if resolution != x.shape[-1]:
        x = F.interpolate(
            x, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=resolution < x.shape[-1]
        )
    return (x - MEAN) / STD


# the factory's augmentation defaults, also read by garment_augmentation
SHIFT, HFLIP, RRC_SCALE, RRC_RATIO = 2, 0.5, (0.08, 1.0), (3 / 4, 4 / 3)


def garment_augmentation(options: dict, aug: dict) -> str:
    """fashion-mnist's training augmentation in words (also the garment's on the canvas datasets)."""
    if not options.get("augment", True):
        return "none"
    hflip = aug.get("hflip", HFLIP)
    parts = [f"flips (p={hflip})"] if hflip else []
    if options.get("crop", "shift") == "rrc":
        ratio = [round(r, 2) for r in aug.get("ratio", RRC_RATIO)]
        parts.insert(0, f"random resized crops (area {list(aug.get('scale', RRC_SCALE))}, aspect {ratio})")
    elif options.get("shift", SHIFT):
        parts.insert(0, f"random shifts of up to {options.get('shift', SHIFT)} px")
    return " and ".join(parts) or "none"


@register_dataset("fashion-mnist", num_classes=10, in_chans=1, kind="image", augmentation=garment_augmentation)
def fashion_mnist(
    split: str = "train",
    resolution: int = 28,
    root: str | None = None,
    training: bool = False,
    augment: bool = True,
    shift: int = SHIFT,
    num_train: int | None = None,
    num_val: int | None = None,
    crop: str = "shift",
    aug: dict | None = None,
) -> FashionMNIST:
    """Fashion-MNIST (60k train / 10k test, 10 classes, 1 channel) from IDX files; no download. num_train /
    num_val keep the first items of a split (quick runs)."""
    n = split_size(split, None, num_train, num_val)
    if crop not in ("shift", "rrc"):
        raise ValueError(f"fashion-mnist option crop must be 'shift' or 'rrc' (random resized crop), got {crop!r}")
    aug = aug or {}
    rrc = dict(crop_scale=tuple(aug.get("scale", RRC_SCALE)), crop_ratio=tuple(aug.get("ratio", RRC_RATIO)))
    return FashionMNIST(
        root or DEFAULT_ROOT,
        split,
        resolution,
        augment=augment and training,
        shift=shift,
        num_samples=n,
        hflip=aug.get("hflip", HFLIP),
        **(rrc if crop == "rrc" else {}),
    )
