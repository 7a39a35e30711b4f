"""The training loop: any registered model on any registered dataset, at one or many resolutions, resumable exactly.

    run_dir = train(load_config("configs/quick.yaml", ["train.epochs=2"]))

Per step (`Trainer.step`): (optional) mixup/cutmix, forward under autocast, backward, gradient clipping, optimizer
step, per-step schedule update, EMA update. Per epoch: evaluation at eval.resolutions, a metrics line per resolution,
a checkpoint. The loop is made of parts, each in its own file: what the run is built from (trainer_build.py: the
strategies differ only in the model's build and in the checkpoints' backend), what a checkpoint holds
(train_state.py) and how it is written and resumed (checkpoint_manager.py), what the run reports (train_log.py:
messages, progress bar, metrics.jsonl, TensorBoard, native-batch statistics, skipped files), and what stops it
(interrupt.py: SIGTERM / SIGINT at the next step boundary with a checkpoint, a loss that is no longer finite).
Data order, augmentation and resolutions are functions of (seed, epoch, position); the checkpoint stores the global
RNGs, optimizer, scheduler, scaler and EMA, so `--resume` continues the run as if it had never stopped (a streaming
dataset cannot seek: resumed mid-epoch, that epoch's stream restarts for its remaining steps, with a warning).
The run directory is locked while a run writes it (runlock.py); a resume checks that the data is still what the run
was trained on (changes.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from timm.utils import dispatch_clip_grad
from torch import nn
from tqdm import tqdm

from ..data.datasets.folders import SkippedImagesWarning
from ..data.multires import patch_size_of_batch
from ..data.streams import is_stream
from ..models.flexi_patch import at_patch_size
from ..pos.base import PosEncoding
from .changes import adopt_accepted_changes, check_resume_changes, check_resume_data
from .checkpoint import POINTER, CheckpointError
from .checkpoint_backend import Found
from .checkpoint_manager import CheckpointCadence, CheckpointManager, CorruptCheckpointWarning, run_header
from .config import Config, ConfigError, check_training_config, load_config, save_config
from .config_sections import check_run_name
from .distributed import DistContext, all_reduce_max, barrier, init_distributed, shutdown, timeouts_explained
from .evaluate import evaluate_resolutions, format_table, native_eval_rows, write_json
from .fsdp import check_strategy, gathered
from .interrupt import DivergenceGuard, StopOnSignal, StopSignal, TrainingInterrupted
from .loss_tally import LossTally
from .metrics_log import METRICS, trim_metrics
from .native_train import NativeWindow
from .plain_checkpoint import OldLayoutResumeWarning, PlainBackend
from .run_dir import check_run_dir_is_ours
from .runlock import RunLock, writable_run_dir
from .setup import autocast, check_labels, run_model, to_device
from .sharded_checkpoint import ShardedBackend
from .tensorboard import open_tensorboard
from .train_log import LogWindow, RunLog, SkippedFiles
from .train_state import Position, RunCost, Schedule, TrainingParts
from .trainer_build import build_data, build_net, build_optimization

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


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Trainer:
    """Builds everything from a config (checking it first), then `run()` trains and returns the run directory.

    Its parts: `data`, `net` (model, EMA, DDP wrapper) and `opt` (loader, optimizer, schedule, loss, scaler) from
    trainer_build.py; `position` and `parts` (what a checkpoint holds) saved and resumed by `checkpoints`; `log`,
    `stop`, `divergence`, `cadence` (when to checkpoint)."""

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
        self.cost = RunCost()  # wall and CPU seconds from now (a resumed checkpoint adds its earlier attempts')
        self.cfg, self.ctx = cfg, ctx
        check_training_config(cfg)
        check_strategy(cfg)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.run_dir = resolve_run_dir(cfg)
        cfg.train.run_name = self.run_dir.name  # the saved config names its own directory
        self.log = RunLog(self.run_dir, ctx)
        self.lock, self.created_dir = RunLock(self.run_dir), False
        self._lock_run_dir()
        try:
            self._setup(resume, accept_changes, explicit)
        except BaseException:
            self.close()
            raise

    def _setup(self, resume: bool, accept_changes: bool, explicit: frozenset[str]) -> None:
        cfg, ctx = self.cfg, self.ctx
        backend = ShardedBackend() if cfg.train.strategy == "fsdp" else PlainBackend()  # the weights' format
        self.checkpoints = CheckpointManager(self.run_dir, ctx, backend, cfg.train.keep_checkpoints)
        found = self.checkpoints.find(resume)  # the checkpoint to resume, its world size checked
        self.resumed = found is not None
        if found is not None:  # before any work: a refused change costs nothing
            self._check_changes(found, accept_changes, explicit)
        _seed(cfg.train.seed)  # model init: the same on every rank
        self.data = data = build_data(cfg)
        if found is not None and found.meta is not None:  # the data the run was trained on
            check_resume_data(
                found.source, found.meta, found.state, data.class_map, data.num_items(), data.info.in_chans
            )
        self.net = build_net(cfg, ctx, data)
        self.opt = build_optimization(cfg, ctx, data, self.net)
        _seed(cfg.train.seed + ctx.rank)  # training randomness (drop path, mixup): its own stream per rank
        self.position = Position()  # epoch, batch, global_step
        self.tally = LossTally(ctx.device)  # the logged loss of the epoch so far (a checkpoint keeps it)
        self.parts = TrainingParts(
            model=self.net.model,
            optimizer=self.opt.optimizer,
            schedule=Schedule(self.opt.scheduler, cfg, self.opt.steps_per_epoch),
            scaler=self.opt.scaler,
            ema=self.net.ema.module if self.net.ema is not None else None,
            position=self.position,
            tally=self.tally,
            cost=self.cost,
            train_items=data.num_items(),
        )
        self.stop, self.divergence = StopSignal(ctx), DivergenceGuard(self.run_dir / POINTER)
        self.cadence = CheckpointCadence(cfg.train.ckpt_every_steps, self.opt.steps_per_epoch)
        open_tensorboard(self.run_dir, cfg.train.log_tensorboard, is_main=False)  # a missing package fails here
        if found is not None:
            self._resume(found)

    epoch = property(lambda self: self.position.epoch)
    batch = property(lambda self: self.position.batch)
    global_step = property(lambda self: self.position.global_step)

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

    # --------------------------------------------------------------------------------------------- checkpoints

    def _check_changes(self, found: Found, accept_changes: bool, explicit: frozenset[str]) -> None:
        """Repeating the original command continues the run as changed; only a key set on purpose together with
        --accept-changes changes it again (or back)."""
        cfg = self.cfg
        adopted = adopt_accepted_changes(cfg, self.run_dir, explicit if accept_changes else frozenset())
        if adopted:
            self.log.line(f"continuing with the run's accepted changes: {adopted}")
        step, epoch = found.state["global_step"], found.state["epoch"]
        check_resume_changes(cfg, self.run_dir, step, epoch, accept_changes, self.ctx.is_main)

    def save(self, finished: bool = False) -> None:
        """Every rank calls this (the backend decides who writes what)."""
        data = self.data
        header = run_header(self.cfg, data.num_classes, data.info.in_chans, data.class_map, self.position)
        self.checkpoints.save(self.parts, header, finished)

    def _resume(self, found: Found) -> None:
        self.checkpoints.load(found, self.parts, self.cfg.model.name)  # unreadable tensors: an older checkpoint
        pos, steps = self.position, self.opt.steps_per_epoch
        if self.ctx.is_main:  # forget metrics logged after the checkpoint by the run that stopped
            trim_metrics(self.run_dir / METRICS, pos.global_step)
        self.log.line(f"resumed {self.run_dir} at epoch {pos.epoch + 1}, batch {pos.batch} (step {pos.global_step})")
        if pos.batch and is_stream(self.data.train_set) and self.ctx.is_main:
            warnings.warn(
                f"{self.cfg.data.name!r} is a stream, which cannot seek: epoch {pos.epoch + 1} reads its stream "
                f"again from the start for its remaining {steps - pos.batch} of {steps} steps (some of its images "
                f"are seen twice, others not at all)",
                StreamResumeWarning,
                stacklevel=3,
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
        self.log.open_tensorboard(cfg.train.log_tensorboard)
        try:
            with StopOnSignal() as self.stop.signals:
                return self._run()
        finally:
            self.log.close()
            self.close()

    def _run(self) -> Path:
        cfg, ctx, pos, epochs, steps = self.cfg, self.ctx, self.position, self.opt.epochs, self.opt.steps_per_epoch
        self.log.line(
            f"training {cfg.model.name} on {cfg.data.name} ({len(self.data.train_set)} items, "
            f"{self.data.num_classes} classes) at {cfg.train_resolutions()} px for {epochs} epochs, "
            f"{steps} steps each, {ctx.world_size} process(es) on {self.net.device}, "
            f"amp={self.net.amp or 'none'}; run dir {self.run_dir}"
        )
        self.log.bar = tqdm(  # the whole run: ETA to the last step (evaluation time is not in it)
            total=epochs * steps,
            initial=pos.epoch * steps + pos.batch,
            desc="training",
            unit="step",
            disable=(not cfg.train.progress or not ctx.is_main) or None,  # None: off when stderr is not a terminal
            dynamic_ncols=True,
            leave=False,
        )
        rows = None
        while pos.epoch < epochs:
            self.train_epoch()
            if pos.epoch + 1 == epochs or (pos.epoch + 1) % cfg.eval.every_epochs == 0:
                rows = self.evaluate()
            pos.epoch, pos.batch = pos.epoch + 1, 0
            self.save(finished=pos.epoch == epochs)
            if pos.epoch < epochs and self.stop.received():  # arrived during the evaluation: saved just now
                raise self.stop.interrupted(pos.epoch, pos.global_step, self.run_dir)
        if rows is None:  # resumed a finished run: report its results again (every rank takes part)
            rows = self.evaluate(log_metrics=False)
        if ctx.is_main and rows:
            trained = [r for r in rows if r.get("weights") == "model"]
            write_json(trained, self.run_dir / "results.json")
            title = (
                f"{cfg.model.name} on {cfg.data.name} ({cfg.data.val_split}), trained at {cfg.train_resolutions()} px:"
            )
            self.log.line(format_table(trained, title))
        barrier(ctx)
        return self.run_dir

    def train_epoch(self) -> None:
        cfg, ctx, pos, opt, device = self.cfg, self.ctx, self.position, self.opt, self.net.device
        net = self.net.net
        net.train()
        opt.batches.set_epoch(pos.epoch)
        opt.batches.start_at(pos.batch)
        self.log.epoch_started(pos.epoch, opt.epochs)
        if pos.batch == 0:
            self.tally.reset()
        native = NativeWindow(device, self.net.plan.patch) if self.net.plan is not None else None
        window, skipped = LogWindow(self.tally, ctx, native), SkippedFiles(cfg.data.train_split, ctx, device)
        t_epoch = time.perf_counter()
        for batch in opt.loader:
            if pos.batch >= opt.steps_per_epoch:
                break
            skipped.add(batch.skipped)
            loss = self.step(net, batch)
            pos.batch, pos.global_step = pos.batch + 1, pos.global_step + 1
            window.add(loss, batch)
            self.log.step_done()
            if pos.batch % cfg.train.log_every == 0 or pos.batch == opt.steps_per_epoch:
                self._log_window(window, batch.resolution)
            stop = self.stop.received()
            if stop or self.cadence.due(pos):
                self.divergence.check_before_save(self.tally.finite(), pos.global_step)  # never save diverged weights
                self.save()
            if stop:
                raise self.stop.interrupted(pos.epoch, pos.global_step, self.run_dir)
        skipped.warn(pos.epoch)
        self.log.line(
            f"epoch {pos.epoch + 1}/{opt.epochs}: train loss {self.tally.epoch_mean():.4f}, "
            f"lr {opt.optimizer.param_groups[0]['lr']:.2e}, {time.perf_counter() - t_epoch:.1f} s"
        )

    def _log_window(self, window: LogWindow, resolution) -> None:
        mean, rate, extra = window.close()
        self.divergence.check_mean(mean, self.global_step)
        lr = self.opt.optimizer.param_groups[0]["lr"]
        row = dict(epoch=self.epoch + 1, global_step=self.global_step, loss=mean, lr=lr, img_per_s=rate)
        self.log.train_row(dict(row, resolution=resolution, **extra))

    def step(self, net: nn.Module, batch) -> torch.Tensor:
        """One training step on `batch` (`net`: the model, or its DDP wrapper); returns the loss."""
        cfg, opt, model, device = self.cfg, self.opt, self.net.model, self.net.device
        inputs = to_device(batch.inputs, device, non_blocking=True)
        check_labels(batch.targets, self.data.num_classes, cfg.data.name)
        targets = batch.targets.to(device, non_blocking=True)
        if opt.mixup is not None:
            inputs, targets = opt.mixup(inputs, targets)
        with autocast(device, self.net.amp), self._patch_size():
            loss = opt.criterion(run_model(net, inputs), targets)
            aux = model.pe.aux_loss() if isinstance(getattr(model, "pe", None), PosEncoding) else None
            loss = loss if aux is None else loss + aux  # a PE's own objective (SeqPE's), from this forward
        opt.optimizer.zero_grad(set_to_none=True)
        opt.scaler.scale(loss).backward()
        if cfg.optim.clip_grad is not None:
            opt.scaler.unscale_(opt.optimizer)
            dispatch_clip_grad(model.parameters(), cfg.optim.clip_grad, mode=cfg.optim.clip_mode)
        opt.scaler.step(opt.optimizer)
        opt.scaler.update()
        self.parts.schedule.step_update(self.global_step + 1)
        if self.net.ema is not None:
            self.net.ema.update(model, step=self.global_step + 1)
        self.divergence.first(loss)
        return loss

    def _patch_size(self):
        """data.patch_sizes: this batch's stem at its drawn patch size (FlexiViT; a function of the seed, epoch and
        batch position, so a resumed run draws the same)."""
        sizes = self.cfg.data.patch_sizes
        if not sizes:
            return contextlib.nullcontext()
        return at_patch_size(self.net.model, patch_size_of_batch(sizes, self.cfg.train.seed, self.epoch, self.batch))

    # ---------------------------------------------------------------------------------------------- evaluation

    def _eval_rows(self, model: nn.Module, bs: int) -> list[dict]:
        """A row per eval resolution, then (data.native) per token budget."""
        cfg, ctx, amp = self.cfg, self.ctx, self.net.amp
        rows = evaluate_resolutions(model, self.data.eval_sets, bs, cfg.data.workers, ctx, amp, cfg.train.progress)
        if self.net.plan is not None:
            val = next(iter(self.data.eval_sets.values()))
            rows += native_eval_rows(model, cfg, val, self.net.plan, ctx, amp, bs)
        return rows

    def evaluate(self, log_metrics: bool = True) -> list[dict]:
        cfg, ctx, model, ema = self.cfg, self.ctx, self.net.model, self.net.ema
        bs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
        with gathered(model):  # fsdp: parameters gathered for the whole evaluation (ranks' batches differ)
            rows = [dict(r, weights="model") for r in self._eval_rows(model, bs)]
        if ema is not None and cfg.eval.ema:
            with gathered(ema.module):
                rows += [dict(r, weights="ema") for r in self._eval_rows(ema.module, bs)]
        for r in rows if log_metrics else ():
            self.log.row(kind="eval", epoch=self.epoch + 1, global_step=self.global_step, **r)
        summary = ", ".join(
            f"{r['weights'] + ' ' if r['weights'] != 'model' else ''}@{r['resolution']} {r['top1']:.2f}" for r in rows
        )
        self.log.line(f"epoch {self.epoch + 1}/{self.opt.epochs}: {cfg.data.val_split} top-1 {summary}")
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
