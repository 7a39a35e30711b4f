"""Which part of a dataset this process reads and how: its rank of `world_size` processes, its loader workers and
pinned memory (for a GPU). Every loader (index, stream, native-aspect) is built from one `Share`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

__all__ = ["Share"]


@dataclass(frozen=True)
class Share:
    workers: int = 0
    rank: int = 0
    world_size: int = 1
    pin_memory: bool = False

    def shard(self, n: int) -> range:
        """This rank's contiguous part of n ordered items (no padding duplicates: sums over ranks are exact)."""
        per = -(-n // self.world_size)
        return range(self.rank * per, min(n, (self.rank + 1) * per))

    def loader(self, dataset, batch_sampler=None, collate_fn=None, generator=None) -> DataLoader:
        """A DataLoader over `dataset` with these workers: batches of `batch_sampler`'s keys, or (None) the whole
        batches a dataset makes itself. `generator`: the loader's own (default a fresh one, which keeps it from
        drawing from the global RNG: exact resume)."""
        batching = dict(batch_sampler=batch_sampler) if batch_sampler is not None else dict(batch_size=None)
        return DataLoader(
            dataset,
            **batching,
            num_workers=self.workers,
            collate_fn=collate_fn,
            pin_memory=self.pin_memory,
            generator=torch.Generator() if generator is None else generator,
            persistent_workers=False,
        )
