"""Top-1 / top-5 / loss at a list of resolutions, for a model in memory or a checkpoint on disk.

    rows = evaluate_checkpoint("runs/quick-vit_n_rope2d", resolutions=[24, 32, 48])
    # [{"resolution": 24, "top1": 71.2, "top5": 97.0, "loss": 0.83, "images": 1000}, ...]

Under torchrun each rank evaluates a contiguous shard and the sums are all-reduced, so the numbers are exact (no
padded duplicates). Unreadable image files are left out and counted (`images` is what was evaluated, `skipped` what was
left out); a NaN or infinite metric is written to JSON as null, with the key and its value listed under `nonfinite`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings

import torch
import torch.nn.functional as F
from timm.utils import accuracy
from torch import nn
from torch.utils.data import Dataset
from tqdm import tqdm

from ..data import get_dataset_info
from ..data.datasets.folders import SkippedImagesWarning
from ..data.loader import build_eval_loader, dataset_num_classes
from ..data.native.loader import build_native_eval_loader
from ..data.native.plan import NativePlan
from ..data.share import Share
from .checkpoint import CheckpointError, find_checkpoint, load_into_model, load_weights
from .config import Config, apply_overrides, config_from_dict
from .destinations import write_text
from .distributed import DistContext, all_reduce_sum, init_distributed
from .native_train import eval_budgets, plan_for
from .setup import build_eval_sets, build_model, check_labels, check_resolutions, forward_on, resolve_amp
from .sharded_checkpoint import is_sharded_run, load_sharded_weights

__all__ = [
    "evaluate_loader",
    "evaluate_resolutions",
    "evaluate_checkpoint",
    "native_eval_rows",
    "load_checkpoint",
    "format_table",
    "write_json",
    "write_csv",
    "json_safe",
    "RESULT_KEYS",
]

RESULT_KEYS = ("resolution", "top1", "top5", "loss", "images")


@torch.no_grad()
def evaluate_loader(
    model: nn.Module,
    loader,
    ctx: DistContext | None = None,
    amp: torch.dtype | None = None,
    where: str = "",
    progress: bool = False,
) -> dict:
    """{'top1', 'top5', 'loss', 'images', 'skipped'} over a loader of Batch (top-5 is top-k with k = min(5,
    classes)). Unreadable files are left out of every number and counted in 'skipped' (with a warning naming
    `where`, the split); a split with no readable file is an error. `progress`: a bar with ETA (rank 0, terminals)."""
    ctx = ctx or DistContext()
    was_training = model.training
    model.eval()
    sums = torch.zeros(5, dtype=torch.float64)  # loss, top1, top5, images, skipped files
    bar = tqdm(
        loader,
        total=_length(loader),
        desc=f"eval {where}".strip(),
        disable=(not progress or not ctx.is_main) or None,  # None: off when stderr is not a terminal
        dynamic_ncols=True,
        leave=False,
    )
    for batch in bar:
        sums[4] += len(batch.skipped)
        if batch.inputs is None:  # every file of this batch was unreadable
            continue
        targets = batch.targets.to(ctx.device)
        logits = forward_on(model, batch.inputs, ctx.device, amp).float()
        check_labels(batch.targets, logits.shape[1], where or "the evaluation split")
        n = len(targets)
        # timm's accuracy gives percentages of the batch (top-k with k capped at the number of classes); the counts
        # are whole numbers, recovered exactly by rounding (the float error of count * 100 / n is far below 0.5)
        top1, top5 = (round(a.item() * n / 100) for a in accuracy(logits, targets, topk=(1, 5)))
        loss = F.cross_entropy(logits, targets, reduction="sum").item()
        sums[:4] += torch.tensor([loss, top1, top5, n], dtype=torch.float64)
    bar.close()
    model.train(was_training)
    sums = all_reduce_sum(sums.to(ctx.device), ctx).cpu()
    skipped, images = int(sums[4].item()), int(sums[3].item())
    if not images:  # over every process: unreadable files, an empty split, or a stream of empty/unreadable shards
        split = where or "the evaluation split"
        if skipped:
            raise ValueError(f"every image file of {split} is unreadable ({skipped} files)")
        raise ValueError(f"{split} gave no images to evaluate; check the split's files")
    if skipped and ctx.is_main:
        warnings.warn(
            f"evaluation of {where or 'the evaluation split'}: left out {skipped} unreadable image file(s); "
            f"{images} of {images + skipped} evaluated",
            SkippedImagesWarning,
            stacklevel=2,
        )
    n = max(images, 1)
    return dict(
        top1=100 * sums[1].item() / n,
        top5=100 * sums[2].item() / n,
        loss=sums[0].item() / n,
        images=images,
        skipped=skipped,
    )


def _length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable without a length: the bar counts without an ETA
        return None


def evaluate_resolutions(
    model: nn.Module,
    datasets: dict[int, Dataset],
    batch_size: int,
    workers: int = 0,
    ctx: DistContext | None = None,
    amp: torch.dtype | None = None,
    progress: bool = False,
) -> list[dict]:
    """One row per resolution: {'resolution', 'top1', 'top5', 'loss', 'images'}; `progress`: a bar per resolution."""
    ctx = ctx or DistContext()
    rows = []
    for res, ds in datasets.items():
        loader = build_eval_loader(
            ds, res, batch_size, workers, ctx.rank, ctx.world_size, pin_memory=ctx.device.type == "cuda"
        )
        where = f"{getattr(ds, 'split_dir', type(ds).__name__)} at {res} px"
        rows.append({"resolution": res, **evaluate_loader(model, loader, ctx, amp, where, progress)})
    return rows


def evaluate_model(
    model: nn.Module, cfg: Config, resolutions: list[int] | None = None, ctx: DistContext | None = None
) -> list[dict]:
    """Evaluate a model in memory (e.g. one loaded with load_checkpoint and then changed: another position mode)
    on the validation split of `cfg`'s dataset, one row per resolution."""
    ctx = ctx or DistContext()
    resolutions = [int(r) for r in (resolutions or cfg.eval_resolutions())]
    datasets = build_eval_sets(cfg, resolutions)
    amp = resolve_amp(cfg.train.amp, ctx.device)
    name = getattr(model, "default_cfg", {}).get("architecture", cfg.model.name)
    check_resolutions(model, name, datasets, ctx.device, amp)
    bs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
    return evaluate_resolutions(model, datasets, bs, cfg.data.workers, ctx, amp, cfg.train.progress)


def load_checkpoint(
    checkpoint: str | os.PathLike,
    overrides: list[str] | tuple[str, ...] = (),
    ema: bool = False,
    device: str | torch.device = "cpu",
) -> tuple[nn.Module, Config, dict]:
    """(model with the checkpoint's weights, its config with `overrides` applied, the weights' metadata).

    `checkpoint` is a run directory (its latest checkpoint, sharded or not), a .safetensors file or a sharded
    checkpoint folder (`<tag>.dcp`); a file from elsewhere needs
    `model.name=` and `data.name=` among the overrides."""
    if is_sharded_run(checkpoint):  # a train.strategy=fsdp run: its shards gathered in this process
        state, meta = load_sharded_weights(checkpoint, ema)
        path = checkpoint
    else:
        ref = find_checkpoint(checkpoint)
        if ref is None:
            raise CheckpointError(f"{checkpoint} has no checkpoint yet (no {checkpoint}/checkpoint.json)")
        path = ref.weights
        if ema:
            if ref.ema is None:
                raise CheckpointError(f"{checkpoint} has no EMA weights (train with train.ema=true)")
            path = ref.ema
        state, meta = load_weights(path)
    if "config" in meta:
        cfg = config_from_dict(json.loads(meta["config"]), f" (the config stored in {path})")
    else:
        cfg = Config()
        if not any(o.startswith("model.name=") for o in overrides):
            raise CheckpointError(
                f"{path} carries no visionpe metadata; say which model and data it is for with "
                f"model.name=... data.name=..."
            )
    cfg = apply_overrides(cfg, list(overrides))
    info = get_dataset_info(cfg.data.name)
    num_classes = int(meta.get("num_classes") or info.num_classes or 0)
    in_chans = int(meta.get("in_chans") or info.in_chans)
    if not num_classes:
        raise CheckpointError(f"{path} does not say its number of classes; it needs visionpe metadata")
    model = build_model(cfg, num_classes, in_chans)
    load_into_model(model, state, meta, cfg.model.name, path)
    return model.to(device), cfg, meta


def evaluate_checkpoint(
    checkpoint: str | os.PathLike,
    resolutions: list[int] | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    ema: bool = False,
    ctx: DistContext | None = None,
) -> list[dict]:
    """Evaluate a checkpoint on the validation split of its dataset at each resolution (default: eval.resolutions).
    Data overrides (`data.root=...`, `data.val_split=...`, `data.eval_batch_size=...`) apply as in training."""
    ctx = ctx or init_distributed("auto")
    model, cfg, meta = load_checkpoint(checkpoint, overrides, ema, ctx.device)
    resolutions = [int(r) for r in (resolutions or cfg.eval_resolutions())]
    class_map = json.loads(meta["class_map"]) if meta.get("class_map") else None
    datasets = build_eval_sets(cfg, resolutions, class_map)
    info = get_dataset_info(cfg.data.name)
    n = dataset_num_classes(info, next(iter(datasets.values())))
    if n != model.num_classes:
        raise CheckpointError(
            f"the model was trained for {model.num_classes} classes but {cfg.data.name!r} "
            f"({cfg.data.val_split}) has {n}; evaluate on the dataset it was trained on"
        )
    amp = resolve_amp(cfg.train.amp, ctx.device)
    check_resolutions(model, cfg.model.name, datasets, ctx.device, amp)
    bs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
    rows = evaluate_resolutions(model, datasets, bs, cfg.data.workers, ctx, amp, cfg.train.progress)
    plan = plan_for(cfg, model)  # data.native: also at its token budgets (native_train.py)
    if plan is not None:
        rows += native_eval_rows(model, cfg, next(iter(datasets.values())), plan, ctx, amp, bs)
    return rows


def format_table(rows: list[dict], title: str | None = None) -> str:
    lines = [title] if title else []
    lines.append(f"{'resolution':>10} {'top1':>7} {'top5':>7} {'loss':>8} {'images':>7}")
    for r in rows:
        line = f"{r['resolution']:>10} {r['top1']:>7.2f} {r['top5']:>7.2f} {r['loss']:>8.4f} {r['images']:>7}"
        lines.append(line + (f"  ({r['skipped']} unreadable left out)" if r.get("skipped") else ""))
    return "\n".join(lines)


def json_safe(row: dict) -> dict:
    """`row` with NaN / inf floats as None, and {key: "nan" | "inf" | "-inf"} under "nonfinite" (valid JSON)."""
    bad = {k: str(v) for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return row
    return {**{k: None if k in bad else v for k, v in row.items()}, "nonfinite": bad}


def write_json(rows: list[dict], path: str | os.PathLike, flag: str = "") -> None:
    """The rows as a JSON list, written atomically (a failure is one DestinationError line naming `flag`)."""
    out = [json_safe({k: r[k] for k in RESULT_KEYS}) for r in rows]
    write_text(path, json.dumps(out, indent=1, allow_nan=False) + "\n", flag)


def write_csv(rows: list[dict], path: str | os.PathLike, flag: str = "") -> None:
    """The rows as CSV, written atomically like write_json."""
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=RESULT_KEYS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    write_text(path, text.getvalue(), flag)


def native_eval_rows(
    model: nn.Module, cfg: Config, dataset: Dataset, plan: NativePlan, ctx: DistContext, amp, batch_size: int
) -> list[dict]:
    """One row per evaluation budget (resolution '<budget>tok'): each image at its aspect ratio, alone in a row."""
    rows = []
    for budget in eval_budgets(cfg, plan):
        share = Share(cfg.data.workers, ctx.rank, ctx.world_size)
        loader = build_native_eval_loader(dataset, plan, budget, batch_size, cfg.data.resolution, share)
        where = f"{cfg.data.val_split} at {budget} tokens"
        rows.append({"resolution": f"{budget}tok", **evaluate_loader(model, loader, ctx, amp, where, False)})
    return rows
