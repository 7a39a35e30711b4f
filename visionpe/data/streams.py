"""Loaders for streaming datasets (a torch IterableDataset, e.g. timm's `wds/` and `tfds/` readers): no sampler, no
index; each process and loader worker reads its own part of the stream and groups it into batches itself.

A stream may offer, and the loaders use when present:
  `configure_stream(training, rank, world_size, workers)`: split the stream over processes and workers before a
      loader starts (needed under torchrun: a stream without it is refused there);
  `__len__`: items this process reads per epoch (training needs it: it fixes the number of steps, equal on every
      process, so DDP never waits on a rank that ran dry);
  `set_epoch(epoch)`: the shuffle of that epoch;  `prepare(item, resolution) -> (input, target)`: turn a raw item
      (e.g. a PIL image) into an input at a resolution, so multi-resolution batches need no resizing.

Batch `p` of an epoch has the resolution `resolution_schedule(...)[p]`, the same on every process, as in the index
loader. With W workers the loader takes batches from the workers in turn, so worker `w`'s k-th batch is batch
`k * W + w`. A stream cannot seek: `start_at(b)` (resume mid-epoch) restarts the epoch's stream from its beginning
and stops after the epoch's remaining `num_batches() - b` batches, so the epoch keeps its number of steps but some of
its images are seen twice and others not at all (the trainer warns). Evaluation keeps the last, partial batch and
reads every image of the split exactly once over all processes and workers, so the counts it reports are exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .multires import Batch, collate_to_resolution, resolution_schedule
from .seeding import mix_seed, seeded_rngs
from .share import Share

__all__ = ["StreamBatches", "build_stream_train_loader", "build_stream_eval_loader", "is_stream", "first_stream_item"]


def is_stream(dataset) -> bool:
    """A dataset read as a stream (no random access)."""
    return isinstance(dataset, IterableDataset)


def first_stream_item(stream) -> tuple:
    """The first (raw) item of a stream without starting the stream the loaders will read: `stream.first_item()`
    when it has one (a fresh reader), else the first item of a new iterator."""
    probe = getattr(stream, "first_item", None)
    if probe is not None:
        return probe()
    for item in stream:
        return item
    raise ValueError(f"the stream {type(stream).__name__} is empty")


class StreamBatches(IterableDataset):
    """A stream's items as Batch objects, made in the loader worker (see the module docstring for the order)."""

    def __init__(
        self,
        stream: IterableDataset,
        batch_size: int,
        resolutions: Sequence[int],
        seed: int = 0,
        training: bool = True,
        generator: torch.Generator | None = None,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not resolutions:
            raise ValueError("resolutions must list at least one resolution")
        self.stream, self.batch_size, self.resolutions = stream, batch_size, [int(r) for r in resolutions]
        self.seed, self.training, self.generator = seed, training, generator
        self.prepare = getattr(stream, "prepare", None)
        self.collate_inputs = getattr(stream, "collate_inputs", None)
        self.epoch, self.start = 0, 0

    def __getstate__(self) -> dict:  # what a loader worker gets: the generator stays with the loader
        return {**self.__dict__, "generator": None}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(epoch)
        if self.generator is not None:  # worker seeds (and the stream's shuffle in workers) follow (seed, epoch)
            self.generator.manual_seed(mix_seed(self.seed, epoch, 0x57E))

    def start_at(self, batch: int) -> None:
        """Run only the epoch's last `num_batches() - batch` batches, read from the start of its stream."""
        self.start = batch

    def num_batches(self) -> int:
        """Training batches per epoch on this process (the stream's items per epoch // batch size)."""
        try:
            n = len(self.stream)
        except TypeError:
            raise ValueError(
                f"training on a stream needs its length per epoch, but {type(self.stream).__name__} has no __len__"
            ) from None
        return n // self.batch_size

    def __len__(self) -> int:
        if not self.training:
            raise TypeError("an evaluation stream has no length known in advance")
        return max(self.num_batches() - self.start, 0)

    def _batch(self, items: list, resolution: int, position: int) -> Batch:
        keyed = []
        for i, item in enumerate(items):
            if self.prepare is not None:
                if self.training:  # augmentation as a function of (seed, epoch, batch, item), not of the worker
                    with seeded_rngs(mix_seed(self.seed, self.epoch, position, i)):
                        item = self.prepare(item, resolution)
                else:
                    item = self.prepare(item, resolution)
            keyed.append((item[0], item[1], resolution, ()))
        return collate_to_resolution(keyed, self.collate_inputs)

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if not self.training:
            yield from self._eval_batches()
            return
        total = self.num_batches()
        schedule = resolution_schedule(self.resolutions, self.seed, self.epoch, total)
        positions = range(self.start + worker, total, workers)  # this worker's batches, in loader order
        if not positions:
            return
        items, made = [], 0
        for item in self.stream:
            items.append(item)
            if len(items) == self.batch_size:
                p = positions[made]
                yield self._batch(items, schedule[p], p)
                items, made = [], made + 1
                if made == len(positions):
                    return
        if made == 0:  # timm's wds reader skips unreadable shards (logging each) and reads nothing from empty ones
            raise ValueError(
                f"the training stream gave no images in epoch {self.epoch + 1}: its shards are empty or unreadable "
                f"(see the messages above); check data.train_split and data.root"
            )
        raise RuntimeError(
            f"the training stream ended after {made} of this worker's {len(positions)} batches of epoch "
            f"{self.epoch + 1}; its __len__ ({len(self.stream)} items) promises more than it reads"
        )

    def _eval_batches(self) -> Iterator[Batch]:
        res, items = self.resolutions[0], []
        for item in self.stream:
            items.append(item)
            if len(items) == self.batch_size:
                yield self._batch(items, res, 0)
                items = []
        if items:
            yield self._batch(items, res, 0)


def _configure(stream, training: bool, share: Share) -> None:
    configure = getattr(stream, "configure_stream", None)
    if configure is not None:
        configure(training=training, rank=share.rank, world_size=share.world_size, workers=share.workers)
    elif share.world_size > 1:
        raise ValueError(
            f"{type(stream).__name__} is a stream with no configure_stream(training, rank, world_size, workers) "
            f"to split it over processes; run it in one process"
        )


def build_stream_train_loader(
    stream: IterableDataset, batch_size: int, resolutions: list[int], seed: int, share: Share
) -> DataLoader:
    """Training batches from a stream; the loader's `dataset` (a StreamBatches) has set_epoch / start_at /
    num_batches, like the index loader's batch sampler."""
    _configure(stream, True, share)
    batches = StreamBatches(stream, batch_size, resolutions, seed, training=True, generator=torch.Generator())
    batches.set_epoch(0)
    if batches.num_batches() == 0:
        raise ValueError(
            f"the training stream gives {len(stream)} items per epoch to this process, fewer than one batch of "
            f"{batch_size}; lower data.batch_size or use more data"
        )
    return share.loader(batches, generator=batches.generator)  # the stream makes whole batches (one resolution each)


def build_stream_eval_loader(stream: IterableDataset, resolution: int, batch_size: int, share: Share) -> DataLoader:
    """Evaluation batches of this process's share of a stream (every item once over all processes)."""
    _configure(stream, False, share)
    generator = torch.Generator().manual_seed(0)  # fixed worker seeds: evaluation draws nothing at random
    return share.loader(StreamBatches(stream, batch_size, [resolution], training=False, generator=generator))
