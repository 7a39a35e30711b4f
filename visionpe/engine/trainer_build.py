"""What a training run is built from, each checked before any work: the data, the model (the one place where the
strategies differ: a plain model, its DDP wrapper, or FSDP2 shards) and the optimization (loader, optimizer,
schedule, loss, gradient scaler).

    data = build_data(cfg)
    net = build_net(cfg, ctx, data)
    opt = build_optimization(cfg, ctx, data, net)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..data import get_dataset_info
from ..data.loader import build_train_loader, dataset_num_classes, epoch_batches, renders_any_resolution
from ..data.native.plan import NativePlan
from ..data.streams import first_stream_item, is_stream
from ..models.flexi_patch import flexi_patch_refusal
from .config import Config, ConfigError
from .distributed import DistContext
from .fsdp import ShardedEma, build_sharded_model
from .native_train import check_native, plan_for
from .setup import build_eval_sets, build_model, build_split, check_resolutions, resolve_amp

__all__ = ["RunData", "RunModel", "Optimization", "build_data", "build_net", "build_optimization"]


@dataclass
class RunData:
    info: object  # the dataset's DatasetInfo (kind, channels)
    train_set: object
    num_classes: int
    class_map: dict | None  # image folders: class name -> index
    eval_sets: dict  # resolution -> dataset

    def num_items(self) -> int | None:
        try:
            return len(self.train_set)
        except TypeError:  # a stream without a length
            return None


@dataclass
class RunModel:
    device: torch.device
    amp: torch.dtype | None
    model: nn.Module
    ema: ModelEmaV3 | ShardedEma | None
    ddp: DistributedDataParallel | None  # the model wrapped for DDP (None: one process, or sharded)
    plan: NativePlan | None  # data.native: native-aspect batches (native_train.py)

    @property
    def net(self) -> nn.Module:
        """What the training step runs."""
        return self.ddp or self.model


@dataclass
class Optimization:
    loader: object
    batches: object  # the loader's epoch and position (data.loader.epoch_batches)
    steps_per_epoch: int
    epochs: int  # the schedule's (cooldown epochs included)
    optimizer: torch.optim.Optimizer
    scheduler: object | None  # timm's, stepped per update (None: constant)
    mixup: Mixup | None
    criterion: nn.Module
    scaler: torch.amp.GradScaler


def build_data(cfg: Config) -> RunData:
    """Data first: image folders tell the number of classes; a missing directory fails here, before any work."""
    info = get_dataset_info(cfg.data.name)
    train_res = cfg.train_resolutions()
    base = cfg.data.resolution if len(train_res) == 1 else max(train_res)
    train_set = build_split(cfg, cfg.data.train_split, base, training=True)
    num_classes = dataset_num_classes(info, train_set)
    class_map = getattr(train_set, "class_to_idx", None)
    eval_sets = build_eval_sets(cfg, cfg.eval_resolutions(), class_map)
    if len(train_res) > 1 and not cfg.data.native and not renders_any_resolution(train_set):
        sample = (first_stream_item(train_set) if is_stream(train_set) else train_set[0])[0]
        if not isinstance(sample, torch.Tensor):
            raise ConfigError(
                f"multi-resolution training resizes tensors, but {cfg.data.name!r} yields "
                f"{type(sample).__name__} inputs and has no render(index, resolution)"
            )
    return RunData(info, train_set, num_classes, class_map, eval_sets)


def build_net(cfg: Config, ctx: DistContext, data: RunData) -> RunModel:
    """The model (and its EMA, DDP wrapper; or their FSDP2 shards), checked at every resolution it will see."""
    device, train_res = ctx.device, cfg.train_resolutions()
    amp = resolve_amp(cfg.train.amp, device)
    cfg.model.img_size = cfg.model.img_size or cfg.data.resolution  # the resolved config records it
    sharded = cfg.train.strategy == "fsdp"
    if sharded:
        model = build_sharded_model(cfg, data.num_classes, data.info.in_chans, ctx, amp)
    else:
        model = build_model(cfg, data.num_classes, data.info.in_chans).to(device)
        if cfg.train.activation_checkpointing:
            model.set_grad_checkpointing(True)
    plan = plan_for(cfg, model)
    if plan is None:
        check_resolutions(model, cfg.model.name, {r: data.train_set for r in train_res}, device, amp)
    else:
        check_native(model, cfg.model.name, data.train_set, plan, cfg.data.resolution, device, amp)
    check_resolutions(model, cfg.model.name, data.eval_sets, device, amp)
    why = flexi_patch_refusal(model) if cfg.data.patch_sizes else None
    if why:
        raise ConfigError(f"data.patch_sizes: {cfg.model.name} cannot train at a patch size per batch: {why}")
    ema = None
    if cfg.train.ema and sharded:
        ema_model = build_sharded_model(cfg, data.num_classes, data.info.in_chans, ctx, amp)
        ema = ShardedEma(ema_model, model, decay=cfg.train.ema_decay)
    elif cfg.train.ema:
        ema = ModelEmaV3(model, decay=cfg.train.ema_decay)
    ddp = None
    if ctx.distributed and not sharded:
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    return RunModel(device, amp, model, ema, ddp, plan)


def _schedule(cfg: Config, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> tuple[object | None, int]:
    o = cfg.optim
    if o.sched == "none":
        return None, cfg.train.epochs
    return create_scheduler_v2(
        optimizer,
        o.sched,
        num_epochs=cfg.train.epochs,
        warmup_epochs=o.warmup_epochs,
        warmup_lr=o.warmup_lr,
        min_lr=o.min_lr,
        cooldown_epochs=o.cooldown_epochs,
        step_on_epochs=False,
        updates_per_epoch=steps_per_epoch,
    )


def _loss(cfg: Config, data: RunData) -> tuple[Mixup | None, nn.Module]:
    """Cross-entropy with label smoothing, or soft targets under mixup/cutmix."""
    a = cfg.aug
    if a.mixup <= 0 and a.cutmix <= 0:
        return None, nn.CrossEntropyLoss(label_smoothing=a.label_smoothing)
    if data.info.kind != "image":
        raise ConfigError(f"mixup/cutmix apply to image sets; {cfg.data.name!r} is {data.info.kind!r}")
    mixup = Mixup(
        mixup_alpha=a.mixup,
        cutmix_alpha=a.cutmix,
        prob=a.mixup_prob,
        switch_prob=a.mixup_switch_prob,
        mode=a.mixup_mode,
        label_smoothing=a.label_smoothing,
        num_classes=data.num_classes,
    )
    return mixup, SoftTargetCrossEntropy()


def build_optimization(cfg: Config, ctx: DistContext, data: RunData, net: RunModel) -> Optimization:
    """Loader, optimizer, schedule (per step), loss with optional mixup/cutmix, gradient scaler."""
    loader = build_train_loader(
        data.train_set,
        cfg.data.batch_size,
        cfg.train_resolutions(),
        cfg.train.seed,
        cfg.data.workers,
        ctx.rank,
        ctx.world_size,
        pin_memory=net.device.type == "cuda",
        native=net.plan,
        aug=dataclasses.asdict(cfg.aug),
    )
    batches = epoch_batches(loader)
    full = batches.num_batches()
    steps_per_epoch = min(full, cfg.train.max_steps_per_epoch) if cfg.train.max_steps_per_epoch else full
    o = cfg.optim
    lr = o.lr * cfg.data.batch_size * ctx.world_size / o.lr_base_size if o.lr_base_size else o.lr
    extra = {k: v for k, v in (("betas", tuple(o.betas) if o.betas else None), ("eps", o.eps)) if v is not None}
    optimizer = create_optimizer_v2(
        net.model, o.opt, lr=lr, weight_decay=o.weight_decay, momentum=o.momentum, layer_decay=o.layer_decay, **extra
    )
    scheduler, epochs = _schedule(cfg, optimizer, steps_per_epoch)
    mixup, criterion = _loss(cfg, data)
    scaler = torch.amp.GradScaler("cuda", enabled=net.amp == torch.float16)
    return Optimization(loader, batches, steps_per_epoch, epochs, optimizer, scheduler, mixup, criterion, scaler)
