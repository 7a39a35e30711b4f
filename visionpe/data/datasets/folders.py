"""ImageNet-style folders, `root/<split>/<class>/*.jpg`, read by folder_scan.py, transformed by timm's create_transform.

The split folder may use any of timm's synonyms (train/training, val/valid/validation/eval/evaluation). Transforms
come from timm (RandomResizedCrop, RandAugment, random erasing for training; resize + centre crop for evaluation), one
per resolution, built when first asked for, so one dataset serves every resolution (`render(i, resolution)`).
Native-aspect batches (data.native) read `native_size(i)` (from the file's header) and `render_size(i, (H, W))`
(an aspect-ratio crop and the same colour options, data/native/folder_items.py).

Pixels are read as they look (`pixels.py`): 16-bit and float images are scaled to 8 bits, EXIF rotation is applied.
An unreadable or corrupt file is reported through `pop_skipped()`: in a training split it is replaced by the next
readable one (batches keep their size), in an evaluation split it is left out (the item's input is None and the
collate drops it), so evaluation counts only the images it saw. The engine warns with the counts. A class folder of an
evaluation split that the training split does not have is an error, or dropped and counted with drop_unknown_classes.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections import Counter
from pathlib import Path

from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, ImageDataset, create_transform
from torch.utils.data import Dataset

from ..native.folder_items import NativeFolderTransform, UnreadableImageError, header_size
from ..pixels import DECODE_ERRORS, to_rgb
from ..registry import register_dataset
from ..splits import EVAL_SPLITS, TRAIN_SPLITS, split_kind
from .folder_scan import CleanFolderReader, nfc, scan_image_folder

__all__ = [
    "ImageFolderDataset",
    "SkippedImagesWarning",
    "UnknownClassesWarning",
    "image_folder",
    "find_split_dir",
    "MAX_CONSECUTIVE_FAILURES",
    "transform_kwargs",
]


class SkippedImagesWarning(UserWarning):
    """Some image files could not be read (replaced by the next readable one in training, left out in evaluation)."""


class UnknownClassesWarning(UserWarning):
    """Images of class folders the training split does not have were dropped (drop_unknown_classes=True)."""


MAX_CONSECUTIVE_FAILURES = 50  # more unreadable files in a row than this means the folder itself is broken


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
        drop_unknown_classes: bool = False,
    ):
        split_dir = find_split_dir(root, split)
        self.dropped_unknown = _check_classes(split_dir, class_map, drop_unknown_classes) if class_map else 0
        # links followed without loops, hidden folders skipped, NFC class names: see folder_scan.py
        reader = CleanFolderReader(split_dir, dict(class_map) if class_map else None)
        self.base = ImageDataset(str(split_dir), reader=reader)
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
        self.replace_unreadable = training  # evaluation leaves unreadable files out instead
        self.transform_kwargs = dict(transform_kwargs or {})
        self._transforms: dict[int, object] = {}
        self._skipped: list[str] = []
        self._native: NativeFolderTransform | None = None
        self._sizes: list[tuple[int, int] | None] = [None] * len(self.base)  # header sizes, read once per process

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
            img = to_rgb(Image.open(f))  # decodes the pixels: truncated files fail here, not in the transform
        finally:
            if hasattr(f, "close"):
                f.close()
        return img, target

    def render(self, index: int, resolution: int):
        """(image tensor, class); in an evaluation split an unreadable file gives (None, class)."""
        n = len(self.base)
        if not self.replace_unreadable:
            try:
                img, target = self._open(index)
            except DECODE_ERRORS:
                self._skipped.append(str(self.base.filename(index, absolute=True)))
                return None, self.base.reader.samples[index][1]
            return self.transform(resolution)(img), target
        for attempt in range(min(MAX_CONSECUTIVE_FAILURES, n)):
            i = (index + attempt) % n
            try:
                img, target = self._open(i)
                return self.transform(resolution)(img), target
            except DECODE_ERRORS:
                self._skipped.append(str(self.base.filename(i, absolute=True)))
        raise ValueError(
            f"{min(MAX_CONSECUTIVE_FAILURES, n)} unreadable images in a row from index {index} in "
            f"{self.split_dir} ({'every file' if n <= MAX_CONSECUTIVE_FAILURES else 'the folder looks broken'}), "
            f"e.g. {self._skipped[-1]}; check that the files are images"
        )

    def __getitem__(self, index: int):
        return self.render(index, self.resolution)

    def native_size(self, index: int) -> tuple[int, int]:
        """(h, w) of image `index` as it looks, from its file's header (read once per process)."""
        if self._sizes[index] is None:
            self._sizes[index] = header_size(self.base.reader.samples[index][0])
        return self._sizes[index]

    def render_size(self, index: int, size: tuple[int, int]):
        """(image [C, H, W], class): image `index` drawn at `size` (H, W) for native-aspect batches (training: a
        random crop of that aspect ratio and the colour options; evaluation: the whole image), see
        data/native/folder_items.py. An unreadable file is a one-line error naming it (a packed row's sizes are
        fixed)."""
        if self._native is None:
            self._native = NativeFolderTransform(self.transform_kwargs, self.training)
        img, target = self._decoded(index)
        return self._native(img, size), target

    def native_item(self, index: int):
        """(PIL image, class): image `index` whole, decoded to RGB: what timm's NaFlex loader (data.native.loader=timm)
        crops, flips, colours, normalises and erases itself, as it does for timm's own folders (timm_naflex.py)."""
        return self._decoded(index)

    def _decoded(self, index: int):
        try:
            return self._open(index)
        except DECODE_ERRORS as e:
            path = self.base.filename(index, absolute=True)
            raise UnreadableImageError(
                f"cannot decode image {path} ({type(e).__name__}: {e}); remove or replace the file"
            ) from None

    def pop_skipped(self) -> list[str]:
        """Paths skipped since the last call (per process: the loader reports them with each batch)."""
        skipped, self._skipped = self._skipped, []
        return skipped


def _check_classes(split_dir: Path, class_map: dict, drop: bool) -> int:
    """Images in class folders that `class_map` (the training split's classes) lacks: an error, or their count."""
    samples, found = scan_image_folder(split_dir)
    name = {i: c for c, i in found.items()}
    known = {nfc(str(c)) for c in class_map}
    unknown = Counter(name[t] for _, t in samples if name[t] not in known)
    if not unknown:
        return 0
    names = ", ".join(f"{c!r} ({n} images)" for c, n in sorted(unknown.items())[:5])
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    if not drop:
        raise ValueError(
            f"{split_dir} has class folder(s) the training split does not have: {names}{more}; the model cannot "
            f"predict them. Remove them, or set data.options.drop_unknown_classes=true to leave them out"
        )
    n = sum(unknown.values())
    warnings.warn(
        f"{split_dir}: left out {n} image(s) of {len(unknown)} class folder(s) not in the training split: "
        f"{names}{more} (data.options.drop_unknown_classes=true)",
        UnknownClassesWarning,
        stacklevel=2,
    )
    return n


def folder_augmentation(options: dict, aug: dict) -> str:
    """timm's training transforms with the aug settings, in words."""
    return _crops(aug, "random resized crops (area {scale}, aspect {ratio})") + " (timm's transforms)"


def folder_native_augmentation(options: dict, aug: dict) -> str:
    """The native route's crops (folder_native.NativeFolderTransform), then timm's colour transforms, in words."""
    return _crops(aug, "random crops (area {scale}, aspect the image's own x {ratio}) resized to the item's size")


def _crops(aug: dict, crop: str) -> str:
    ratio = [round(r, 2) for r in aug.get("ratio") or (3 / 4, 4 / 3)]
    extra = [f"{k}={aug[k]}" for k in ("auto_augment", "re_prob", "color_jitter") if aug.get(k)]
    text = (
        crop.format(scale=list(aug.get("scale") or (0.08, 1.0)), ratio=ratio)
        + f" and flips (p={aug.get('hflip', 0.5)})"
    )
    return text + (f", {', '.join(extra)}" if extra else "")


@register_dataset(
    "imagefolder", num_classes=None, in_chans=3, augmentation=folder_augmentation,
    native_augmentation=folder_native_augmentation, timm_transforms=True,
)  # fmt: skip
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
    drop_unknown_classes: bool = False,
) -> ImageFolderDataset:
    """Any `root/<split>/<class>/*` folder (the number of classes is read from the folders). An evaluation class
    folder that training lacks is an error unless drop_unknown_classes (then its images are left out, counted)."""
    if not root:
        raise ValueError("image folders need data.root, a folder with train/<class>/* and val/<class>/*")
    return ImageFolderDataset(
        root,
        split,
        resolution,
        training=training,
        class_map=class_map,
        transform_kwargs=transform_kwargs(training, aug, mean, std, interpolation, crop_pct),
        drop_unknown_classes=drop_unknown_classes,
    )


def transform_kwargs(training: bool, aug: dict | None, mean, std, interpolation: str | None, crop_pct) -> dict:
    """timm create_transform arguments from the aug section and the dataset's normalisation options."""
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
    return kwargs


@register_dataset(
    "imagenet", num_classes=1000, in_chans=3, augmentation=folder_augmentation,
    native_augmentation=folder_native_augmentation, timm_transforms=True,
)  # fmt: skip
@functools.wraps(image_folder, assigned=())  # image_folder's options (inspect.signature follows __wrapped__)
def imagenet(*args, **options) -> ImageFolderDataset:
    """ImageNet-1k in the usual `root/train/n01440764/*.JPEG`, `root/val/n01440764/*.JPEG` layout."""
    ds = image_folder(*args, **options)
    class_map = inspect.signature(image_folder).bind(*args, **options).arguments.get("class_map")
    if ds.num_classes != 1000 and not class_map:
        raise ValueError(
            f"{ds.split_dir} has {ds.num_classes} class folders, ImageNet-1k has 1000; use "
            f"data.name=imagefolder for other folders"
        )
    return ds
