"""What a training run reports: one-line messages and its progress bar (rank 0), metrics.jsonl rows and TensorBoard
scalars (RunLog); the loss, throughput and native-batch statistics of each window of `train.log_every` steps
(LogWindow); the unreadable files an epoch skipped (SkippedFiles)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from tqdm import tqdm

from ..data.datasets.folders import SkippedImagesWarning
from .distributed import DistContext, all_reduce_sum
from .evaluate import json_safe
from .loss_tally import LossTally
from .metrics_log import METRICS, append_metrics
from .native_train import NativeWindow
from .tensorboard import open_tensorboard

__all__ = ["RunLog", "LogWindow", "SkippedFiles"]


class RunLog:
    def __init__(self, run_dir: Path, ctx: DistContext):
        self.run_dir, self.ctx = run_dir, ctx
        self.bar, self.tb = None, None  # the run's progress bar (the trainer makes it), its TensorBoard writer

    def open_tensorboard(self, on: bool) -> None:
        self.tb = open_tensorboard(self.run_dir, on, self.ctx.is_main)

    def close(self) -> None:
        for out in (self.bar, self.tb):
            if out is not None:
                out.close()

    def line(self, msg: str) -> None:
        if self.ctx.is_main:
            tqdm.write(msg)

    def epoch_started(self, epoch: int, epochs: int) -> None:
        self.bar.set_description(f"epoch {epoch + 1}/{epochs}")

    def step_done(self) -> None:
        self.bar.update(1)

    def train_row(self, row: dict) -> None:
        """A window's metrics line, also shown on the bar."""
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}", img_s=f"{row['img_per_s']:.0f}")
        self.row(kind="train", **row)

    def row(self, **row) -> None:
        """A metrics.jsonl row (rank 0) and its TensorBoard scalars."""
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


class LogWindow:
    """The steps since the last metrics line: their loss (the epoch's LossTally), images per second and, with native
    batches, padding, images and tokens per batch (native_train.NativeWindow)."""

    def __init__(self, tally: LossTally, ctx: DistContext, native: NativeWindow | None):
        self.tally, self.ctx, self.native = tally, ctx, native
        self.images, self.t0 = 0, time.perf_counter()

    def add(self, loss: torch.Tensor, batch) -> None:
        self.tally.add(loss)
        self.images += len(batch.targets) * self.ctx.world_size
        if self.native is not None:
            self.native.add(batch)

    def close(self) -> tuple[float, float, dict]:
        """The window's mean loss (over every rank), images per second and native statistics; a new window begins."""
        mean = self.tally.close(self.ctx)
        extra = self.native.row(self.ctx) if self.native is not None else {}  # padding, images, tokens per batch
        images = extra.pop("images", self.images)
        rate = images / max(time.perf_counter() - self.t0, 1e-9)
        self.images, self.t0 = 0, time.perf_counter()
        return mean, rate, extra


class SkippedFiles:
    """The unreadable files of an epoch, each replaced by the next readable one: one warning at its end."""

    def __init__(self, split: str, ctx: DistContext, device: torch.device):
        self.split, self.ctx, self.device = split, ctx, device
        self.files: list[str] = []

    def add(self, files: list[str]) -> None:
        self.files += files

    def warn(self, epoch: int) -> None:
        """Every rank (the count is summed); rank 0 warns."""
        files = sorted(set(self.files))  # a file is tried again by each neighbour that stands in for it
        n = int(all_reduce_sum(torch.tensor(float(len(files)), device=self.device), self.ctx).item())
        if n and self.ctx.is_main:
            warnings.warn(
                f"epoch {epoch + 1}: skipped {n} unreadable image file(s) of {self.split}, "
                f"each replaced by the next readable one (e.g. {files[0] if files else 'on another rank'})",
                SkippedImagesWarning,
                stacklevel=3,
            )
