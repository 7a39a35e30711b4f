"""What the trainer does differently under `data.native` (native-aspect batches, see data/native_loader.py): the
plan from the settings and the model's patch size, a trial forward pass, the batch statistics of the metrics
lines (padding fraction, images and tokens per batch, summed over ranks) and the evaluation at token budgets."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from ..data import get_dataset_info
from ..data.native_buckets import bucket_sizes, collate_buckets
from ..data.native_items import NativeDataset
from ..data.native_loader import build_native_eval_loader, native_plan
from ..data.native_sampler import NativeKey, NativePlan
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
    if settings.loader == "timm" and settings.mode != "padded":
        raise ConfigError("data.native.loader=timm pads every image to its batch's length; set data.native.mode=padded")
    patch = model_patch_size(model)
    if settings.patch_size is not None and patch is not None and settings.patch_size != patch:
        raise ConfigError(
            f"data.native.patch_size={settings.patch_size} but {cfg.model.name} has {patch} px patches; "
            f"drop the key (it defaults to the model's) or set it to {patch}"
        )
    patch = settings.patch_size or patch
    if patch is None:  # a convolutional stem (CvT): one image size per batch, tokens of its total stride
        stride = (getattr(model, "feature_info", None) or [{}])[-1].get("reduction", 16)
        need = "" if settings.mode == "buckets" else "data.native.mode=buckets (one size per batch) and "
        raise ConfigError(
            f"{cfg.model.name} has no patch_embed.patch_size (it takes images, not patch sequences); set "
            f"{need}data.native.patch_size={stride} (its total stride)"
        )
    try:
        return native_plan(settings, patch)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def eval_budgets(cfg: Config, plan: NativePlan) -> list[int]:
    return list(native_settings(cfg).eval_tokens) or [max(plan.budgets)]


@torch.no_grad()
def check_native(model: nn.Module, name: str, dataset: Dataset, plan: NativePlan, resolution: int, device, amp) -> None:
    """One forward pass of a native batch (two images at the largest budget, padded, and packed when packing), so
    that a model without native batches fails now with one line."""
    was_training = model.training
    model.eval()
    try:
        if plan.mode == "buckets":
            return _check_buckets(model, name, plan, dataset, resolution, device, amp)
        batch = next(iter(build_native_eval_loader(dataset, plan, max(plan.budgets), 2, resolution)))
        inputs = dict(batch.inputs)
        try:
            out = forward_on(model, inputs, device, amp)
            if plan.mode == "packed":
                inputs["image_ids"] = torch.where(inputs["patch_valid"], 0, -1)
                out = forward_on(model, inputs, device, amp)
        except (RuntimeError, ValueError, TypeError, AssertionError) as e:
            raise ValueError(
                f"model {name!r} cannot take native-aspect batches (data.native): {e}; a model of one image size "
                f"per batch (Swin, CvT) trains on aspect buckets: data.native.mode=buckets"
            ) from None
        if out.shape[0] != batch.images:
            raise ValueError(f"model {name!r} gave {out.shape[0]} outputs for {batch.images} images of a native batch")
    finally:
        model.train(was_training)


def _check_buckets(model: nn.Module, name: str, plan: NativePlan, dataset, resolution, device, amp) -> None:
    """A forward pass at every bucket size (one image of the dataset drawn at each)."""
    for H, W in bucket_sizes(plan.aspects, max(plan.budgets), plan.patch):
        image = collate_buckets([NativeDataset(dataset, None)._item(NativeKey(0, (H, W), None, 0, 0, 1, False))])
        try:
            forward_on(model, image.inputs, device, amp)
        except (RuntimeError, ValueError, TypeError, AssertionError) as e:
            raise ValueError(f"model {name!r} cannot take the {H} x {W} px bucket of data.native: {e}") from None


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
