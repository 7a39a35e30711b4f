"""Datasets by name and the loaders the engine uses for training and evaluation.

Every loader iterates keys `(index, resolution, item_seed)` (multires.py) through `KeyedDataset`, so training at one
resolution, at a random resolution per batch and evaluation at a list of resolutions share one path. Training order
comes from a DistributedSampler (also in a single process: one code path), so `torchrun` needs nothing else.
Streaming datasets (an IterableDataset: timm's `wds/`, `tfds/` readers) have no index; streams.py batches them.
"""

from __future__ import annotations

import inspect
from functools import partial

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .multires import ResolutionBatchSampler, collate_to_resolution, eval_batches
from .native.loader import build_native_train_loader
from .native.plan import NativePlan
from .registry import DatasetInfo, get_dataset_info
from .seeding import preserved_rngs, seed_rngs
from .share import Share
from .streams import build_stream_eval_loader, build_stream_train_loader, is_stream

__all__ = [
    "build_dataset",
    "dataset_num_classes",
    "KeyedDataset",
    "build_train_loader",
    "build_eval_loader",
    "renders_any_resolution",
    "epoch_batches",
]


def _explicit_params(fn) -> tuple[set[str], bool]:
    params = inspect.signature(fn).parameters
    named = {n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return named, any(p.kind == p.VAR_KEYWORD for p in params.values())


def build_dataset(
    name: str | DatasetInfo,
    split: str,
    resolution: int,
    root: str | None = None,
    options: dict | None = None,
    **offered,
) -> Dataset:
    """Build a registered dataset. `options` go to the factory as they are (an unknown one is an error naming the
    valid ones); `offered` kwargs (training=, aug=, mean=, class_map=, ...) go only to factories that name them."""
    info = name if isinstance(name, DatasetInfo) else get_dataset_info(name)
    named, var_kw = _explicit_params(info.factory)
    kwargs = dict(options or {})
    unknown = set(kwargs) - named
    if unknown and not var_kw:
        valid = sorted(named - {"split", "resolution", "root"})
        raise ValueError(f"dataset {info.name!r} does not take option(s) {sorted(unknown)}; it takes {valid}")
    for key, value in offered.items():
        if key in named and key not in kwargs:
            kwargs[key] = value
    return info.factory(split, resolution, root=root, **kwargs)


def dataset_num_classes(info: DatasetInfo, dataset: Dataset) -> int:
    n = info.num_classes or getattr(dataset, "num_classes", None)
    if not n:
        raise ValueError(
            f"dataset {info.name!r} declares no number of classes and its dataset object has no num_classes attribute"
        )
    return int(n)


def renders_any_resolution(dataset: Dataset) -> bool:
    """Draws its items at any resolution: `render(index, resolution)`, or `prepare(item, resolution)` (streams)."""
    return callable(getattr(dataset, "render", None)) or (
        is_stream(dataset) and callable(getattr(dataset, "prepare", None))
    )


def epoch_batches(loader: DataLoader):
    """What a training loader's epochs are steered by (set_epoch, start_at, num_batches): the batch sampler of an
    index loader, the StreamBatches of a stream loader."""
    return loader.batch_sampler if loader.batch_sampler is not None else loader.dataset


class KeyedDataset(Dataset):
    """Key (index, resolution, item_seed) -> (input, target, resolution, skipped paths)."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.render = getattr(dataset, "render", None)
        self.pop_skipped = getattr(dataset, "pop_skipped", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def _load(self, index: int, resolution: int):
        return self.render(index, resolution) if self.render else self.dataset[index]

    def __getitem__(self, key: tuple[int, int, int | None]):
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int, int | None]]) -> list:
        """A batch (the DataLoader's batched fetch). Seeded items leave the global RNG states as they found them,
        saved and restored once per batch; unseeded ones draw from them."""
        if all(seed is None for _, _, seed in keys):
            return [self._keyed_item(key) for key in keys]
        with preserved_rngs():
            return [self._keyed_item(key) for key in keys]

    def _keyed_item(self, key: tuple[int, int, int | None]):
        index, resolution, seed = key
        if seed is not None:
            seed_rngs(seed)
        item = self._load(index, resolution)
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"dataset items must be (input, target) pairs, got {type(item).__name__}")
        skipped = tuple(self.pop_skipped()) if self.pop_skipped else ()
        return item[0], item[1], resolution, skipped


def _loader(keyed: KeyedDataset, batch_sampler, share: Share) -> DataLoader:
    collate_inputs = getattr(keyed.dataset, "collate_inputs", None)
    return share.loader(keyed, batch_sampler, partial(collate_to_resolution, collate_inputs=collate_inputs))


def build_train_loader(
    dataset: Dataset,
    batch_size: int,
    resolutions: list[int],
    seed: int = 0,
    workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
    native: NativePlan | None = None,
    aug: dict | None = None,
) -> DataLoader:
    """Shuffled batches (per-epoch order from (seed, epoch)) at one resolution per batch; the loader's
    `batch_sampler` has set_epoch / start_at for resuming (see epoch_batches). Streams go to streams.py;
    `native`: native-aspect batches of that plan instead (data/native/loader.py; `resolutions[0]` is the native size of
    datasets that only draw squares; `aug`: the augmentation settings, for timm's NaFlex loader)."""
    share = Share(workers, rank, world_size, pin_memory)
    if native is not None:
        if is_stream(dataset):
            raise ValueError("native-aspect batches (data.native) need an indexed dataset, not a stream")
        return build_native_train_loader(dataset, native, resolutions[0], seed, share, aug)
    if is_stream(dataset):
        return build_stream_train_loader(dataset, batch_size, resolutions, seed, share)
    keyed = KeyedDataset(dataset)
    sampler = DistributedSampler(keyed, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    batches = ResolutionBatchSampler(sampler, batch_size, resolutions, drop_last=True, seed=seed)
    if batches.num_batches() == 0:
        raise ValueError(
            f"the training set has {len(dataset)} items, fewer than one batch of {batch_size} per "
            f"process x {world_size} process(es); lower data.batch_size or use more data"
        )
    return _loader(keyed, batches, share)


def build_eval_loader(
    dataset: Dataset,
    resolution: int,
    batch_size: int,
    workers: int = 0,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> DataLoader:
    """Ordered batches over this rank's contiguous shard (no padding: metrics summed over ranks are exact)."""
    share = Share(workers, rank, world_size, pin_memory)
    if is_stream(dataset):
        return build_stream_eval_loader(dataset, resolution, batch_size, share)
    batches = eval_batches(share.shard(len(dataset)), batch_size, resolution)
    return _loader(KeyedDataset(dataset), batches, share)
