"""The config's sections: one dataclass per section of a recipe (model, data, aug, optim, train, eval) and `Config`
holding them, each key declared with `setting` (its default, one-line help and allowed values). Reading, overriding
and checking a config: visionpe/engine/config.py."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "Config", "ModelConfig", "DataConfig", "NativeConfig", "FsdpConfig", "AugConfig", "OptimConfig", "TrainConfig",
    "EvalConfig", "STRATEGIES", "setting", "check_run_name",
]  # fmt: skip


def setting(default: Any, help: str, schema: type | None = None, path: bool = False, **check: Any) -> Any:  # noqa: A002
    """A config key: its default, its one-line help and its allowed values, checked whenever a config is read:
    `ge`/`gt`/`le`/`lt` bounds (each item of a list), `choices`. A float must be finite. None passes (where the
    type allows it: it means the default named in the help). A list may also declare `unique=True` (no value twice)
    and `nonempty=EXAMPLE` (at least one value; the error shows EXAMPLE); `parse`: a function each value must pass
    (a ValueError says why not); `synonyms`: {other spelling: value}, read as that value (train.amp: off is none).
    `schema`: a dataclass of settings that the keys of a dict-valued key must be (e.g. data.native.*), each checked
    as a key of its own; {} means it is off. `path=True`: a path (or a dict of paths), `~` expanded to the home
    folder when read."""
    meta = {"help": help, "check": check, "schema": schema, "path": path}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class ModelConfig:
    """The network."""

    name: str = setting("vit_n_rope2d", "any registered timm model, e.g. vit_n_ape, vit_s_rope2d_mixed, swin_t_rpb")
    kwargs: dict = setting({}, "extra constructor kwargs, e.g. model.kwargs.depth=2")
    drop_path: float = setting(
        0.0,
        "stochastic depth rate, for every model (0: none; Swin's own default of 0.1 applies only outside the engine)",
        ge=0,
        lt=1,
    )
    img_size: int | None = setting(
        None, "reference input size (sizes learned position tables); null: data.resolution", ge=1
    )


@dataclass
class NativeConfig:
    """data.native.*: native-aspect batches (images resized to a token budget keeping their aspect ratio, several
    sizes in one batch); see docs/training.md and visionpe/data/native/loader.py."""

    mode: str = setting(
        "packed",
        "packed (several images per row, NaViT), padded (one per row, NaFlex) or buckets (one size per batch)",
        choices=("packed", "padded", "buckets"),
    )
    patch_size: int | None = setting(None, "patch size in px; null: the model's", ge=1)
    max_tokens: int = setting(64, "token budget per image (patches): each image is resized to fit it", ge=1)
    seq_lens: list[int] = setting(
        [], "if set, budgets drawn instead of max_tokens: per batch (padded) or per image (packed)", ge=1
    )
    tokens_per_batch: int = setting(4096, "patch tokens per batch and process (rows x row length)", ge=1)
    row_tokens: int | None = setting(None, "packed: tokens per row; null: the largest budget", ge=1)
    buffer: int = setting(256, "packed: images the online packer holds at most while it fills a batch", ge=1)
    aspects: list[float] = setting(
        [], "buckets: the buckets' aspect ratios W / H; empty: 1:3, 1:2, 3:4, 1, 4:3, 2, 3", gt=0
    )
    eval_tokens: list[int] = setting([], "budgets evaluated (one image per row); empty: the largest budget", ge=1)
    loader: str = setting(
        "visionpe", "visionpe (this packer) or timm (timm's create_naflex_loader, padded)", choices=("visionpe", "timm")
    )


@dataclass
class FsdpConfig:
    """train.fsdp.*: options of sharded training (train.strategy=fsdp); see docs/training.md and
    visionpe/engine/fsdp.py."""

    reshard_after_forward: bool = setting(
        True, "free each block's gathered parameters after its forward (false: keep them until the backward)"
    )


STRATEGIES = ("ddp", "fsdp")  # train.strategy: a replica per process, or parameters sharded (FSDP2)


@dataclass
class DataConfig:
    """The dataset and how it is batched."""

    name: str = setting("synthetic-shapes", "a registered dataset (synthetic-shapes, fashion-mnist, imagefolder, ...)")
    root: str | None = setting(None, "data directory (folders: root/train/<class>/*, root/val/<class>/*)", path=True)
    options: dict = setting({}, "dataset-specific options, e.g. data.options.num_train=2000")
    train_split: str = setting("train", "split to train on")
    val_split: str = setting("val", "split to evaluate on")
    resolution: int = setting(32, "training resolution (px, square)", ge=1)
    train_resolutions: list[int] = setting(
        [], "if set, each batch trains at a random one of these (multi-resolution)", ge=1
    )
    patch_sizes: list[int] = setting(
        [],
        "if set, each batch trains at a random one of these patch sizes (px, FlexiViT: the stem's kernel PI-resized "
        "from the model's); vit, swin, vivit and mm",
        ge=1,
        unique=True,
    )
    batch_size: int = setting(64, "training batch size per process", ge=1)
    eval_batch_size: int = setting(0, "evaluation batch size per process; 0: 2 x batch_size", ge=0)
    workers: int = setting(0, "data loader worker processes per training process", ge=0)
    native: dict = setting({}, "native-aspect batches: data.native.<key> (listed below); {}: off", NativeConfig)


@dataclass
class AugConfig:
    """Augmentation and regularisation (the transforms apply to image folders and timm's readers, and setting
    auto_augment, re_prob or color_jitter for another dataset is an error; mixup/cutmix apply to any image set)."""

    auto_augment: str | None = setting(None, "timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1")
    re_prob: float = setting(0.0, "random erasing probability", ge=0, le=1)
    color_jitter: float = setting(0.0, "colour jitter strength", ge=0)
    scale: list[float] = setting([0.08, 1.0], "RandomResizedCrop area range", gt=0, le=1)
    ratio: list[float] = setting([0.75, 1.3333333], "RandomResizedCrop aspect range", gt=0)
    hflip: float = setting(0.5, "horizontal flip probability", ge=0, le=1)
    interpolation: str | None = setting(None, "resize interpolation; null: the model's pretrained cfg")
    crop_pct: float | None = setting(None, "evaluation centre-crop fraction; null: the model's pretrained cfg", gt=0)
    mean: list[float] | None = setting(None, "normalisation mean for image folders; null: the model's pretrained cfg")
    std: list[float] | None = setting(
        None, "normalisation std for image folders; null: the model's pretrained cfg", gt=0
    )
    mixup: float = setting(0.0, "mixup alpha (0: off)", ge=0)
    cutmix: float = setting(0.0, "cutmix alpha (0: off)", ge=0)
    mixup_prob: float = setting(1.0, "probability of applying mixup or cutmix to a batch", ge=0, le=1)
    mixup_switch_prob: float = setting(0.5, "probability of cutmix instead of mixup when both are on", ge=0, le=1)
    mixup_mode: str = setting("batch", "mixup mode: batch, pair or elem", choices=("batch", "pair", "elem"))
    label_smoothing: float = setting(0.0, "label smoothing", ge=0, lt=1)


@dataclass
class OptimConfig:
    """Optimizer (timm create_optimizer_v2) and learning-rate schedule (timm create_scheduler_v2, per step)."""

    opt: str = setting("adamw", "timm optimizer name")
    lr: float = setting(1e-3, "peak learning rate (scaled by global batch / lr_base_size when that is set)", ge=0)
    lr_base_size: int | None = setting(None, "if set, lr is for this global batch size and scales linearly", ge=1)
    weight_decay: float = setting(0.05, "weight decay (not on biases, norms and the PEs' no_weight_decay tables)", ge=0)
    momentum: float = setting(0.9, "momentum (SGD-type optimizers)", ge=0, le=1)
    betas: list[float] | None = setting(None, "Adam betas; null: the optimizer's default", ge=0, lt=1)
    eps: float | None = setting(None, "optimizer epsilon; null: default", gt=0)
    layer_decay: float | None = setting(None, "layer-wise lr decay", gt=0)
    clip_grad: float | None = setting(None, "gradient clipping threshold; null: off", gt=0)
    clip_mode: str = setting("norm", "clipping mode: norm, value or agc", choices=("norm", "value", "agc"))
    sched: str = setting("cosine", "timm scheduler name (cosine, step, ..., none)")
    warmup_epochs: float = setting(0.0, "linear warmup length in epochs", ge=0)
    warmup_lr: float = setting(1e-6, "learning rate at the start of warmup", ge=0)
    min_lr: float = setting(1e-6, "floor of the schedule", ge=0)
    cooldown_epochs: int = setting(0, "epochs at min_lr after the schedule", ge=0)


@dataclass
class TrainConfig:
    """The training loop, checkpoints and logging."""

    epochs: int = setting(10, "number of epochs", ge=1)
    seed: int = setting(  # each rank seeds numpy with seed + rank, which must stay below 2**32
        0, "seed of model init, data order, augmentation and multi-resolution schedule", ge=0, lt=2**31
    )
    device: str = setting("auto", "auto (cuda when present), cpu or cuda[:i]")
    amp: str = setting(
        "auto",
        "auto (bf16 on GPUs and AMX CPUs, fp16 on older GPUs, else none), bf16, fp16 or none",
        choices=("auto", "bf16", "fp16", "none"),
        synonyms={"off": "none", "false": "none"},
    )
    threads: int | None = setting(None, "torch intra-op threads per process; null: torch's default", ge=1)
    ema: bool = setting(False, "keep an exponential moving average of the weights (timm ModelEmaV3)")
    ema_decay: float = setting(0.9998, "EMA decay per step", ge=0, le=1)
    max_steps_per_epoch: int = setting(
        0, "stop each epoch after this many steps (0: full epochs; for smoke tests)", ge=0
    )
    ckpt_every_steps: int = setting(0, "also checkpoint every this many steps (0: at each epoch end only)", ge=0)
    keep_checkpoints: int = setting(
        2, "checkpoints kept on disk (older ones are deleted once a newer one is safe)", ge=1
    )
    log_every: int = setting(20, "append a train metrics line every this many steps", ge=1)
    progress: bool = setting(True, "show progress bars with ETA for the run and evaluation (rank 0, terminals)")
    log_tensorboard: bool = setting(False, "also log scalars to <run dir>/tensorboard (needs the tensorboard package)")
    dist_timeout: float = setting(
        1800.0, "seconds a DDP process waits for the others before failing with an error", gt=0
    )
    strategy: str = setting(
        "ddp",
        "ddp (a replica per process) or fsdp (FSDP2: params, grads, optimizer state shard)",
        choices=STRATEGIES,
    )
    fsdp: dict = setting({}, "sharded training: train.fsdp.<key> (listed below); needs train.strategy=fsdp", FsdpConfig)
    activation_checkpointing: bool = setting(False, "recompute each block's activations in the backward (less memory)")
    output_dir: str = setting("runs", "where run directories go", path=True)
    run_name: str | None = setting(
        None,
        "run directory name ({model} becomes model.name), a plain name inside output_dir; null: <config name>-{model}",
        parse=lambda name: check_run_name(name.replace("{model}", "model")),
    )


@dataclass
class EvalConfig:
    """Evaluation during and after training."""

    resolutions: list[int] = setting(
        [], "resolutions evaluated during and after training; empty: data.resolution", ge=1
    )
    every_epochs: int = setting(1, "evaluate every this many epochs (the last epoch always)", ge=1)
    ema: bool = setting(True, "also evaluate the EMA weights when train.ema is on")


@dataclass
class Config:
    HELP: ClassVar[str] = "python train.py --help"  # the command that lists every key, named in unknown-key errors

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def eval_resolutions(self) -> list[int]:
        return list(self.eval.resolutions) or [self.data.resolution]

    def train_resolutions(self) -> list[int]:
        return list(self.data.train_resolutions) or [self.data.resolution]


# ------------------------------------------------------------------------------------- a key's own check (parse=)


NAME_MAX = 255  # bytes in one file name on Linux, macOS and Windows file systems


def check_run_name(name: str) -> str:
    """`name` if it can name a run directory inside train.output_dir (a ValueError saying why not otherwise)."""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(
            f"{name!r} is not a plain folder name; a run directory stays inside train.output_dir (set that to "
            f"choose another place, and train.run_name to a name without / or ..)"
        )
    if len(os.fsencode(name)) > NAME_MAX:
        raise ValueError(
            f"the name is {len(os.fsencode(name))} bytes long, over the file system's limit of {NAME_MAX}; "
            f"choose a shorter train.run_name"
        )
    return name
