"""ImageNet-style folders, `root/<split>/<class>/*.jpg`, through timm's create_dataset and create_transform.

The split folder may use any of timm's synonyms (train/training, val/valid/validation/eval/evaluation). Transforms
come from timm (RandomResizedCrop, RandAugment, random erasing for training; resize + centre crop for evaluation), one
per resolution, built when first asked for, so one dataset serves every resolution (`render(i, resolution)`).
An unreadable or corrupt file is replaced by the next readable one and reported through `pop_skipped()`; the engine
sums those reports and warns once per epoch with the count.
"""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_dataset, create_transform
from torch.utils.data import Dataset

from .registry import register_dataset
from .splits import EVAL_SPLITS, TRAIN_SPLITS, split_kind

__all__ = ["ImageFolderDataset", "SkippedImagesWarning", "image_folder", "find_split_dir", "MAX_CONSECUTIVE_FAILURES"]


class SkippedImagesWarning(UserWarning):
    """Some image files could not be read and were replaced by the next readable one."""


MAX_CONSECUTIVE_FAILURES = 50  # more unreadable files in a row than this means the folder itself is broken
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def find_split_dir(root: str | os.PathLike, split: str) -> Path:
    """`root/<split>` or the first existing synonym; a clear error naming what is there otherwise."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"data directory {root} does not exist; set data.root to a folder with train/ and val/")
    names = [split] + [s for s in (TRAIN_SPLITS if split_kind(split) == "train" else EVAL_SPLITS) if s != split]
    for name in names:
        if (root / name).is_dir():
            return root / name
    present = sorted(p.name for p in root.iterdir() if p.is_dir())
    raise FileNotFoundError(
        f"no {split!r} folder under {root} (looked for {', '.join(names)}); found folders {present or 'none'}. "
        f"Expected the layout {root}/{split}/<class>/<image>"
    )


class ImageFolderDataset(Dataset):
    """A timm ImageDataset with per-resolution timm transforms and skipping of unreadable files."""

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        resolution: int = 224,
        training: bool = False,
        class_map: dict | None = None,
        transform_kwargs: dict | None = None,
    ):
        split_dir = find_split_dir(root, split)
        try:
            self.base = create_dataset(
                "",
                root=str(split_dir),
                split=split,
                search_split=False,
                class_map=dict(class_map) if class_map else None,
            )
        except RuntimeError as e:  # timm: "Found 0 images in subfolders of ..."
            raise FileNotFoundError(
                f"{split_dir} holds no images in class folders; expected {split_dir}/<class>/<image> ({e})"
            ) from None
        self.class_to_idx = dict(self.base.reader.class_to_idx)
        if "" in self.class_to_idx or not self.class_to_idx:
            raise ValueError(
                f"{split_dir} has images outside class folders; put each class in its own subfolder "
                f"({split_dir}/<class>/<image>)"
            )
        self.classes = sorted(self.class_to_idx, key=self.class_to_idx.get)
        self.num_classes = len(self.classes)
        self.split_dir = split_dir
        self.resolution = int(resolution)
        self.training = training
        self.transform_kwargs = dict(transform_kwargs or {})
        self._transforms: dict[int, object] = {}
        self._skipped: list[str] = []

    def __len__(self) -> int:
        return len(self.base)

    def transform(self, resolution: int):
        if resolution not in self._transforms:
            self._transforms[resolution] = create_transform(
                (3, resolution, resolution), is_training=self.training, **self.transform_kwargs
            )
        return self._transforms[resolution]

    def _open(self, index: int):
        f, target = self.base.reader[index]
        try:
            img = Image.open(f)
            img = img.convert("RGB")  # decodes the pixels: truncated files fail here, not in the transform
        finally:
            if hasattr(f, "close"):
                f.close()
        return img, target

    def render(self, index: int, resolution: int):
        n = len(self.base)
        for attempt in range(MAX_CONSECUTIVE_FAILURES):
            i = (index + attempt) % n
            try:
                img, target = self._open(i)
                return self.transform(resolution)(img), target
            except DECODE_ERRORS:
                self._skipped.append(str(self.base.filename(i, absolute=True)))
        raise RuntimeError(
            f"{MAX_CONSECUTIVE_FAILURES} unreadable images in a row from index {index} in "
            f"{self.split_dir}, e.g. {self._skipped[-1]}; check the folder"
        )

    def __getitem__(self, index: int):
        return self.render(index, self.resolution)

    def pop_skipped(self) -> list[str]:
        """Paths skipped since the last call (per process: the loader reports them with each batch)."""
        skipped, self._skipped = self._skipped, []
        return skipped


@register_dataset("imagefolder", num_classes=None, in_chans=3, kind="image")
def image_folder(
    split: str = "train",
    resolution: int = 224,
    root: str | None = None,
    training: bool = False,
    class_map: dict | None = None,
    aug: dict | None = None,
    mean=None,
    std=None,
    interpolation: str | None = None,
    crop_pct: float | None = None,
) -> ImageFolderDataset:
    """Any `root/<split>/<class>/*` folder (the number of classes is read from the folders)."""
    if not root:
        raise ValueError("image folders need data.root, a folder with train/<class>/* and val/<class>/*")
    aug = dict(aug or {})
    kwargs = dict(
        mean=tuple(mean or IMAGENET_DEFAULT_MEAN),
        std=tuple(std or IMAGENET_DEFAULT_STD),
        interpolation=interpolation or "bicubic",
        crop_pct=crop_pct,
    )
    if training:
        for key in ("auto_augment", "re_prob", "re_mode", "re_count", "color_jitter", "hflip", "vflip"):
            if key in aug and aug[key] is not None:
                kwargs[key] = aug[key]
        for key in ("scale", "ratio"):
            if aug.get(key) is not None:
                kwargs[key] = tuple(aug[key])
    return ImageFolderDataset(root, split, resolution, training=training, class_map=class_map, transform_kwargs=kwargs)


@register_dataset("imagenet", num_classes=1000, in_chans=3, kind="image")
def imagenet(
    split: str = "train",
    resolution: int = 224,
    root: str | None = None,
    training: bool = False,
    class_map: dict | None = None,
    aug: dict | None = None,
    mean=None,
    std=None,
    interpolation: str | None = None,
    crop_pct: float | None = None,
) -> ImageFolderDataset:
    """ImageNet-1k in the usual `root/train/n01440764/*.JPEG`, `root/val/n01440764/*.JPEG` layout."""
    ds = image_folder(split, resolution, root, training, class_map, aug, mean, std, interpolation, crop_pct)
    if ds.num_classes != 1000 and not class_map:
        raise ValueError(
            f"{ds.split_dir} has {ds.num_classes} class folders, ImageNet-1k has 1000; use "
            f"data.name=imagefolder for other folders"
        )
    return ds
