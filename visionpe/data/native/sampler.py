"""Batches of native-aspect images: which images, at which size, in which row (keys for `NativeDataset`); the
samplers of `data.native.mode` packed and padded (buckets: buckets.py; the mode picks one in plan.py).

Each image is resized, keeping its aspect ratio, to a token budget: `max_tokens`, or one of `seq_lens` drawn per
image (packed) or per batch (padded). Packed: rows of `row_tokens` filled by the online first-fit-decreasing
packer (pack.py). Padded: one image per row, `tokens_per_batch // seq_len` rows, padded to seq_len.

Every rank packs its own shard (a DistributedSampler) into the same number of batches per epoch, fixed for the run
from the dataset's sizes (`num_batches`): the shard's order is read again from its start if an epoch needs more
images, and an epoch stops at that count. Everything is a function of (seed, epoch, position), so an epoch restarts
at any batch (`start_at`) with the same batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ..multires import EpochBatchSampler
from ..seeding import mix_seed
from .pack import OnlinePacker
from .resize import budget_size

__all__ = ["NativeKey", "NativeBatchSampler", "PackedSampler", "PaddedSampler", "check_batch", "eval_keys"]

SIZE_SAMPLE = 2048  # images whose sizes estimate the batches per epoch


class NativeKey(NamedTuple):
    index: int
    size: tuple[int, int]  # (H, W) px to draw the image at
    seed: int | None  # its augmentation seed
    row: int  # its row in the batch
    row_len: int  # the row's length in tokens
    rows: int  # rows in the batch
    packed: bool  # rows may hold several images (image_ids)


class NativeBatchSampler(EpochBatchSampler):
    """Groups an index sampler (a DistributedSampler: this rank's shard) into native-aspect batches of NativeKey
    (a subclass per mode: PackedSampler, PaddedSampler). `sizes(index) -> (h, w)` gives an image's native size
    without loading it; `plan`: a NativePlan (plan.py)."""

    patches = True  # items are patch sequences (NaFlex dicts), not images
    naflex = False  # the padded rows timm's NaFlex loader makes (data.native.loader=timm)
    packed = False  # rows may hold several images (image_ids)

    def __init__(self, sampler, sizes: Callable[[int], tuple[int, int]], plan, seed: int = 0):
        self.sampler, self.sizes, self.plan, self.seed = sampler, sizes, plan, int(seed)
        self.epoch, self.start = 0, 0
        self._num_batches = self._estimate_batches()

    @classmethod
    def for_plan(cls, sampler, sizes: Callable[[int], tuple[int, int]], plan, seed: int = 0) -> NativeBatchSampler:
        return cls(sampler, sizes, plan, seed)

    @classmethod
    def check_plan(cls, plan) -> None:
        """A batch shorter than one row is a one-line error."""
        check_batch(plan, max(plan.budgets))

    @classmethod
    def eval_keys(cls, sizes, indices, plan, budget: int, batch_size: int) -> list[list[NativeKey]]:
        """Ordered batches of keys: `batch_size` images per batch, each alone in a row of `budget` tokens."""
        return eval_keys(sizes, indices, plan, budget, batch_size)

    @classmethod
    def trial_keys(cls, sizes, n: int, plan) -> list[list[NativeKey]]:
        """The batches a model is tried on before training (of a dataset of n images): two images at the largest
        budget, one per row."""
        return cls.eval_keys(sizes, range(min(2, n)), plan, max(plan.budgets), 2)

    def num_batches(self) -> int:
        return self._num_batches

    def _estimate_batches(self) -> int:
        raise NotImplementedError

    def _batches(self) -> Iterator[list[NativeKey]]:
        raise NotImplementedError

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
        return NativeKey(index, size, seed, row, row_len, rows, self.packed)

    def __iter__(self) -> Iterator[list[NativeKey]]:
        for b, batch in enumerate(self._batches()):
            if b >= self._num_batches:
                return
            if b >= self.start:
                yield batch


class PackedSampler(NativeBatchSampler):
    """`data.native.mode=packed`: rows of `row_tokens` filled by the online packer, a budget drawn per image."""

    packed = True

    @classmethod
    def check_plan(cls, plan) -> None:
        """A row too short for the largest budget or a batch shorter than a row is a one-line error."""
        row, top = plan.row_tokens, max(plan.budgets)
        if row < top:
            raise ValueError(
                f"data.native.row_tokens={row} cannot hold an image at the largest budget ({top} tokens); "
                f"raise it to at least {top} or lower the budgets"
            )
        check_batch(plan, row)

    @classmethod
    def trial_keys(cls, sizes, n: int, plan) -> list[list[NativeKey]]:
        """The padded trial, then the same rows as packed ones (image_ids)."""
        (keys,) = super().trial_keys(sizes, n, plan)
        return [keys, [k._replace(packed=True) for k in keys]]

    def _estimate_batches(self) -> int:
        """Batches per epoch and rank: this shard's images at the sampled images' mean tokens; the same on every
        rank (the shards are of equal length)."""
        n, p = len(self.sampler), self.plan
        total = len(self.sampler.dataset) if hasattr(self.sampler, "dataset") else n
        step = max(1, total // SIZE_SAMPLE)
        sample = [self.sizes(i) for i in range(0, total, step)[:SIZE_SAMPLE]]
        mean = sum(p.tokens(budget_size(s, p.patch, b)) for s in sample for b in p.budgets)
        mean /= len(sample) * len(p.budgets)
        return max(1, int(n * mean // (p.rows * p.row_tokens)))

    def _batches(self) -> Iterator[list[NativeKey]]:
        p = self.plan
        packer = OnlinePacker(p.row_tokens, p.rows, p.buffer)
        for index, passes in self._stream():
            size = self._size(index, self._budget(index, passes))
            for rows in packer.push((index, passes, size), p.tokens(size)):
                yield [self._key(*item, r, p.row_tokens, p.rows) for r, row in enumerate(rows) for item in row]


class PaddedSampler(NativeBatchSampler):
    """`data.native.mode=padded`: one image per row, `tokens_per_batch // seq_len` rows, a budget drawn per batch."""

    naflex = True

    def _estimate_batches(self) -> int:
        """Batches per epoch and rank: this shard's images at the mean images per batch."""
        p = self.plan
        per_batch = sum(max(1, p.tokens_per_batch // b) for b in p.budgets) / len(p.budgets)
        return max(1, int(len(self.sampler) // per_batch))

    def _batches(self) -> Iterator[list[NativeKey]]:
        p, stream, b = self.plan, self._stream(), 0
        while True:
            seq_len = self._budget(b)
            items = [next(stream) for _ in range(max(1, p.tokens_per_batch // seq_len))]
            n = len(items)
            yield [self._key(i, k, self._size(i, seq_len), r, seq_len, n) for r, (i, k) in enumerate(items)]
            b += 1


def check_batch(plan, row: int) -> None:
    """A batch of fewer tokens than one row of `row` is a one-line error."""
    if plan.tokens_per_batch < row:
        raise ValueError(
            f"data.native.tokens_per_batch={plan.tokens_per_batch} is less than one row ({row} tokens); raise it"
        )


def eval_keys(sizes, indices, plan, budget: int, batch_size: int) -> list[list[NativeKey]]:
    """Ordered batches of keys: `batch_size` images per batch, each alone in a row of `budget` tokens."""
    idx = list(indices)
    out = []
    for s in range(0, len(idx), batch_size):
        chunk = idx[s : s + batch_size]
        out.append(
            [
                NativeKey(i, budget_size(sizes(i), plan.patch, budget), None, r, budget, len(chunk), False)
                for r, i in enumerate(chunk)
            ]
        )
    return out
