"""Datasets timm reads by name: `data.name=hfds/<hub name>` (Hugging Face datasets), `wds/<name>` (WebDataset shards),
`tfds/<name>` (TensorFlow datasets) go to `timm.data.create_dataset` as they are, with `data.root`, the split and
`data.options` (e.g. `input_key`, `target_key`); images then get timm's transforms at each resolution, like folders.

visionpe's loader draws items by index (seeded order, exact resume, one resolution per batch), so the reader must give
random access: `hfds/` does; `wds/` and `tfds/` stream (an IterableDataset) and are refused with a clear message. A
reader whose backend is not installed names the package to install.
"""

from __future__ import annotations

from functools import partial

from timm.data import create_dataset, create_transform
from torch.utils.data import Dataset, IterableDataset

from .folders import transform_kwargs
from .registry import DatasetInfo, register_name_resolver

__all__ = ["TIMM_PREFIXES", "TimmReaderDataset", "timm_reader_info", "is_timm_reader_name"]

TIMM_PREFIXES = {"hfds": "datasets", "wds": "webdataset", "tfds": "tensorflow-datasets tensorflow"}


def is_timm_reader_name(name: str) -> bool:
    prefix, sep, rest = name.partition("/")
    return bool(sep and rest) and prefix.lower() in TIMM_PREFIXES


class TimmReaderDataset(Dataset):
    """A timm reader's (PIL image, class) items with per-resolution timm transforms (`render(i, resolution)`)."""

    def __init__(
        self,
        name: str,
        root: str | None,
        split: str,
        resolution: int,
        training: bool = False,
        class_map: dict | None = None,
        transform_kwargs: dict | None = None,
        num_classes: int | None = None,
        **reader_kwargs,
    ):
        prefix = name.partition("/")[0].lower()
        try:
            self.base = create_dataset(
                name,
                root=root,
                split=split,
                is_training=training,
                class_map=dict(class_map) if class_map else None,
                input_img_mode="RGB",
                **reader_kwargs,
            )
        except ImportError as e:
            raise ImportError(
                f"data.name={name!r} is read by timm's {prefix}/ reader, which needs a package that is not installed "
                f"({e}); pip install {TIMM_PREFIXES[prefix]}"
            ) from None
        if isinstance(self.base, IterableDataset):
            raise ValueError(
                f"timm reads {name!r} as a stream ({type(self.base).__name__}) but visionpe's loader draws items by "
                f"index; use an hfds/ name, or export the split to folders and use data.name=imagefolder"
            )
        reader = getattr(self.base, "reader", None)
        self.class_to_idx = dict(getattr(reader, "class_to_idx", None) or {})
        self.num_classes = num_classes or len(self.class_to_idx) or None
        if not self.num_classes:
            raise ValueError(
                f"{name!r} ({split}) does not list its classes; set data.options.num_classes=<number of classes>"
            )
        self.name, self.split = name, split
        self.split_dir = f"{name} ({split})"  # what evaluation warnings call the split
        self.resolution, self.training = int(resolution), training
        self.transform_kwargs = dict(transform_kwargs or {})
        self._transforms: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.base)

    def transform(self, resolution: int):
        if resolution not in self._transforms:
            self._transforms[resolution] = create_transform(
                (3, resolution, resolution), is_training=self.training, **self.transform_kwargs
            )
        return self._transforms[resolution]

    def render(self, index: int, resolution: int):
        img, target = self.base[index][:2]
        return self.transform(resolution)(img), int(target)

    def __getitem__(self, index: int):
        return self.render(index, self.resolution)


def _timm_reader_dataset(
    name: str,
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
    num_classes: int | None = None,
    **reader_kwargs,
) -> TimmReaderDataset:
    kwargs = transform_kwargs(training, aug, mean, std, interpolation, crop_pct)
    return TimmReaderDataset(
        name, root, split, resolution, training, class_map, kwargs, num_classes=num_classes, **reader_kwargs
    )


def timm_reader_info(name: str) -> DatasetInfo:
    """The registry entry of a name timm's create_dataset reads (hfds/, wds/, tfds/)."""
    return DatasetInfo(
        name,
        partial(_timm_reader_dataset, name),
        num_classes=None,
        in_chans=3,
        kind="image",
        description=f"read by timm.data.create_dataset({name!r}); options go to its reader",
    )


register_name_resolver(is_timm_reader_name, timm_reader_info)
