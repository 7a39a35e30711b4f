"""The training/evaluation config: dataclasses with defaults, a YAML recipe on top, dotted `key=value` overrides last.

    cfg = load_config("configs/quick.yaml", ["model.name=vit_n_ape", "train.epochs=2", "model.kwargs.depth=2"])

Every key has a default and a one-line help (`python train.py --help` prints them). An unknown key, in a file or an
override, is an error naming the nearest valid key; values are converted to the key's type (`1e-3` is a float,
`32,48,64` a list) or rejected with the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .yaml_io import YamlError, load_yaml_file, load_yaml_text, short_repr, yaml11_booleans

__all__ = [
    "Config",
    "ModelConfig",
    "DataConfig",
    "NativeConfig",
    "native_settings",
    "AugConfig",
    "OptimConfig",
    "TrainConfig",
    "EvalConfig",
    "ConfigError",
    "load_config",
    "apply_overrides",
    "config_from_dict",
    "read_section",
    "setting",
    "config_to_dict",
    "config_keys",
    "format_config_help",
    "save_config",
    "check_training_config",
]


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the fix."""


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
    """Augmentation and regularisation (the transforms apply to image folders; mixup/cutmix to any image set)."""

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


# ------------------------------------------------------------------------------------------------------- keys, types


def _sections(root: type = Config) -> dict[str, type]:
    """section name -> its dataclass, for `Config` or a config with more sections (e.g. a benchmark file's)."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


def config_keys(root: type = Config) -> list[tuple[str, Any, str, Any]]:
    """(dotted key, default, help, type) for every key."""
    out = []
    for section, cls in _sections(root).items():
        hints = typing.get_type_hints(cls)
        default = cls()
        for f in dataclasses.fields(cls):
            out.append((f"{section}.{f.name}", getattr(default, f.name), f.metadata.get("help", ""), hints[f.name]))
    return out


def _key_types(root: type = Config) -> dict[str, Any]:
    return {k: tp for k, _, _, tp in config_keys(root)}


def nearest_key(key: str, keys: list[str]) -> str:
    leaf = key.split(".")[-1]
    same_leaf = [k for k in keys if k.split(".")[-1] == leaf]
    if same_leaf:
        return same_leaf[0]
    return difflib.get_close_matches(key, keys, n=1, cutoff=0.0)[0]


def _unknown(key: str, where: str, root: type = Config) -> ConfigError:
    keys = list(_key_types(root))
    return ConfigError(
        f"unknown config key {short_repr(key)}{where}; did you mean {nearest_key(key, keys)!r}? "
        f"(`{root.HELP}` lists every key)"
    )


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp, key: str) -> Any:
    """Convert `value` (from YAML or a command line) to the type `tp` of `key`, or raise a ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "~", "")):
            return None
        return coerce(value, args[0], key)
    bad = ConfigError(f"{key} expects {_type_name(tp)}, got {short_repr(value)}")
    if value is None:
        raise bad
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad
    if tp is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float) and value.is_integer():
            return int(value)
        try:
            return int(value) if isinstance(value, (int, str)) else _raise(bad)
        except ValueError:
            raise bad from None
    if tp is float:
        if isinstance(value, bool):
            raise bad
        try:
            return float(value) if isinstance(value, (int, float, str)) else _raise(bad)
        except ValueError:
            raise bad from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise bad
        return str(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            text = value.strip().strip("[]()")
            value = [v.strip() for v in text.split(",") if v.strip()]
        elif not isinstance(value, (list, tuple)):
            value = [value]
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover (a new field of an unhandled type)


def expand_home(value: Any) -> Any:
    """`~` (and `~user`) at the start of a path, or of each path of a dict or list, as the home folder."""
    if isinstance(value, str):
        return os.path.expanduser(value)
    if isinstance(value, dict):
        return {k: expand_home(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_home(v) for v in value]
    return value


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


def _raise(e: Exception):
    raise e


_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b)}
_BOUNDS |= {"le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}


def describe_check(check: dict) -> str:
    """A key's declared range for --help, e.g. '  [>= 0, < 1]' ('' when it declares none)."""
    parts = [f"{sign} {check[b]}" for b, (sign, _) in _BOUNDS.items() if b in check]
    parts += [text for name, text in (("nonempty", "at least one"), ("unique", "each once")) if check.get(name)]
    if "choices" in check:
        parts.append(" | ".join(map(str, check["choices"])))
    parts += [f"{k} = {v}" for k, v in check.get("synonyms", {}).items()]
    return f"  [{', '.join(parts)}]" if parts else ""


def check_value(value: Any, check: dict, key: str, help: str = "") -> None:  # noqa: A002
    """Raise a ConfigError unless `value` (each item of a list) meets the key's declared `check` (see `setting`)."""
    if isinstance(value, list) and not value and check.get("nonempty"):
        raise ConfigError(f"{key} is empty; list at least one, e.g. {key}={check['nonempty']}")
    repeated = sorted({str(v) for v in value if value.count(v) > 1}) if check.get("unique") else []
    if repeated:
        raise ConfigError(f"{key} lists {', '.join(repeated)} more than once")
    for i, v in enumerate(value if isinstance(value, list) else [value]):
        where = f"{key}[{i}]" if isinstance(value, list) else key
        if v is None or isinstance(v, (bool, dict)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where} must be a finite number, got {v}")
        if "choices" in check and v not in check["choices"]:
            raise ConfigError(f"{where} must be one of {', '.join(map(str, check['choices']))}; got {short_repr(v)}")
        try:
            check.get("parse", str)(v)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        failed = [f"{sign} {check[b]}" for b, (sign, ok) in _BOUNDS.items() if b in check and not ok(v, check[b])]
        if failed:
            allowed = " and ".join(f"{sign} {check[b]}" for b, (sign, _) in _BOUNDS.items() if b in check)
            raise ConfigError(f"{where} must be {allowed}, got {short_repr(v)}" + (f" ({help})" if help else ""))


# --------------------------------------------------------------------------------------------- dicts, files, overrides


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict | None, where: str = "", root: type = Config) -> Config:
    """A Config (or a `root`: Config with more sections) from a nested dict (YAML); unknown sections/keys are errors
    naming the nearest key."""
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of sections{where}, got {type(data).__name__}")
    sections = _sections(root)
    kwargs = {}
    for section, values in data.items():
        if section not in sections:
            raise _unknown(str(section), where, root)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"config section {section!r}{where} must be a mapping of keys, got {short_repr(values)}")
        kwargs[section] = read_section(sections[section], values, section, where, root)
    return root(**kwargs)


def read_section(cls: type, values: dict, section: str, where: str = "", root: type = Config) -> Any:
    """One section (a dataclass of `setting`s) from a dict: every key converted to its type and checked against its
    declaration; an unknown key is an error naming the nearest key of `root`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    converted = {}
    for k, v in values.items():
        if k not in fields:
            raise _unknown(f"{section}.{k}", where, root)
        meta = fields[k].metadata
        converted[k] = _spelled(coerce(v, hints[k], f"{section}.{k}"), meta)
        if meta.get("path"):
            converted[k] = expand_home(converted[k])
        check_value(converted[k], meta.get("check", {}), f"{section}.{k}", meta.get("help", ""))
        if meta.get("schema") is not None:
            converted[k] = check_schema(converted[k], meta["schema"], f"{section}.{k}")
        elif isinstance(converted[k], dict):  # free-form (model.kwargs, data.options): yes/no/on/off as YAML 1.1 bools
            converted[k] = yaml11_booleans(converted[k])
    return cls(**converted)


def _spelled(value: Any, meta: Any) -> Any:
    """A string key's value with its declared `synonyms` (see `setting`) replaced by the value they stand for."""
    synonyms = meta.get("check", {}).get("synonyms", {})
    return synonyms.get(value.lower(), value) if isinstance(value, str) else value


def check_schema(values: dict, schema: type, key: str) -> dict:
    """The entries of a dict-valued key, each converted and checked as the `schema` dataclass declares it; an
    unknown entry is an error naming the nearest one."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = {}
    for name, value in values.items():
        if name not in fields:
            near = difflib.get_close_matches(str(name), list(fields), n=1, cutoff=0.0)
            raise ConfigError(f"unknown config key {key}.{name}; did you mean {key}.{near[0]}?")
        meta = fields[name].metadata
        out[name] = _spelled(coerce(value, hints[name], f"{key}.{name}"), meta)
        check_value(out[name], meta.get("check", {}), f"{key}.{name}", meta.get("help", ""))
    return out


def native_settings(cfg: Config) -> NativeConfig | None:
    """data.native with its defaults filled in; None when it is off (empty)."""
    return NativeConfig(**cfg.data.native) if cfg.data.native else None


def apply_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """Apply `section.key=value` strings; `section.dictkey.sub=value` sets an entry of a dict-valued key. `cfg` may
    be a Config with more sections (e.g. a benchmark file's); an empty value sets a list-valued key to []."""
    data, root = config_to_dict(cfg), type(cfg)
    key_types = _key_types(root)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {short_repr(item)} is not key=value (e.g. train.epochs=2)")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        base = ".".join(parts[:2])
        if base not in key_types:
            raise _unknown(key, " on the command line", root)
        tp = key_types[base]
        section, name = parts[0], parts[1]
        if len(parts) > 2:
            if not (tp is dict or typing.get_origin(tp) is dict):
                raise _unknown(key, " on the command line", root)
            target = data[section][name]
            for p in parts[2:-1]:
                target = target.setdefault(p, {})
            target[parts[-1]] = _override_value(raw, item)
            continue
        union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        plain = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
        if plain[0] is str and raw.strip().lower() not in ("null", "none", "~", ""):
            value = raw  # strings stay as typed: run_name=007 is "007"
        elif typing.get_origin(plain[0]) is list and not raw.strip():
            value = []
        else:
            value = _override_value(raw, item)
        data[section][name] = coerce(value, tp, base)
    return config_from_dict(data, root=root)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file at `path` (a file or a packaged recipe name; if any), then the overrides."""
    cfg = Config()
    if path is not None:
        from ..recipes import resolve_recipe

        path = resolve_recipe(path)  # a file, or a packaged recipe name such as "quick"
        cfg = config_from_dict(read_yaml(path), f" in {path}")
        if cfg.train.run_name is None:
            cfg.train.run_name = f"{path.stem}-{{model}}"
    return apply_overrides(cfg, list(overrides))


def _override_value(raw: str, item: str):
    if not raw.strip():
        return None
    try:
        return load_yaml_text(raw, f"override {short_repr(item)}")
    except YamlError as e:
        raise ConfigError(str(e)) from None


def read_yaml(path: str | Path):
    """A recipe or run config file (YAML, UTF-8; duplicate keys refused, see yaml_io.py), as a ConfigError."""
    try:
        return load_yaml_file(path)
    except YamlError as e:
        raise ConfigError(str(e)) from None


def check_training_config(cfg: Config) -> None:
    """The checks across keys a training run needs before any work (each key's own range is checked when the
    config is read, from its declaration above)."""
    if cfg.data.native and cfg.data.patch_sizes:
        raise ConfigError(
            f"data.patch_sizes={','.join(map(str, cfg.data.patch_sizes))} does not apply with data.native (its patches "
            "come at data.native.patch_size); drop one of them"
        )
    if cfg.data.patch_sizes and max(cfg.data.patch_sizes) > min(cfg.train_resolutions()):
        raise ConfigError(
            f"data.patch_sizes={','.join(map(str, cfg.data.patch_sizes))} has patches larger than the "
            f"{min(cfg.train_resolutions())} px images; use patch sizes up to the smallest training resolution"
        )
    if (cfg.aug.mixup > 0 or cfg.aug.cutmix > 0) and cfg.data.batch_size % 2:
        raise ConfigError(f"mixup/cutmix pair up images: data.batch_size must be even, got {cfg.data.batch_size}")
    if cfg.data.native and len(set(cfg.data.train_resolutions)) > 1:
        raise ConfigError(
            f"data.train_resolutions={','.join(map(str, cfg.data.train_resolutions))} does not apply with data.native: "
            f"each image keeps its aspect and is resized to a token budget; vary the sizes with data.native.seq_lens "
            f"(e.g. data.native.seq_lens=16,36) and drop data.train_resolutions"
        )


def save_config(cfg: Config, path: str | Path) -> None:
    from .checkpoint import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def format_config_help(sections: dict[str, type] | None = None) -> str:
    """Every key with its default and help, grouped by section (`sections`: name -> dataclass; default: Config's)."""
    lines = []
    for section, cls in (sections or _sections()).items():
        lines.append(f"\n{section}: {(cls.__doc__ or '').strip()}")
        default = cls()
        for f in dataclasses.fields(cls):
            value = yaml.safe_dump(getattr(default, f.name), default_flow_style=True).strip().removesuffix("...")
            allowed = describe_check(f.metadata.get("check", {}))
            lines.append(f"  {section}.{f.name} = {value.strip()}{allowed}\n      {f.metadata.get('help', '')}")
            schema = f.metadata.get("schema")
            for g in dataclasses.fields(schema) if schema is not None else ():
                value = yaml.safe_dump(getattr(schema(), g.name), default_flow_style=True).strip().removesuffix("...")
                allowed = describe_check(g.metadata.get("check", {}))
                lines.append(
                    f"    {section}.{f.name}.{g.name} = {value.strip()}{allowed}\n        {g.metadata['help']}"
                )
    return "\n".join(lines)
