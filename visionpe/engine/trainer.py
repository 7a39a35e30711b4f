"""The training loop: any registered model on any registered dataset, at one or many resolutions, resumable exactly.

    run_dir = train(load_config("configs/quick.yaml", ["train.epochs=2"]))

Per step: (optional) mixup/cutmix, forward under autocast, backward, gradient clipping, optimizer step, per-step
schedule update, EMA update. Per epoch: evaluation at eval.resolutions, a metrics line per resolution, a checkpoint.
One progress bar (ETA for the whole run) and one per evaluation; optional TensorBoard scalars (tensorboard.py).
Data order, augmentation and resolutions are functions of (seed, epoch, position); the checkpoint stores the global
RNGs, optimizer, scheduler, scaler and EMA, so `--resume` continues the run as if it had never stopped (a streaming
dataset cannot seek: resumed mid-epoch, that epoch's stream restarts for its remaining steps, with a warning).
The run directory is locked while a run writes it (runlock.py); SIGTERM / SIGINT stop at the next step boundary
with a checkpoint (interrupt.py); a resume checks that the data is still what the run was trained on (changes.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..data import get_dataset_info
from ..data.folders import SkippedImagesWarning
from ..data.loader import build_train_loader, dataset_num_classes, epoch_batches, renders_any_resolution
from ..data.multires import patch_size_of_batch
from ..data.streams import first_stream_item, is_stream
from ..models.flexi_patch import at_patch_size, flexi_patch_refusal
from ..pos.base import PosEncoding
from .changes import adopt_accepted_changes, check_resume_changes, check_resume_data
from .checkpoint import POINTER, CheckpointError
from .checkpoint_manager import CheckpointManager, CorruptCheckpointWarning, run_header
from .config import (
    Config,
    ConfigError,
    check_run_name,
    check_training_config,
    load_config,
    save_config,
)
from .distributed import (
    DistContext,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    init_distributed,
    shutdown,
    timeouts_explained,
)
from .evaluate import evaluate_resolutions, format_table, json_safe, native_eval_rows, write_json
from .fsdp import ShardedEma, build_sharded_model, check_strategy, gathered
from .interrupt import StopOnSignal, TrainingInterrupted, diverged, interrupted
from .loss_tally import LossTally
from .metrics_log import METRICS, append_metrics, trim_metrics
from .native_train import NativeWindow, check_native, plan_for
from .plain_checkpoint import OldLayoutResumeWarning, PlainBackend
from .run_dir import check_run_dir_is_ours
from .runlock import RunLock, writable_run_dir
from .setup import (
    autocast,
    build_eval_sets,
    build_model,
    build_split,
    check_labels,
    check_resolutions,
    resolve_amp,
    run_model,
    to_device,
)
from .sharded_checkpoint import ShardedBackend
from .tensorboard import open_tensorboard
from .train_state import Position, RunCost, Schedule, TrainingParts

__all__ = [
    "train",
    "Trainer",
    "SkippedImagesWarning",
    "CorruptCheckpointWarning",
    "StreamResumeWarning",
    "resolve_run_dir",
    "METRICS",
    "TrainingInterrupted",
    "OldLayoutResumeWarning",
]


class StreamResumeWarning(UserWarning):
    """A run on a streaming dataset resumed mid-epoch: the epoch's stream restarts (see data/streams.py)."""


def resolve_run_dir(cfg: Config) -> Path:
    """train.output_dir / the run's name: a plain folder name (no separators, `.` or `..`; a ConfigError if not)."""
    # the default name comes from the dataset's, which may be a path (hfids/<folder>): its separators become '_'
    default = re.sub(r"[/\\\0]+", "_", cfg.data.name).lstrip(".") + "-{model}"
    name = (cfg.train.run_name or default).replace("{model}", cfg.model.name)
    try:
        check_run_name(name)
    except ValueError as e:
        raise ConfigError(f"train.run_name: {e}") from None
    return Path(cfg.train.output_dir).expanduser() / name


class Trainer:
    """Builds everything from a config (checking it first), then `run()` trains and returns the run directory."""

    def __init__(
        self,
        cfg: Config,
        ctx: DistContext,
        resume: bool = False,
        accept_changes: bool = False,
        explicit: frozenset[str] = frozenset(),
    ):
        """`explicit`: the keys the caller set (the overrides). On resume, keys that still have the run's original
        value follow its accepted changes, except explicit ones under `accept_changes` (a change back on purpose).
        The run directory is locked until `close()`."""
        self.cost = RunCost()  # wall and CPU seconds, from here (a checkpoint adds its earlier attempts')
        self.cfg, self.ctx = cfg, ctx
        check_training_config(cfg)
        check_strategy(cfg)
        self.sharded = cfg.train.strategy == "fsdp"  # FSDP2 (fsdp.py), sharded checkpoints (sharded_checkpoint.py)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.run_dir = resolve_run_dir(cfg)
        cfg.train.run_name = self.run_dir.name  # the saved config names its own directory
        self.lock, self.created_dir = RunLock(self.run_dir), False
        self._lock_run_dir()
        try:
            self._setup(resume, accept_changes, explicit)
        except BaseException:
            self.close()
            raise

    def _setup(self, resume: bool, accept_changes: bool, explicit: frozenset[str]) -> None:
        cfg, ctx = self.cfg, self.ctx
        backend = ShardedBackend() if self.sharded else PlainBackend()  # the storage format of the checkpoints
        self.checkpoints = CheckpointManager(self.run_dir, ctx, backend, cfg.train.keep_checkpoints)
        self.found = self.checkpoints.find(resume)  # the checkpoint to resume, its world size checked
        self.resumed = self.found is not None
        if self.found is not None:  # before any work: a refused change costs nothing
            # repeating the original command continues the run as changed; only a key set on purpose together with
            # --accept-changes changes it again (or back)
            adopted = adopt_accepted_changes(cfg, self.run_dir, explicit if accept_changes else frozenset())
            if adopted:
                self.log(f"continuing with the run's accepted changes: {adopted}")
            ts = self.found.state
            check_resume_changes(cfg, self.run_dir, ts["global_step"], ts["epoch"], accept_changes, ctx.is_main)
        torch.manual_seed(cfg.train.seed)  # model init: the same on every rank
        random.seed(cfg.train.seed)
        np.random.seed(cfg.train.seed)
        self._build_data()
        if self.found is not None and self.found.meta is not None:  # the data the run was trained on
            found = self.found
            check_resume_data(
                found.source, found.meta, found.state, self.class_map, self._num_items(), self.info.in_chans
            )
        self._build_model()
        self._build_optimization()
        torch.manual_seed(cfg.train.seed + ctx.rank)  # training randomness (drop path, mixup): its own stream per rank
        random.seed(cfg.train.seed + ctx.rank)
        np.random.seed(cfg.train.seed + ctx.rank)
        self.position = Position()  # epoch, batch, global_step
        self.tally = LossTally(self.device)  # the logged loss of the epoch so far (a checkpoint keeps it)
        self.parts = TrainingParts(
            self.model,
            self.optimizer,
            self.schedule,
            self.scaler,
            self.ema.module if self.ema is not None else None,
            self.position,
            self.tally,
            self.cost,
            self._num_items(),
        )
        self.bar, self.tb, self.stop, self.first_loss = None, None, StopOnSignal(), None
        open_tensorboard(self.run_dir, cfg.train.log_tensorboard, is_main=False)  # a missing package fails here
        if self.found is not None:
            self._resume()
            self.found = None

    epoch = property(lambda self: self.position.epoch)
    batch = property(lambda self: self.position.batch)
    global_step = property(lambda self: self.position.global_step)

    def _build_data(self) -> None:
        """Data first: image folders tell the number of classes; a missing directory fails here, before any work."""
        cfg = self.cfg
        self.info = get_dataset_info(cfg.data.name)
        train_res = cfg.train_resolutions()
        base = cfg.data.resolution if len(train_res) == 1 else max(train_res)
        self.train_set = build_split(cfg, cfg.data.train_split, base, training=True)
        self.num_classes = dataset_num_classes(self.info, self.train_set)
        self.class_map = getattr(self.train_set, "class_to_idx", None)
        self.eval_sets = build_eval_sets(cfg, cfg.eval_resolutions(), self.class_map)
        if len(train_res) > 1 and not cfg.data.native and not renders_any_resolution(self.train_set):
            sample = (first_stream_item(self.train_set) if is_stream(self.train_set) else self.train_set[0])[0]
            if not isinstance(sample, torch.Tensor):
                raise ConfigError(
                    f"multi-resolution training resizes tensors, but {cfg.data.name!r} yields "
                    f"{type(sample).__name__} inputs and has no render(index, resolution)"
                )

    def _build_model(self) -> None:
        """The model (and its EMA, DDP wrapper), checked at every resolution it will see."""
        cfg, ctx, train_res = self.cfg, self.ctx, self.cfg.train_resolutions()
        self.device = ctx.device
        self.amp = resolve_amp(cfg.train.amp, self.device)
        cfg.model.img_size = cfg.model.img_size or cfg.data.resolution  # the resolved config records it
        if self.sharded:
            self.model = build_sharded_model(cfg, self.num_classes, self.info.in_chans, ctx, self.amp)
        else:
            self.model = build_model(cfg, self.num_classes, self.info.in_chans).to(self.device)
            if cfg.train.activation_checkpointing:
                self.model.set_grad_checkpointing(True)
        self.plan = plan_for(cfg, self.model)  # data.native: native-aspect batches (native_train.py)
        if self.plan is None:
            check_resolutions(self.model, cfg.model.name, {r: self.train_set for r in train_res}, self.device, self.amp)
        else:
            check_native(
                self.model, cfg.model.name, self.train_set, self.plan, cfg.data.resolution, self.device, self.amp
            )
        check_resolutions(self.model, cfg.model.name, self.eval_sets, self.device, self.amp)
        why = flexi_patch_refusal(self.model) if cfg.data.patch_sizes else None
        if why:
            raise ConfigError(f"data.patch_sizes: {cfg.model.name} cannot train at a patch size per batch: {why}")
        self.ema = None
        if cfg.train.ema and self.sharded:
            ema_model = build_sharded_model(cfg, self.num_classes, self.info.in_chans, ctx, self.amp)
            self.ema = ShardedEma(ema_model, self.model, decay=cfg.train.ema_decay)
        elif cfg.train.ema:
            self.ema = ModelEmaV3(self.model, decay=cfg.train.ema_decay)
        self.ddp = (
            DistributedDataParallel(self.model, device_ids=[self.device] if self.device.type == "cuda" else None)
            if ctx.distributed and not self.sharded
            else None
        )

    def _build_optimization(self) -> None:
        """Loader, optimizer, schedule (per step), loss with optional mixup/cutmix, gradient scaler."""
        cfg, ctx, train_res = self.cfg, self.ctx, self.cfg.train_resolutions()
        self.loader = build_train_loader(
            self.train_set,
            cfg.data.batch_size,
            train_res,
            cfg.train.seed,
            cfg.data.workers,
            ctx.rank,
            ctx.world_size,
            pin_memory=self.device.type == "cuda",
            native=self.plan,
            aug=dataclasses.asdict(cfg.aug),
        )
        self.batches = epoch_batches(self.loader)
        full = self.batches.num_batches()
        self.steps_per_epoch = min(full, cfg.train.max_steps_per_epoch) if cfg.train.max_steps_per_epoch else full
        o = cfg.optim
        lr = o.lr * cfg.data.batch_size * ctx.world_size / o.lr_base_size if o.lr_base_size else o.lr
        extra = {k: v for k, v in (("betas", tuple(o.betas) if o.betas else None), ("eps", o.eps)) if v is not None}
        self.optimizer = create_optimizer_v2(
            self.model,
            o.opt,
            lr=lr,
            weight_decay=o.weight_decay,
            momentum=o.momentum,
            layer_decay=o.layer_decay,
            **extra,
        )
        self.scheduler, self.epochs = None, cfg.train.epochs
        if o.sched != "none":
            self.scheduler, self.epochs = create_scheduler_v2(
                self.optimizer,
                o.sched,
                num_epochs=cfg.train.epochs,
                warmup_epochs=o.warmup_epochs,
                warmup_lr=o.warmup_lr,
                min_lr=o.min_lr,
                cooldown_epochs=o.cooldown_epochs,
                step_on_epochs=False,
                updates_per_epoch=self.steps_per_epoch,
            )
        self.schedule = Schedule(self.scheduler, cfg, self.steps_per_epoch)
        a = cfg.aug
        self.mixup = None
        if a.mixup > 0 or a.cutmix > 0:
            if self.info.kind != "image":
                raise ConfigError(f"mixup/cutmix apply to image sets; {cfg.data.name!r} is {self.info.kind!r}")
            self.mixup = Mixup(
                mixup_alpha=a.mixup,
                cutmix_alpha=a.cutmix,
                prob=a.mixup_prob,
                switch_prob=a.mixup_switch_prob,
                mode=a.mixup_mode,
                label_smoothing=a.label_smoothing,
                num_classes=self.num_classes,
            )
            self.criterion = SoftTargetCrossEntropy()
        else:
            self.criterion = nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == torch.float16)

    # ------------------------------------------------------------------------------------------------ run dir

    def _lock_run_dir(self) -> None:
        """Rank 0 creates the run directory (a one-line error if it cannot be written) and locks it; every rank
        learns whether that worked, so that all fail together."""
        error = None
        if self.ctx.is_main:
            try:
                check_run_dir_is_ours(self.run_dir)  # never another folder's config.yaml / metrics.jsonl
                self.created_dir = writable_run_dir(self.run_dir)
                self.lock.acquire()
            except ValueError as e:  # ConfigError, RunLockedError
                error = e
        if all_reduce_max(int(error is not None), self.ctx):
            self.close()
            raise error or ConfigError(f"rank 0 could not lock the run directory {self.run_dir}; see its error")

    def close(self) -> None:
        """Release the run directory (and remove it if this run created it and wrote nothing into it)."""
        self.lock.release()
        only_lock = self.run_dir.is_dir() and all(p.name == self.lock.path.name for p in self.run_dir.iterdir())
        if self.created_dir and self.ctx.is_main and only_lock:
            self.lock.path.unlink(missing_ok=True)
            self.run_dir.rmdir()
        self.created_dir = False

    def _num_items(self) -> int | None:
        try:
            return len(self.train_set)
        except TypeError:  # a stream without a length
            return None

    def _metrics(self, **row) -> None:
        if self.ctx.is_main:
            append_metrics(self.run_dir / METRICS, json_safe(row))
        if self.tb is not None:
            self._tensorboard(row)

    def _tensorboard(self, row: dict) -> None:
        step = row["global_step"]
        if row["kind"] == "train":
            for key in ("loss", "lr", "img_per_s"):
                self.tb.add_scalar(f"train/{key}", row[key], step)
        else:  # eval: one curve per weights and resolution, e.g. val/top1@32 or val_ema/top1@32
            group = "val" if row.get("weights", "model") == "model" else f"val_{row['weights']}"
            for key in ("top1", "top5", "loss"):
                self.tb.add_scalar(f"{group}/{key}@{row['resolution']}", row[key], step)

    def log(self, msg: str) -> None:
        if self.ctx.is_main:
            tqdm.write(msg)

    # --------------------------------------------------------------------------------------------- checkpoints

    def save(self, finished: bool = False) -> None:
        """Every rank calls this (checkpoint_manager.py: the backend decides who writes what)."""
        header = run_header(self.cfg, self.num_classes, self.info.in_chans, self.class_map, self.position)
        self.checkpoints.save(self.parts, header, finished)

    def _resume(self) -> None:
        self.checkpoints.load(self.found, self.parts, self.cfg.model.name)  # unreadable: an older checkpoint
        if self.ctx.is_main:  # forget metrics logged after the checkpoint by the run that stopped
            trim_metrics(self.run_dir / METRICS, self.global_step)
        self.log(f"resumed {self.run_dir} at epoch {self.epoch + 1}, batch {self.batch} (step {self.global_step})")
        if self.batch and is_stream(self.train_set) and self.ctx.is_main:
            warnings.warn(
                f"{self.cfg.data.name!r} is a stream, which cannot seek: epoch {self.epoch + 1} reads its stream "
                f"again from the start for its remaining {self.steps_per_epoch - self.batch} of "
                f"{self.steps_per_epoch} steps (some of its images are seen twice, others not at all)",
                StreamResumeWarning,
                stacklevel=2,
            )

    # ---------------------------------------------------------------------------------------------------- loop

    def run(self) -> Path:
        cfg, ctx = self.cfg, self.ctx
        if ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not self.resumed or not (self.run_dir / "config.yaml").is_file():
                save_config(cfg, self.run_dir / "config.yaml")  # the original; accepted changes: config_changes.jsonl
            if not self.resumed:  # a fresh run: no metrics from an earlier attempt that never checkpointed
                (self.run_dir / METRICS).unlink(missing_ok=True)
        barrier(ctx)
        self.tb = open_tensorboard(self.run_dir, cfg.train.log_tensorboard, ctx.is_main)
        try:
            with StopOnSignal() as self.stop:
                return self._run()
        finally:
            if self.bar is not None:
                self.bar.close()
            if self.tb is not None:
                self.tb.close()
            self.close()

    def _run(self) -> Path:
        cfg, ctx = self.cfg, self.ctx
        self.log(
            f"training {cfg.model.name} on {cfg.data.name} ({len(self.train_set)} items, "
            f"{self.num_classes} classes) at {cfg.train_resolutions()} px for {self.epochs} epochs, "
            f"{self.steps_per_epoch} steps each, {ctx.world_size} process(es) on {self.device}, "
            f"amp={self.amp or 'none'}; run dir {self.run_dir}"
        )
        self.bar = tqdm(  # the whole run: ETA to the last step (evaluation time is not in it)
            total=self.epochs * self.steps_per_epoch,
            initial=self.epoch * self.steps_per_epoch + self.batch,
            desc="training",
            unit="step",
            disable=(not cfg.train.progress or not ctx.is_main) or None,  # None: off when stderr is not a terminal
            dynamic_ncols=True,
            leave=False,
        )
        rows = None
        while self.epoch < self.epochs:
            self.train_epoch()
            last = self.epoch + 1 == self.epochs
            if last or (self.epoch + 1) % cfg.eval.every_epochs == 0:
                rows = self.evaluate()
            self.position.epoch, self.position.batch = self.epoch + 1, 0
            self.save(finished=self.epoch == self.epochs)
            if self.epoch < self.epochs and self._stop_signal():  # arrived during the evaluation: saved just now
                raise self._interrupted()
        if rows is None:  # resumed a finished run: report its results again (every rank takes part)
            rows = self.evaluate(log_metrics=False)
        if ctx.is_main and rows:
            write_json([r for r in rows if r.get("weights") == "model"], self.run_dir / "results.json")
            self.log(
                format_table(
                    [r for r in rows if r.get("weights") == "model"],
                    f"{cfg.model.name} on {cfg.data.name} ({cfg.data.val_split}), trained at "
                    f"{cfg.train_resolutions()} px:",
                )
            )
        barrier(ctx)
        return self.run_dir

    def train_epoch(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        net = self.ddp or self.model
        net.train()
        self.batches.set_epoch(self.epoch)
        self.batches.start_at(self.batch)
        bar = self.bar
        bar.set_description(f"epoch {self.epoch + 1}/{self.epochs}")
        if self.batch == 0:
            self.tally.reset()
        tally, window_images, t0 = self.tally, 0, time.perf_counter()
        skipped, t_epoch = [], time.perf_counter()
        native = NativeWindow(self.device, self.plan.patch) if self.plan is not None else None
        for batch in self.loader:
            if self.batch >= self.steps_per_epoch:
                break
            skipped += batch.skipped
            loss = self.step(net, batch)
            self.position.batch += 1
            self.position.global_step += 1
            tally.add(loss)
            window_images += len(batch.targets) * ctx.world_size
            if native is not None:
                native.add(batch)
            bar.update(1)
            if self.batch % cfg.train.log_every == 0 or self.batch == self.steps_per_epoch:
                mean = tally.close(ctx)
                if not math.isfinite(mean):
                    raise self._diverged(f"loss became {mean} by step {self.global_step}")
                extra = native.row(ctx) if native is not None else {}  # padding, images and tokens per batch
                window_images = extra.pop("images", window_images)
                rate = window_images / max(time.perf_counter() - t0, 1e-9)
                lr = self.optimizer.param_groups[0]["lr"]
                bar.set_postfix(loss=f"{mean:.4f}", lr=f"{lr:.2e}", img_s=f"{rate:.0f}")
                self._metrics(
                    kind="train",
                    epoch=self.epoch + 1,
                    global_step=self.global_step,
                    loss=mean,
                    lr=lr,
                    img_per_s=rate,
                    resolution=batch.resolution,
                    **extra,
                )
                window_images, t0 = 0, time.perf_counter()
            every = cfg.train.ckpt_every_steps
            stop = self._stop_signal()
            if stop or (every and self.global_step % every == 0 and self.batch < self.steps_per_epoch):
                if not tally.finite():  # never checkpoint diverged weights
                    raise self._diverged(f"loss became non-finite by step {self.global_step}")
                self.save()
            if stop:
                raise self._interrupted()
        skipped = sorted(set(skipped))  # a file is tried again by each neighbour that stands in for it
        n_skipped = int(all_reduce_sum(torch.tensor(float(len(skipped)), device=self.device), ctx).item())
        if n_skipped and ctx.is_main:
            warnings.warn(
                f"epoch {self.epoch + 1}: skipped {n_skipped} unreadable image file(s) of {cfg.data.train_split}, "
                f"each replaced by the next readable one (e.g. {skipped[0] if skipped else 'on another rank'})",
                SkippedImagesWarning,
                stacklevel=2,
            )
        elapsed = time.perf_counter() - t_epoch
        self.log(
            f"epoch {self.epoch + 1}/{self.epochs}: train loss {tally.epoch_mean():.4f}, "
            f"lr {self.optimizer.param_groups[0]['lr']:.2e}, {elapsed:.1f} s"
        )

    def _stop_signal(self) -> int:
        """The stop signal (SIGTERM / SIGINT) any rank received, 0 if none: every rank stops at the same step."""
        return all_reduce_max(self.stop.signum, self.ctx)

    def _interrupted(self) -> TrainingInterrupted:
        return interrupted(self._stop_signal(), self.epoch, self.global_step, self.run_dir)

    def _diverged(self, what: str) -> FloatingPointError:
        return diverged(what, self.first_loss, self.run_dir / POINTER)

    def step(self, net: nn.Module, batch) -> torch.Tensor:
        inputs = to_device(batch.inputs, self.device, non_blocking=True)
        check_labels(batch.targets, self.num_classes, self.cfg.data.name)
        targets = batch.targets.to(self.device, non_blocking=True)
        if self.mixup is not None:
            inputs, targets = self.mixup(inputs, targets)
        with autocast(self.device, self.amp), self._patch_size():
            loss = self.criterion(run_model(net, inputs), targets)
            aux = self.model.pe.aux_loss() if isinstance(getattr(self.model, "pe", None), PosEncoding) else None
            loss = loss if aux is None else loss + aux  # a PE's own objective (SeqPE's), from this forward
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.optim.clip_grad is not None:
            self.scaler.unscale_(self.optimizer)
            dispatch_clip_grad(self.model.parameters(), self.cfg.optim.clip_grad, mode=self.cfg.optim.clip_mode)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.schedule.step_update(self.global_step + 1)
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step + 1)
        if self.first_loss is None:  # one sync, to tell a model that is broken from the start from a divergence
            self.first_loss = float(loss.detach())
        return loss

    def _patch_size(self):
        """data.patch_sizes: this batch's stem at its drawn patch size (FlexiViT; a function of the seed, epoch and
        batch position, so a resumed run draws the same)."""
        sizes = self.cfg.data.patch_sizes
        if not sizes:
            return contextlib.nullcontext()
        return at_patch_size(self.model, patch_size_of_batch(sizes, self.cfg.train.seed, self.epoch, self.batch))

    def _eval_rows(self, model: nn.Module, bs: int) -> list[dict]:
        """A row per eval resolution, then (data.native) per token budget."""
        cfg, ctx = self.cfg, self.ctx
        rows = evaluate_resolutions(model, self.eval_sets, bs, cfg.data.workers, ctx, self.amp, cfg.train.progress)
        if self.plan is not None:
            val = next(iter(self.eval_sets.values()))
            rows += native_eval_rows(model, cfg, val, self.plan, ctx, self.amp, bs)
        return rows

    def evaluate(self, log_metrics: bool = True) -> list[dict]:
        cfg, ctx = self.cfg, self.ctx
        bs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
        with gathered(self.model):  # fsdp: parameters gathered for the whole evaluation (ranks' batches differ)
            rows = [dict(r, weights="model") for r in self._eval_rows(self.model, bs)]
        if self.ema is not None and cfg.eval.ema:
            with gathered(self.ema.module):
                rows += [dict(r, weights="ema") for r in self._eval_rows(self.ema.module, bs)]
        for r in rows if log_metrics else ():
            self._metrics(kind="eval", epoch=self.epoch + 1, global_step=self.global_step, **r)
        summary = ", ".join(
            f"{r['weights'] + ' ' if r['weights'] != 'model' else ''}@{r['resolution']} {r['top1']:.2f}" for r in rows
        )
        self.log(f"epoch {self.epoch + 1}/{self.epochs}: {cfg.data.val_split} top-1 {summary}")
        bad = [f"{r['loss']} at {r['resolution']} px" for r in rows if not math.isfinite(r["loss"])]
        if bad and ctx.is_main:
            warnings.warn(
                f"epoch {self.epoch + 1}: {cfg.data.val_split} loss is {', '.join(bad)} (non-finite logits); "
                f"recorded as null with a 'nonfinite' flag in {METRICS} and results.json",
                RuntimeWarning,
                stacklevel=2,
            )
        return rows


def train(
    config: Config | str | os.PathLike | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    resume: bool | str | os.PathLike = False,
    accept_changes: bool = False,
) -> Path:
    """Train and return the run directory. `config` is a Config or a YAML path (+ `overrides`); `resume=True`
    continues the run directory the config names, `resume=<run dir>` continues that one with its saved config.
    A resume whose config changes what was trained (changes.FREE_KEYS aside) is refused unless `accept_changes`."""
    if isinstance(resume, (str, os.PathLike)):
        run_dir = Path(resume).expanduser()
        if run_dir.name in ("", ".."):  # `--resume .`: the folder's own name is the run's
            run_dir = Path(os.path.abspath(run_dir))
        if not (run_dir / "config.yaml").is_file():
            raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml); nothing to resume")
        cfg = load_config(run_dir / "config.yaml", overrides) if config is None else _as_config(config, overrides)
        cfg.train.output_dir, cfg.train.run_name = str(run_dir.parent), run_dir.name
        resume = True
    else:
        cfg = _as_config(config, overrides)
    owns_group = not torch.distributed.is_initialized()
    threads = torch.get_num_threads()
    ctx = init_distributed(cfg.train.device, cfg.train.dist_timeout)
    explicit = frozenset(o.split("=", 1)[0].strip() for o in overrides)
    try:
        with timeouts_explained(ctx, cfg.train.dist_timeout, resolve_run_dir(cfg)):
            trainer = Trainer(cfg, ctx, resume=bool(resume), accept_changes=accept_changes, explicit=explicit)
            return trainer.run()
    finally:
        torch.set_num_threads(threads)  # train.threads applies to this run only
        if owns_group:
            shutdown(ctx)  # a process group the caller set up stays up


def _as_config(config, overrides) -> Config:
    if config is None or isinstance(config, (str, os.PathLike)):
        return load_config(config, overrides)
    if isinstance(config, Config):
        from .config import apply_overrides

        return apply_overrides(config, list(overrides))
    raise TypeError(f"config must be a Config or a YAML path, got {type(config).__name__}")
