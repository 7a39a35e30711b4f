"""Sharded training with FSDP2 (`train.strategy=fsdp`): every rank holds 1/N of the parameters, gradients and
optimizer state instead of a full replica.

    model = build_sharded_model(cfg, num_classes, in_chans, ctx, amp)  # built on meta, sharded, then initialised

Sharding units: every block of every `blocks` list (the ViT trunk's blocks, each Swin / CvT stage's blocks), with
its layer's PE state inside it (`attn.pos`: iRPE / RPB tables, LieRE / ComRoPE generators, RoPE-Mixed frequencies,
LePE's and CPE's convs), which the block reads only in its own forward; then the root, which keeps everything else
(stem, head, norms, downsampling, the model-level PE such as APE). A unit's parameters are gathered before its
forward and freed after it (`train.fsdp.reshard_after_forward`, default true; false keeps them gathered until the
backward: faster, more memory). With `train.amp`, the gathered parameters are cast to its dtype and gradients are
reduced in fp32. As torchtitan does, the model is built on the meta device, sharded per block, materialised on this
rank's device (`to_empty`) and only then initialised (`init_weights`, each rank drawing its own shards) or loaded, so
no rank ever holds the full model. A sharded run therefore draws other random numbers than a plain one from the
same seed.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor

from .config import Config, ConfigError
from .config_sections import STRATEGIES, FsdpConfig
from .distributed import DistContext
from .setup import build_model

__all__ = [
    "fsdp_options",
    "check_strategy",
    "sharding_units",
    "shard_blocks",
    "build_sharded_model",
    "load_full_state",
    "gathered",
    "ShardedEma",
    "full_state_dict",
    "load_full_checked",
]


def fsdp_options(cfg: Config) -> dict:
    """train.fsdp with its defaults filled in (keys and types were checked when the config was read: FsdpConfig)."""
    return dataclasses.asdict(FsdpConfig(**(cfg.train.fsdp or {})))


def check_strategy(cfg: Config) -> None:
    """train.strategy and the options fsdp cannot take, before any work."""
    if cfg.train.strategy not in STRATEGIES:
        raise ConfigError(f"train.strategy must be one of {', '.join(STRATEGIES)}, got {cfg.train.strategy!r}")
    if cfg.train.strategy != "fsdp":
        if cfg.train.fsdp:
            raise ConfigError("train.fsdp.* applies to train.strategy=fsdp; drop it or set train.strategy=fsdp")
        return
    fsdp_options(cfg)
    if cfg.train.amp == "fp16":
        raise ConfigError("train.strategy=fsdp trains in fp32 or bf16 (no fp16 loss scaling); use train.amp=bf16")
    if cfg.optim.clip_grad is not None and cfg.optim.clip_mode == "agc":
        raise ConfigError("optim.clip_mode=agc needs whole parameters; with train.strategy=fsdp use norm or value")


def sharding_units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one: the items of every ModuleList named `blocks`, in forward order."""
    units = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] == "blocks":
            units += list(module)
    return units


def shard_blocks(model: nn.Module, shard) -> None:
    """`shard(block)` (fully_shard with the run's options) once per block, in forward order: each block holds its
    layer's PE state, so nothing else joins it."""
    for block in sharding_units(model):
        shard(block)


@torch.no_grad()
def _initialise(model: nn.Module, seed: int, rank: int) -> None:
    """Every parameter and buffer of a materialised (`to_empty`) model drawn or computed afresh: the model's
    `init_weights`, each rank drawing its own shards (DTensor draws a CPU mesh's shards from the local generator)."""
    torch.manual_seed(seed + rank)
    model.init_weights()


def _pretrained_file(cfg: Config) -> tuple[Config, str | None]:
    """(cfg without timm's pretrained kwargs, the weights file they name): under fsdp the file is loaded after
    sharding, rank 0 reading it."""
    kwargs = dict(cfg.model.kwargs)
    pretrained = kwargs.pop("pretrained", False)
    overlay = kwargs.pop("pretrained_cfg_overlay", None) or {}
    if not pretrained:
        return cfg, None
    if not overlay.get("file"):
        raise ConfigError(
            "train.strategy=fsdp loads pretrained weights from a file: set model.kwargs.pretrained_cfg_overlay.file="
            "<weights.safetensors> (visionpe's format, e.g. written by visionpe-export)"
        )
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, kwargs=kwargs)), str(overlay["file"])


def build_sharded_model(
    cfg: Config, num_classes: int, in_chans: int, ctx: DistContext, amp: torch.dtype | None
) -> nn.Module:
    """The configured model, sharded over all ranks, initialised (or loaded from model.kwargs.pretrained_cfg_overlay
    .file), with activation checkpointing per block if train.activation_checkpointing."""
    cfg, file = _pretrained_file(cfg)
    mesh = _mesh(ctx)
    build = lambda: build_model(cfg, num_classes, in_chans)  # noqa: E731
    with torch.device("meta"):
        model = build()
    if cfg.train.activation_checkpointing:
        model.set_grad_checkpointing(True)
    reshard = fsdp_options(cfg)["reshard_after_forward"]
    policy = MixedPrecisionPolicy(param_dtype=amp, reduce_dtype=torch.float32) if amp else MixedPrecisionPolicy()
    options = dict(mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    shard_blocks(model, lambda block: fully_shard(block, **options))
    fully_shard(model, **options)
    if hasattr(model, "forward_intermediates"):  # timm's feature API, called instead of forward: gathers the root too
        register_fsdp_forward_method(model, "forward_intermediates")
    model.fsdp_reshard_after_forward = reshard  # read by `gathered`
    model.to_empty(device=ctx.device)
    _initialise(model, cfg.train.seed, ctx.rank)
    if file is not None:
        from .checkpoint import load_weights

        load_full_checked(model, *load_weights(file), cfg.model.name, file)
    return model


def load_full_checked(model: nn.Module, state: dict, meta: dict, model_name: str, source) -> bool:
    """A full (unsharded) state dict into a sharded model, after load_into_model's checks (the PE names of
    earlier releases placed under each block). Returns whether they were in that earlier layout."""
    from .checkpoint import current_layout, load_into_model

    placed = current_layout(model, state)
    load_into_model(_ShapeView(model), placed, meta, model_name, source)  # the checks; nothing is loaded
    load_full_state(model, placed)
    return placed.keys() != state.keys()


def _mesh(ctx: DistContext):
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():  # one process: a group of one (distributed.shutdown ends it)
        backend = "nccl" if ctx.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return init_device_mesh(ctx.device.type, (dist.get_world_size(),))


class _ShapeView:
    """What load_into_model checks of a model (its keys, global shapes and dtypes), without loading anything."""

    def __init__(self, model: nn.Module):
        self._state = {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in model.state_dict().items()}

    def state_dict(self):
        return self._state

    def load_state_dict(self, state):
        pass


@torch.no_grad()
def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a full (unsharded) state dict into a sharded model: each rank keeps its own shard of every tensor."""
    for name, target in model.state_dict().items():
        value = state[name].to(target.device, target.dtype)
        if isinstance(target, DTensor):
            target.to_local().copy_(distribute_tensor(value, target.device_mesh, target.placements).to_local())
        else:
            target.copy_(value)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on every rank (a collective: for tests and small models)."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ evaluation, EMA


def _fsdp_modules(model: nn.Module) -> list[FSDPModule]:
    """One module of each FSDP group (a block's PE modules share its group)."""
    units = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            units.setdefault(id(m._get_fsdp_state()), m)
    return list(units.values())


@contextlib.contextmanager
def gathered(*models: nn.Module | None):
    """Evaluation of sharded models: their parameters are gathered once and kept for every forward inside (one full
    copy, no gradients or optimizer state), so ranks may run different numbers of batches; sharded again after.
    Models that are not sharded pass through."""
    sharded = [m for m in models if isinstance(m, FSDPModule)]
    for model in sharded:
        for unit in _fsdp_modules(model):
            if unit is not model:
                unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
    try:
        yield
    finally:
        for model in sharded:
            for unit in _fsdp_modules(model):
                unit.reshard()
                if unit is not model:
                    unit.set_reshard_after_forward(model.fsdp_reshard_after_forward, recurse=False)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class ShardedEma:
    """timm ModelEmaV3's average (its decay schedule with default options, a foreach lerp over the floating-point
    state dict, copies of the rest) kept in a second sharded model: each rank averages its own shards."""

    def __init__(self, module: nn.Module, model: nn.Module, decay: float):
        self.module, self.decay = module, decay
        self.module.eval()
        self.module.requires_grad_(False)
        with torch.no_grad():
            for e, m in zip(module.state_dict().values(), model.state_dict().values()):
                _local(e).copy_(_local(m))

    def get_decay(self, step: int | None = None) -> float:
        if step is None:
            return self.decay
        return 0.0 if step <= 1 else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module, step: int | None = None) -> None:
        decay = self.get_decay(step)
        ema, new = [], []
        for e, m in zip(self.module.state_dict().values(), model.state_dict().values()):
            if e.is_floating_point():
                ema.append(_local(e))
                new.append(_local(m))
            else:
                _local(e).copy_(_local(m))
        if ema:
            torch._foreach_lerp_(ema, new, weight=1.0 - decay)
