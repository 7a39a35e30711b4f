"""Datasets by name: built-in (generated, no download) and file-based sets share one registry.

A factory is `factory(split, resolution, root=None, **options) -> torch.utils.data.Dataset`; items are
(input, target) with input a tensor (image [C, H, W], clip [C, T, H, W]) or a dict of model kwargs
(e.g. {"pixels": ..., "text_ids": ...}) for multimodal models.

Optional, picked up by the engine when present: a factory parameter named `training` (train-time augmentation),
`aug` / `mean` / `std` / `interpolation` / `crop_pct` / `class_map` (image folders); on the dataset object,
`render(index, resolution) -> (input, target)` (draw an item at any resolution: one object serves every resolution
and multi-resolution batches need no resizing), `native_size(index)` and `render_size(index, (H, W))`
(native-aspect batches, data/native/items.py), `num_classes` (when the registry entry has none),
`collate_inputs(list_of_dicts)` (batch dict inputs, e.g. padding text) and `pop_skipped()` (unreadable files).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "DatasetInfo",
    "DATASETS",
    "register_dataset",
    "augmentation_text",
    "register_name_resolver",
    "get_dataset_info",
    "check_aug_applies",
]


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    factory: Callable
    num_classes: int | None  # None: read from the data (image folders)
    in_chans: int
    kind: str  # "image", "video", "image_text" or "segmentation" (pixel labels: visionpe-bench segment)
    description: str = ""
    # what training items go through, in words, from (data.options, the aug settings); None: no augmentation
    augmentation: Callable[[dict, dict], str] | None = None
    # the same for the native-resolution route (data.native with visionpe's loader), where it differs; None: as above
    native_augmentation: Callable[[dict, dict], str] | None = None
    # its training images go through timm's transforms, so aug.color_jitter / auto_augment / re_prob apply
    timm_transforms: bool = False


DATASETS: dict[str, DatasetInfo] = {}
# (claims(name), info(name)) for families of names that are not registered one by one (timm's hfds/, wds/, tfds/)
_RESOLVERS: list[tuple[Callable[[str], bool], Callable[[str], DatasetInfo]]] = []


def register_name_resolver(claims: Callable[[str], bool], info: Callable[[str], DatasetInfo]) -> None:
    """Let a module answer for every name `claims` accepts (e.g. the timm readers, see timm_readers.py)."""
    _RESOLVERS.append((claims, info))


def register_dataset(
    name: str,
    *,
    num_classes: int | None,
    in_chans: int,
    kind: str = "image",
    description: str = "",
    augmentation: Callable[[dict, dict], str] | None = None,
    native_augmentation: Callable[[dict, dict], str] | None = None,
    timm_transforms: bool = False,
):
    """Decorator registering a dataset factory under `name`. augmentation(options, aug) says in words what its
    training items go through (for reports and model cards); None: nothing. native_augmentation: the same on the
    native-resolution route, where it differs. timm_transforms: its training images go through timm's transforms
    (image folders), so timm's colour, auto-augment and erasing options apply."""

    def wrap(factory: Callable) -> Callable:
        doc = description or (factory.__doc__ or "")
        DATASETS[name] = DatasetInfo(
            name, factory, num_classes, in_chans, kind, doc, augmentation, native_augmentation, timm_transforms
        )
        return factory

    return wrap


def augmentation_text(name: str, options: dict | None, aug: dict | None, native: bool = False) -> str:
    """What the training items of dataset `name` go through with these data options and aug settings, in words;
    native: on the native-resolution route (data.native with visionpe's loader)."""
    info = get_dataset_info(name)
    words = (native and info.native_augmentation) or info.augmentation
    return words(dict(options or {}), dict(aug or {})) if words else "none"


def get_dataset_info(name: str) -> DatasetInfo:
    """The registered entry; names timm reads (`hfds/...`, `wds/...`, `tfds/...`) go to timm's create_dataset."""
    if name not in DATASETS:
        for claims, info in _RESOLVERS:
            if claims(name):
                return info(name)
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3, cutoff=0.4)
        hint = f"nearest: {', '.join(close)}" if close else f"available: {', '.join(sorted(DATASETS))}"
        raise ValueError(f"unknown dataset {name!r}; {hint}")
    return DATASETS[name]


TIMM_ONLY_AUG = ("auto_augment", "color_jitter", "re_prob")  # the aug settings only timm's transforms apply


def check_aug_applies(name: str, aug: dict, options: dict | None = None, timm_loader: bool = False) -> None:
    """A ValueError when the aug section sets an option dataset `name` never applies: timm's colour jitter,
    auto-augment and random erasing run only on datasets with timm's transforms (image folders, timm's readers);
    timm_loader: data.native.loader=timm, whose NaFlex pipeline erases any dataset's items (re_prob)."""
    info = get_dataset_info(name)
    if info.timm_transforms:
        return
    unused = [k for k in TIMM_ONLY_AUG if aug.get(k) and not (timm_loader and k == "re_prob")]
    if unused:
        words = augmentation_text(name, options, aug)
        raise ValueError(
            f"{', '.join(f'aug.{k}={aug[k]}' for k in unused)}: dataset {name!r} never applies "
            f"{'this' if len(unused) == 1 else 'these'} (timm's colour jitter, auto-augment and random erasing run "
            f"on image folders and timm's readers); remove {'it' if len(unused) == 1 else 'them'}. {name}'s training "
            f"augmentation: {words}"
        )
