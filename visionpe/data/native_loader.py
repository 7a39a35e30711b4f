"""The loaders of native-aspect training and evaluation (`data.native`): NaFlex dicts, packed or padded.

    plan = native_plan(settings, patch=4)                 # settings: data.native (engine/config.py NativeConfig)
    loader = build_native_train_loader(train_set, plan, resolution=32, seed=0)
    for batch in loader: batch.inputs  # {"patches", "patch_coord", "patch_valid"[, "image_ids"]}

Training batches come from `NativeBatchSampler` (native_sampler.py) over this rank's DistributedSampler shard, so
each rank packs its own rows, and resume at any batch is exact (`set_epoch` / `start_at`, as for square batches).
Evaluation: this rank's contiguous shard in order, one image per row padded to the budget.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .native_buckets import DEFAULT_ASPECTS, AspectBucketSampler, bucket_sizes, collate_buckets, nearest_bucket
from .native_collate import collate_native
from .native_items import NativeDataset, native_sizes
from .native_resize import budget_size
from .native_sampler import NativeBatchSampler, NativeKey, NativePlan
from .native_timm import TimmNaflexBatches
from .share import Share

__all__ = ["native_plan", "build_native_train_loader", "build_native_eval_loader"]


def native_plan(settings, patch: int) -> NativePlan:
    """The NativePlan of data.native settings (a NativeConfig) for a model of `patch` px patches; a row too short
    for the largest budget or a batch shorter than a row is a one-line error."""
    budgets = tuple(int(b) for b in settings.seq_lens) or (int(settings.max_tokens),)
    row = int(settings.row_tokens or max(budgets))
    if settings.mode == "packed" and row < max(budgets):
        raise ValueError(
            f"data.native.row_tokens={row} cannot hold an image at the largest budget ({max(budgets)} tokens); "
            f"raise it to at least {max(budgets)} or lower the budgets"
        )
    if settings.tokens_per_batch < (row if settings.mode == "packed" else max(budgets)):
        raise ValueError(
            f"data.native.tokens_per_batch={settings.tokens_per_batch} is less than one row "
            f"({row if settings.mode == 'packed' else max(budgets)} tokens); raise it"
        )
    aspects = tuple(float(a) for a in settings.aspects) or DEFAULT_ASPECTS
    tpb, buffer = int(settings.tokens_per_batch), int(settings.buffer)
    return NativePlan(int(patch), settings.mode, budgets, tpb, row, buffer, aspects, settings.loader)


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
    augmentation settings timm's loader applies (plan.loader == "timm", native_timm.py)."""
    share = share or Share()
    if plan.loader == "timm":
        return TimmNaflexBatches(dataset, plan, aug or {}, seed, share.workers, share.rank, share.world_size)
    shard = DistributedSampler(dataset, num_replicas=share.world_size, rank=share.rank, shuffle=True, seed=seed)
    sizes = native_sizes(dataset, resolution)
    if plan.mode == "buckets":
        budget, tpb = max(plan.budgets), plan.tokens_per_batch
        batches = AspectBucketSampler(shard, sizes, plan.aspects, budget, plan.patch, tpb, seed)
        return _loader(NativeDataset(dataset, None), batches, share)
    batches = NativeBatchSampler(shard, sizes, plan, seed)
    return _loader(NativeDataset(dataset, plan.patch), batches, share)


def eval_keys(sizes, indices, plan: NativePlan, budget: int, batch_size: int) -> list[list[NativeKey]]:
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


def bucket_eval_keys(sizes, indices, plan: NativePlan, budget: int, batch_size: int) -> list[list[NativeKey]]:
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
    if plan.mode == "buckets":
        keys = bucket_eval_keys(sizes, indices, plan, budget, batch_size)
        return _loader(NativeDataset(dataset, None), keys, share)
    keys = eval_keys(sizes, indices, plan, budget, batch_size)
    return _loader(NativeDataset(dataset, plan.patch), keys, share)
