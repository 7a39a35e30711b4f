"""What the trainer does differently under `data.native` (native-aspect batches, see data/native/loader.py): the
plan from the settings and the model's patch size, a trial forward pass, the batch statistics of the metrics
lines (padding fraction, images and tokens per batch, summed over ranks) and the evaluation at token budgets."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import get_dataset_info
from ..data.native.loader import native_trials
from ..data.native.plan import NativePlan, native_mode, native_plan
from .config import Config, ConfigError, native_settings
from .distributed import DistContext, all_reduce_sum
from .setup import forward_on

__all__ = ["plan_for", "check_native", "NativeWindow", "eval_budgets"]


def model_patch_size(model: nn.Module) -> int | None:
    embed = getattr(model, "patch_embed", None)
    size = getattr(embed, "patch_size", None)
    return int(size[0] if isinstance(size, (tuple, list)) else size) if size is not None else None


def plan_for(cfg: Config, model: nn.Module) -> NativePlan | None:
    """The NativePlan of cfg.data.native for `model` (None when native batches are off); the checks across keys."""
    settings = native_settings(cfg)
    if settings is None:
        return None
    kind = get_dataset_info(cfg.data.name).kind
    if kind != "image":
        raise ConfigError(
            f"data.native takes image datasets (e.g. synthetic-shapes, fashion-mnist-native, imagefolder); "
            f"dataset {cfg.data.name!r} is of kind {kind!r}: drop data.native"
        )
    if cfg.aug.mixup > 0 or cfg.aug.cutmix > 0:
        raise ConfigError("mixup/cutmix mix images of one size; turn them off with data.native (aug.mixup=0)")
    patch = model_patch_size(model)
    if settings.patch_size is not None and patch is not None and settings.patch_size != patch:
        raise ConfigError(
            f"data.native.patch_size={settings.patch_size} but {cfg.model.name} has {patch} px patches; "
            f"drop the key (it defaults to the model's) or set it to {patch}"
        )
    patch = settings.patch_size or patch
    if patch is None:  # a convolutional stem (CvT): one image size per batch, tokens of its total stride
        stride = (getattr(model, "feature_info", None) or [{}])[-1].get("reduction", 16)
        need = "data.native.mode=buckets (one size per batch) and " if native_mode(settings.mode).patches else ""
        raise ConfigError(
            f"{cfg.model.name} has no patch_embed.patch_size (it takes images, not patch sequences); set "
            f"{need}data.native.patch_size={stride} (its total stride)"
        )
    try:
        return native_plan(settings, patch)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def eval_budgets(cfg: Config, plan: NativePlan) -> list[int]:
    return plan.eval_budgets


@torch.no_grad()
def check_native(model: nn.Module, name: str, dataset: Dataset, plan: NativePlan, resolution: int, device, amp) -> None:
    """A forward pass of each trial batch of the plan's mode (two images at the largest budget, padded, and packed
    when packing; one image per bucket size), so that a model without native batches fails now with one line."""
    was_training = model.training
    model.eval()
    try:
        for trial in native_trials(dataset, plan, resolution):
            try:
                out = forward_on(model, trial.batch.inputs, device, amp)
            except (RuntimeError, ValueError, TypeError, AssertionError) as e:
                raise ValueError(f"model {name!r} cannot take {trial.what}: {e}{trial.fix}") from None
            if trial.images is not None and out.shape[0] != trial.images:
                raise ValueError(
                    f"model {name!r} gave {out.shape[0]} outputs for {trial.images} images of a native batch"
                )
    finally:
        model.train(was_training)


class NativeWindow:
    """Images, valid tokens and token slots of the batches since the last metrics line, summed over ranks."""

    def __init__(self, device, patch: int):
        self.sums = torch.zeros(4, dtype=torch.float64)  # batches, images, tokens, slots
        self.device, self.patch = device, patch

    def add(self, batch) -> None:
        """A NativeBatch, or a Batch of one bucket's images (no padding: all its slots are tokens)."""
        images = len(batch.targets)
        tokens = getattr(batch, "tokens", None)
        if tokens is None:
            tokens = images * batch.resolution[0] * batch.resolution[1] // self.patch**2
        slots = getattr(batch, "slots", tokens)
        self.sums += torch.tensor([1, images, tokens, slots], dtype=torch.float64)

    def row(self, ctx: DistContext) -> dict:
        """The metrics of the window (over every rank), then a new window."""
        s = all_reduce_sum(self.sums.to(self.device, copy=True), ctx).cpu()
        self.sums.zero_()
        batches = max(float(s[0]), 1.0)
        return dict(
            images_per_batch=float(s[1]) / batches,
            tokens_per_batch=float(s[2]) / batches,
            padding=1.0 - float(s[2]) / max(float(s[3]), 1.0),
            images=int(s[1]),
        )
