"""Datasets timm reads by name: `data.name=hfds/<hub name>` (Hugging Face datasets), `hfids/<hub name>` (the same,
streamed), `wds/<name>` (WebDataset shards), `tfds/<name>` (TensorFlow datasets) go to `timm.data.create_dataset`
as they are, with `data.root`, the split and `data.options` (e.g. `input_key`, `target_key`); images then get timm's
transforms at each resolution, like folders.

`hfds/` gives random access (TimmReaderDataset: the index loader, exact resume). `hfids/`, `wds/` and `tfds/` stream
(TimmStreamDataset, batched by streams.py): timm's reader splits the stream over processes and loader workers for
training and needs the split's size for that; it knows it from the data (tfds, hfids, a wds `_info.json`, a wds
split written `train-{0000..0099}.tar|<count>`), else set `data.options.train_num_samples`. Evaluation needs no
size: it reads the whole split in every process and keeps every world_size-th image, so each image is evaluated
exactly once (timm's own distributed evaluation pads with repeats).
A reader whose backend is not installed names the package to install.
"""

from __future__ import annotations

import importlib.util
import os
from functools import partial

from timm.data import create_dataset, create_transform
from torch.utils.data import Dataset, IterableDataset

from ..registry import DatasetInfo, register_name_resolver
from .folders import transform_kwargs

__all__ = ["TIMM_PREFIXES", "TimmReaderDataset", "TimmStreamDataset", "timm_reader_info", "is_timm_reader_name"]

TIMM_PREFIXES = {"hfds": "datasets", "hfids": "datasets", "wds": "webdataset", "tfds": "tensorflow-datasets tensorflow"}


def is_timm_reader_name(name: str) -> bool:
    prefix, sep, rest = name.partition("/")
    return bool(sep and rest) and prefix.lower() in TIMM_PREFIXES


def _split_key(training: bool) -> str:
    return "data.train_split" if training else "data.val_split"


def _is_local(path: str) -> bool:
    return "://" not in path and not path.startswith("pipe:")


def _check_wds_root(name: str, root: str | None) -> None:
    if importlib.util.find_spec("webdataset") is None:  # timm's wds reader raises a RuntimeError, not ImportError
        raise ImportError(f"data.name={name!r} is read by timm's wds/ reader; pip install webdataset")
    if not root:
        raise ValueError(f"data.name={name!r} needs data.root=<the folder (or URL) of its .tar shards>")
    if _is_local(root) and not os.path.isdir(root):
        raise ValueError(f"data.root={root!r} is not a directory (the folder of the {name!r} shards); check the path")


def _check_wds_shards(name: str, root: str, split: str, training: bool, reader) -> None:
    """timm's wds pipeline logs and skips a shard it cannot open; training would then wait forever for samples."""
    files = [os.path.join(root, f) for f in getattr(getattr(reader, "split_info", None), "filenames", ())]
    missing = [f for f in files if _is_local(f) and not os.path.isfile(f)]
    if missing:
        raise ValueError(
            f"{name!r} split {split!r}: {len(missing)} of {len(files)} shard file(s) not found, e.g. {missing[0]}; "
            f"check data.root and {_split_key(training)}"
        )


def _open(name: str, root: str | None, split: str, training: bool, class_map: dict | None, **kwargs):
    """timm's dataset for (name, split), with timm's errors turned into one line that says what to set."""
    prefix = name.partition("/")[0].lower()
    if prefix == "wds":
        _check_wds_root(name, root)
    try:
        return create_dataset(
            name,
            root=root,
            split=split,
            is_training=training,
            class_map=dict(class_map) if class_map else None,
            input_img_mode="RGB",
            **kwargs,
        )
    except ImportError as e:
        raise ImportError(
            f"data.name={name!r} is read by timm's {prefix}/ reader, which needs a package that is not installed "
            f"({e}); pip install {TIMM_PREFIXES[prefix]}"
        ) from None
    except TypeError as e:  # an option the reader does not take (data.options go to it as they are)
        raise ValueError(
            f"data.options for {name!r}: {e}; timm's {prefix}/ reader takes its own arguments, plus num_classes "
            f"and train_num_samples"
        ) from None
    except (RuntimeError, AssertionError, KeyError, FileNotFoundError, ValueError) as e:
        if prefix == "hfds":  # random access: timm's message is the one to read
            raise
        if "num_samples" in str(e):
            raise ValueError(
                f"{name!r} streams split {split!r} and does not say how many images it holds (no _info.json "
                f"listing it, no '|<count>' after its shard pattern); set data.options.train_num_samples=<images "
                f"in the split>"
            ) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"timm's {prefix}/ reader cannot open {name!r} split {split!r} (data.root={root!r}): {first}; check "
            f"data.root and {_split_key(training)}"
        ) from None


def _classes(name: str, split: str, base, num_classes: int | None) -> tuple[dict, int]:
    reader = getattr(base, "reader", None)
    class_to_idx = dict(getattr(reader, "class_to_idx", None) or {})
    n = num_classes or len(class_to_idx)
    if not n:
        raise ValueError(
            f"{name!r} ({split}) does not list its classes; set data.options.num_classes=<number of classes>"
        )
    return class_to_idx, n


class _TimmDataset:
    """What both datasets share: timm's reader for one split (by index or streamed, as `streamed` says it must
    be), its classes, and timm's transform at each resolution, made on first use (train- or eval-time by
    `training`)."""

    streamed: bool

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
        self.name, self.root, self.split, self.class_map = name, root, split, class_map
        self.reader_kwargs = reader_kwargs
        self.base = _open(name, root, split, training, class_map, **reader_kwargs)
        if isinstance(self.base, IterableDataset) != self.streamed:
            how, other = ("by index", "TimmReaderDataset") if self.streamed else ("as a stream", "TimmStreamDataset")
            raise ValueError(f"timm reads {name!r} {how}; it is a {other}, not a {type(self).__name__}")
        self.resolution, self.training = int(resolution), training
        self._check_reader()
        self.class_to_idx, self.num_classes = _classes(name, split, self.base, num_classes)
        self.split_dir = f"{name} ({split})"  # what evaluation warnings call the split
        self.transform_kwargs = dict(transform_kwargs or {})
        self._transforms: dict = {}

    def _check_reader(self) -> None:
        """Checks of the opened reader before its classes are read (none by default)."""

    def transform(self, resolution: int):
        if resolution not in self._transforms:
            self._transforms[resolution] = create_transform(
                (3, resolution, resolution), is_training=self.training, **self.transform_kwargs
            )
        return self._transforms[resolution]


class TimmReaderDataset(_TimmDataset, Dataset):
    """A timm reader's (PIL image, class) items with per-resolution timm transforms (`render(i, resolution)`)."""

    streamed = False

    def __len__(self) -> int:
        return len(self.base)

    def render(self, index: int, resolution: int):
        img, target = self.base[index][:2]
        return self.transform(resolution)(img), int(target)

    def __getitem__(self, index: int):
        return self.render(index, self.resolution)


class TimmStreamDataset(_TimmDataset, IterableDataset):
    """A timm streaming reader's (PIL image, class) items; `prepare(item, resolution)` applies timm's transform.

    Training: timm's reader is told this process's rank and the loader's workers, and gives each of them its own
    shards, the same number of images each (`len` is this process's images per epoch). Evaluation: the reader reads
    the whole split in every process (no padding) and this keeps every world_size-th image, so every image of the
    split is evaluated once; the price is that each process also decodes the images it passes over."""

    streamed = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.keep = (0, 1)  # (rank, world_size): keep the images i of the stream with i % world_size == rank
        self._first = None

    def _check_reader(self) -> None:
        if self.name.partition("/")[0].lower() == "wds":
            _check_wds_shards(self.name, self.root, self.split, self.training, self.base.reader)

    def configure_stream(self, training: bool, rank: int, world_size: int, workers: int) -> None:
        if training != self.training:
            raise ValueError(f"{self.split_dir} was built for {'training' if self.training else 'evaluation'}")
        reader = self.base.reader
        if world_size > 1 and not hasattr(reader, "dist_num_replicas"):
            raise ValueError(f"timm's {type(reader).__name__} cannot be split over processes; run in one process")
        if hasattr(reader, "dist_num_replicas"):  # training: the reader's own split; evaluation: ours (self.keep)
            reader.dist_rank, reader.dist_num_replicas = (rank, world_size) if training else (0, 1)
        self.keep = (0, 1) if training else (rank, world_size)
        self.base.set_loader_cfg(num_workers=workers)

    def set_epoch(self, epoch: int) -> None:
        self.base.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        rank, world_size = self.keep
        for i, (img, target) in enumerate(self.base):
            if i % world_size == rank:
                yield img, target

    def prepare(self, item: tuple, resolution: int):
        img, target = item
        return self.transform(resolution)(img), int(target)

    def first_item(self) -> tuple:
        """The split's first image, read by a reader of its own (the loaders' reader is left unstarted)."""
        if self._first is None:
            probe = _open(self.name, self.root, self.split, False, self.class_map, **self.reader_kwargs)
            if hasattr(probe.reader, "dist_num_replicas"):
                probe.reader.dist_rank, probe.reader.dist_num_replicas = 0, 1
            for item in probe:
                self._first = item
                break
            else:
                raise ValueError(f"{self.split_dir} holds no readable image; check data.root and the split")
        return self._first


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
    train_num_samples: int | None = None,
    stream_seed: int | None = None,
    stream_batch_size: int | None = None,
    **reader_kwargs,
) -> TimmReaderDataset | TimmStreamDataset:
    kwargs = transform_kwargs(training, aug, mean, std, interpolation, crop_pct)
    if name.partition("/")[0].lower() == "hfds":
        return TimmReaderDataset(
            name, root, split, resolution, training, class_map, kwargs, num_classes=num_classes, **reader_kwargs
        )
    stream = dict(
        num_samples=train_num_samples if training else None,  # evaluation reads the split to its end
        seed=stream_seed,  # timm's shard shuffle: common to every process and worker
        batch_size=stream_batch_size,  # timm's reader gives each worker whole batches
    )
    reader_kwargs.update({k: v for k, v in stream.items() if v is not None})
    return TimmStreamDataset(
        name, root, split, resolution, training, class_map, kwargs, num_classes=num_classes, **reader_kwargs
    )


def timm_reader_info(name: str) -> DatasetInfo:
    """The registry entry of a name timm's create_dataset reads (hfds/, hfids/, wds/, tfds/)."""
    return DatasetInfo(
        name,
        partial(_timm_reader_dataset, name),
        num_classes=None,
        in_chans=3,
        kind="image",
        description=f"read by timm.data.create_dataset({name!r}); options go to its reader",
        timm_transforms=True,
    )


register_name_resolver(is_timm_reader_name, timm_reader_info)
