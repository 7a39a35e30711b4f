"""Aspect-ratio buckets: batches of one size each, for models that take one image size per batch (Swin, CvT).

`data.native.mode=buckets`: each image goes to the bucket whose aspect ratio (W / H, from `aspects`) is nearest its
own (in log ratio) and is drawn at that bucket's size, the largest multiple of `multiple` px per side within the
token budget (so every bucket has about the same tokens). A batch holds images of one bucket, `tokens_per_batch //
bucket tokens` of them; the batches of an epoch come in a seeded random order. Each rank buckets its own shard into
the same number of batches (a lower bound for any shard: images per rank / largest batch - buckets), and restarts at
any batch (`start_at`), as the other samplers do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch

from ..multires import Batch, EpochBatchSampler
from ..seeding import mix_seed
from .sampler import NativeKey, check_batch

__all__ = ["DEFAULT_ASPECTS", "bucket_sizes", "nearest_bucket", "AspectBucketSampler", "collate_buckets"]

DEFAULT_ASPECTS = (1 / 3, 1 / 2, 3 / 4, 1.0, 4 / 3, 2.0, 3.0)


def bucket_sizes(aspects: Sequence[float], budget: int, multiple: int) -> list[tuple[int, int]]:
    """(H, W) px per aspect ratio W / H: multiples of `multiple`, (H / m) * (W / m) <= budget, ratio kept to within
    one `multiple` per side."""
    out = []
    for a in aspects:
        if a <= 0:
            raise ValueError(f"aspect ratios must be positive, got {a}")
        gh = max(1, math.floor(math.sqrt(budget / a)))
        gw = max(1, min(budget // gh, math.floor(gh * a + 0.5)))
        out.append((gh * multiple, gw * multiple))
    return out


def nearest_bucket(size: tuple[int, int], aspects: Sequence[float]) -> int:
    """The bucket whose aspect ratio is nearest size's W / H in log ratio (ties: the first)."""
    r = math.log(size[1] / size[0])
    return min(range(len(aspects)), key=lambda i: abs(math.log(aspects[i]) - r))


class AspectBucketSampler(EpochBatchSampler):
    """Batches of NativeKey of one bucket size each, over an index sampler (this rank's DistributedSampler): the
    sampler of `data.native.mode=buckets` (the interface of native_sampler.NativeBatchSampler)."""

    patches = False  # items are images of the bucket's size
    naflex = False
    packed = False

    def __init__(
        self,
        sampler,
        sizes: Callable[[int], tuple[int, int]],
        aspects: Sequence[float],
        budget: int,
        multiple: int,
        tokens_per_batch: int,
        seed: int = 0,
    ):
        self.sampler, self.sizes, self.aspects, self.seed = sampler, sizes, tuple(aspects), int(seed)
        self.shapes = bucket_sizes(self.aspects, budget, multiple)
        self.per_batch = [max(1, tokens_per_batch * multiple * multiple // (h * w)) for h, w in self.shapes]
        self.epoch, self.start = 0, 0
        # a lower bound over any split of the shard into buckets: each bucket leaves less than one batch unused
        self._num_batches = len(sampler) // max(self.per_batch) - len(self.shapes)
        if self._num_batches < 1:
            raise ValueError(
                f"{len(sampler)} images per process cannot be sure to fill one batch of up to {max(self.per_batch)} "
                f"images in each of {len(self.shapes)} aspect buckets; lower data.native.tokens_per_batch, give "
                f"fewer data.native.aspects or use more images"
            )

    @classmethod
    def for_plan(cls, sampler, sizes: Callable[[int], tuple[int, int]], plan, seed: int = 0) -> AspectBucketSampler:
        """The sampler of a NativePlan (plan.py): its aspects, its largest budget."""
        return cls(sampler, sizes, plan.aspects, max(plan.budgets), plan.patch, plan.tokens_per_batch, seed)

    @classmethod
    def check_plan(cls, plan) -> None:
        check_batch(plan, max(plan.budgets))

    @classmethod
    def eval_keys(cls, sizes, indices, plan, budget: int, batch_size: int) -> list[list[NativeKey]]:
        """Batches of keys, each image at its bucket's size (at `budget`): bucket by bucket, in index order within."""
        shapes = bucket_sizes(plan.aspects, budget, plan.patch)
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(nearest_bucket(sizes(i), plan.aspects), []).append(i)
        out = []
        for b, group in sorted(groups.items()):
            for s in range(0, len(group), batch_size):
                chunk = group[s : s + batch_size]
                out.append([NativeKey(i, shapes[b], None, r, 0, len(chunk), False) for r, i in enumerate(chunk)])
        return out

    @classmethod
    def trial_keys(cls, sizes, n: int, plan) -> list[list[NativeKey]]:
        """The first image drawn at every bucket size, one batch each."""
        return [
            [NativeKey(0, hw, None, 0, 0, 1, False)] for hw in bucket_sizes(plan.aspects, max(plan.budgets), plan.patch)
        ]

    def num_batches(self) -> int:
        return self._num_batches

    def epoch_batches(self) -> list[list[NativeKey]]:
        """Every batch of the epoch, in order (full batches only)."""
        groups: list[list[int]] = [[] for _ in self.shapes]
        for i in self.sampler:
            groups[nearest_bucket(self.sizes(i), self.aspects)].append(i)
        batches = []
        for b, (group, n) in enumerate(zip(groups, self.per_batch)):
            for s in range(0, len(group) - n + 1, n):
                keys = group[s : s + n]
                batches.append([self._key(i, self.shapes[b], r, len(keys)) for r, i in enumerate(keys)])
        g = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch, 0xB0C))
        order = torch.randperm(len(batches), generator=g).tolist()
        return [batches[j] for j in order]

    def _key(self, index: int, size: tuple[int, int], row: int, rows: int) -> NativeKey:
        return NativeKey(index, size, mix_seed(self.seed, self.epoch, index), row, 0, rows, False)

    def __iter__(self) -> Iterator[list[NativeKey]]:
        batches = self.epoch_batches()
        if len(batches) < self._num_batches:  # cannot happen with the lower bound; a guard against a wrong sampler
            raise RuntimeError(f"bucketing gave {len(batches)} batches, fewer than the {self._num_batches} planned")
        yield from batches[self.start : self._num_batches]


def collate_buckets(items: list[tuple[torch.Tensor, int, NativeKey]]) -> Batch:
    """(image, target, key) items of one bucket -> a Batch of images [B, C, H, W] (resolution: (H, W))."""
    images = torch.stack([x for x, _, _ in items])
    targets = [t for _, t, _ in items]
    targets = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.as_tensor(targets)
    return Batch(images, targets, tuple(items[0][2].size), ())
