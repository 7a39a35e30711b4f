"""The loaders of native-aspect training and evaluation (`data.native`): NaFlex dicts, packed or padded.

    plan = native_plan(settings, patch=4)                 # settings: data.native (plan.py)
    loader = build_native_train_loader(train_set, plan, resolution=32, seed=0)
    for batch in loader: batch.inputs  # {"patches", "patch_coord", "patch_valid"[, "image_ids"]}

Training batches come from the plan's sampler (`plan.sampler`: sampler.py, buckets.py) over this
rank's DistributedSampler shard, so each rank forms its own batches, and resume at any batch is exact (`set_epoch` /
`start_at`, as for square batches). Evaluation: this rank's contiguous shard in order, one image per row padded to
the budget (buckets: each at its bucket's size).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..share import Share
from .buckets import collate_buckets
from .collate import collate_native
from .items import NativeDataset, native_sizes
from .plan import NativePlan, native_plan
from .timm_naflex import TimmNaflexBatches

__all__ = ["native_plan", "build_native_train_loader", "build_native_eval_loader", "native_trials", "NativeTrial"]


def _dataset(dataset: Dataset, plan: NativePlan) -> NativeDataset:
    """Items as patch sequences, or as images where the plan's batches are of one size (buckets)."""
    return NativeDataset(dataset, plan.patch if plan.sampler.patches else None)


def _loader(dataset: NativeDataset, batch_sampler, share: Share) -> DataLoader:
    return share.loader(dataset, batch_sampler, collate_native if dataset.patch else collate_buckets)


def build_native_train_loader(
    dataset: Dataset,
    plan: NativePlan,
    resolution: int,
    seed: int = 0,
    share: Share | None = None,
    aug: dict | None = None,
) -> DataLoader:
    """Shuffled native-aspect batches; `resolution`: the native size of datasets that only draw squares; `aug`: the
    augmentation settings timm's loader applies (plan.loader == "timm", timm_naflex.py)."""
    share = share or Share()
    if plan.loader == "timm":
        return TimmNaflexBatches(dataset, plan, aug or {}, seed, share.workers, share.rank, share.world_size)
    shard = DistributedSampler(dataset, num_replicas=share.world_size, rank=share.rank, shuffle=True, seed=seed)
    batches = plan.sampler.for_plan(shard, native_sizes(dataset, resolution), plan, seed)
    return _loader(_dataset(dataset, plan), batches, share)


def build_native_eval_loader(
    dataset: Dataset,
    plan: NativePlan,
    budget: int,
    batch_size: int,
    resolution: int,
    share: Share | None = None,
) -> DataLoader:
    """`share`'s contiguous shard (default: all of it, no workers) at a token budget of `budget` per image (no
    padding duplicates: sums over ranks are exact)."""
    share = share or Share()
    indices, sizes = share.shard(len(dataset)), native_sizes(dataset, resolution)
    keys = plan.sampler.eval_keys(sizes, indices, plan, budget, batch_size)
    return _loader(_dataset(dataset, plan), keys, share)


class NativeTrial(NamedTuple):
    batch: object  # a NativeBatch, or a Batch of one bucket's images
    what: str  # what the model is tried on, for the message when it fails
    fix: str  # what to do then ("" where there is no other mode to name)
    images: int | None  # outputs the model must give (None: as many as the batch's rows)


def native_trials(dataset: Dataset, plan: NativePlan, resolution: int) -> Iterator[NativeTrial]:
    """The batches a model is tried on before training on `plan` (one each, drawn when asked for), so that a model
    that cannot take them fails at once with one line."""
    items, sizes = _dataset(dataset, plan), native_sizes(dataset, resolution)
    for keys in plan.sampler.trial_keys(sizes, len(dataset), plan):
        if not plan.sampler.patches:
            h, w = keys[0].size
            yield NativeTrial(
                collate_buckets(items.__getitems__(keys)), f"the {h} x {w} px bucket of data.native", "", None
            )
            continue
        batch = collate_native(items.__getitems__(keys))
        fix = "; a model of one image size per batch (Swin, CvT) trains on aspect buckets: data.native.mode=buckets"
        yield NativeTrial(batch, "native-aspect batches (data.native)", fix, batch.images)
