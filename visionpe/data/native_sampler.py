"""Batches of native-aspect images: which images, at which size, in which row (keys for `NativeDataset`).

Each image is resized, keeping its aspect ratio, to a token budget: `max_tokens`, or one of `seq_lens` drawn per
image (packed) or per batch (padded). Packed: rows of `row_tokens` filled by the online first-fit-decreasing
packer (native_pack.py). Padded: one image per row, `tokens_per_batch // seq_len` rows, padded to seq_len.

Every rank packs its own shard (a DistributedSampler) into the same number of batches per epoch, fixed for the run
from the dataset's sizes (`num_batches`): the shard's order is read again from its start if an epoch needs more
images, and an epoch stops at that count. Everything is a function of (seed, epoch, position), so an epoch restarts
at any batch (`start_at`) with the same batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from .multires import EpochBatchSampler
from .native_pack import OnlinePacker
from .native_resize import budget_size
from .seeding import mix_seed

__all__ = ["NativeKey", "NativePlan", "NativeBatchSampler"]

SIZE_SAMPLE = 2048  # images whose sizes estimate the batches per epoch


class NativeKey(NamedTuple):
    index: int
    size: tuple[int, int]  # (H, W) px to draw the image at
    seed: int | None  # its augmentation seed
    row: int  # its row in the batch
    row_len: int  # the row's length in tokens
    rows: int  # rows in the batch
    packed: bool  # rows may hold several images (image_ids)


@dataclass(frozen=True)
class NativePlan:
    """How batches are formed (the resolved data.native settings)."""

    patch: int
    mode: str  # packed | padded | buckets (native_buckets.py)
    budgets: tuple[int, ...]  # per-image (packed) or per-batch (padded) token budgets
    tokens_per_batch: int
    row_tokens: int  # packed: tokens per row
    buffer: int
    aspects: tuple[float, ...] = ()  # buckets: aspect ratios W / H
    loader: str = "visionpe"  # or timm (native_timm.py)

    @property
    def rows(self) -> int:
        return max(1, self.tokens_per_batch // self.row_tokens)

    def tokens(self, size: tuple[int, int]) -> int:
        """Patches of an image drawn at `size` (px)."""
        return (size[0] // self.patch) * (size[1] // self.patch)


class NativeBatchSampler(EpochBatchSampler):
    """Groups an index sampler (a DistributedSampler: this rank's shard) into native-aspect batches of NativeKey.
    `sizes(index) -> (h, w)` gives an image's native size without loading it."""

    def __init__(self, sampler, sizes: Callable[[int], tuple[int, int]], plan: NativePlan, seed: int = 0):
        self.sampler, self.sizes, self.plan, self.seed = sampler, sizes, plan, int(seed)
        self.epoch, self.start = 0, 0
        self._num_batches = self._estimate_batches()

    def num_batches(self) -> int:
        return self._num_batches

    def _estimate_batches(self) -> int:
        """Batches per epoch and rank: this shard's images at the sampled images' mean tokens (packed) or mean
        images per batch (padded); the same on every rank (the shards are of equal length)."""
        n, p = len(self.sampler), self.plan
        if p.mode == "padded":
            per_batch = sum(max(1, p.tokens_per_batch // b) for b in p.budgets) / len(p.budgets)
            return max(1, int(n // per_batch))
        total = len(self.sampler.dataset) if hasattr(self.sampler, "dataset") else n
        step = max(1, total // SIZE_SAMPLE)
        sample = [self.sizes(i) for i in range(0, total, step)[:SIZE_SAMPLE]]
        mean = sum(p.tokens(budget_size(s, p.patch, b)) for s in sample for b in p.budgets)
        mean /= len(sample) * len(p.budgets)
        return max(1, int(n * mean // (p.rows * p.row_tokens)))

    def _stream(self) -> Iterator[tuple[int, int]]:
        """(index, pass) over this shard's epoch order, read again from its start for as long as asked."""
        order = list(self.sampler)
        if not order:
            raise ValueError("this process's share of the training set is empty; use more data or fewer processes")
        for passes in itertools.count():
            for i in order:
                yield i, passes

    def _budget(self, *key: int) -> int:
        b = self.plan.budgets
        return b[0] if len(b) == 1 else b[mix_seed(self.seed, self.epoch, 0xB0D, *key) % len(b)]

    def _size(self, index: int, budget: int) -> tuple[int, int]:
        return budget_size(self.sizes(index), self.plan.patch, budget)

    def _key(self, index: int, passes: int, size: tuple[int, int], row: int, row_len: int, rows: int) -> NativeKey:
        seed = mix_seed(self.seed, self.epoch, index, passes)
        return NativeKey(index, size, seed, row, row_len, rows, self.plan.mode == "packed")

    def _packed(self) -> Iterator[list[NativeKey]]:
        p = self.plan
        packer = OnlinePacker(p.row_tokens, p.rows, p.buffer)
        for index, passes in self._stream():
            size = self._size(index, self._budget(index, passes))
            for rows in packer.push((index, passes, size), p.tokens(size)):
                yield [self._key(*item, r, p.row_tokens, p.rows) for r, row in enumerate(rows) for item in row]

    def _padded(self) -> Iterator[list[NativeKey]]:
        p, stream, b = self.plan, self._stream(), 0
        while True:
            seq_len = self._budget(b)
            items = [next(stream) for _ in range(max(1, p.tokens_per_batch // seq_len))]
            n = len(items)
            yield [self._key(i, k, self._size(i, seq_len), r, seq_len, n) for r, (i, k) in enumerate(items)]
            b += 1

    def __iter__(self) -> Iterator[list[NativeKey]]:
        batches = self._packed() if self.plan.mode == "packed" else self._padded()
        for b, batch in enumerate(batches):
            if b >= self._num_batches:
                return
            if b >= self.start:
                yield batch
