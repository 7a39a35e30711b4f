"""What a `--resume` may change: overrides that change what is trained are refused unless accepted on purpose.

The run directory's `config.yaml` keeps the config the run started with; every accepted change is appended to
`config_changes.jsonl` with the step at which it took effect, so the config in force is `config.yaml` plus those
changes. Keys that cannot change the trained weights (threads, logging, progress, checkpoint cadence, what is
evaluated and how fast) may differ freely.
"""

from __future__ import annotations

import copy
import functools
import json
import time
import unicodedata
from pathlib import Path

from .config import Config, ConfigError, config_from_dict, config_to_dict, read_yaml
from .yaml_io import short_repr

__all__ = [
    "FREE_KEYS",
    "recipe_of",
    "CHANGES",
    "config_in_force",
    "changed_keys",
    "flatten",
    "check_resume_changes",
    "check_resume_data",
    "adopt_accepted_changes",
]

CHANGES = "config_changes.jsonl"
FREE_KEYS = frozenset(
    {
        "train.threads",  # results are reproducible per thread count; see the tests' tolerances
        "train.log_every",
        "train.progress",
        "train.log_tensorboard",
        "train.dist_timeout",
        "train.output_dir",
        "train.run_name",
        "train.keep_checkpoints",
        "train.ckpt_every_steps",
        "eval.resolutions",
        "eval.every_epochs",
        "eval.ema",
        "data.native.eval_tokens",  # what is evaluated, as eval.resolutions
        "data.workers",  # items are seeded per (seed, epoch, index): the same with any worker count (not on
        # timm's NaFlex loader, whose workers draw their own crops: changed_keys counts it there)
        "data.eval_batch_size",
    }
)


# keys that name a run or how it is run, not what it learns: the free keys and the run's name, seed, device and
# execution strategy (fsdp = ddp and checkpointed blocks = plain, to fp32 precision)
NOT_RECIPE = FREE_KEYS | {"model.name", "train.seed", "train.device", "train.strategy", "train.fsdp",
                          "train.activation_checkpointing"}  # fmt: skip


def recipe_of(cfg: dict | Config) -> dict:
    """The parts of a (nested) training config that decide what a run learns: runs with equal recipes differ only
    in their seed (the benchmark compares its runs' and records' recipes with its own)."""
    d = copy.deepcopy(config_to_dict(cfg) if isinstance(cfg, Config) else cfg)
    # a key the saved config lacks (added to the engine since the run) stands at its default
    defaults = config_to_dict(Config())
    d = {**defaults, **{k: {**defaults.get(k, {}), **v} if isinstance(v, dict) else v for k, v in d.items()}}
    for key in NOT_RECIPE:  # dotted paths, e.g. train.seed, data.native.eval_tokens
        *parents, name = key.split(".")
        functools.reduce(lambda node, p: node.get(p) or {}, parents, d).pop(name, None)
    d["model"]["img_size"] = d["model"]["img_size"] or d["data"]["resolution"]  # as the trainer resolves it
    return d


def flatten(d: dict, prefix: str = "") -> dict:
    """{"optim": {"lr": 1}, "model": {"kwargs": {"depth": 2}}} -> {"optim.lr": 1, "model.kwargs.depth": 2}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))  # an empty dict adds nothing: {} and unset are the same
        else:
            out[f"{prefix}{k}"] = v
    return out


def _resolved(cfg: Config) -> dict:
    flat = flatten(config_to_dict(cfg))
    flat["model.img_size"] = flat.get("model.img_size") or flat["data.resolution"]  # as the trainer resolves it
    return flat


def config_in_force(run_dir: Path) -> dict | None:
    """The run's config as flat {key: value}: config.yaml plus every accepted change (None: no config.yaml)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    flat = _resolved(config_from_dict(read_yaml(path), f" (in {path})"))
    log = Path(run_dir) / CHANGES
    if log.is_file():
        for line in log.read_text().splitlines():
            if line.strip():
                for key, (_, new) in json.loads(line)["changes"].items():
                    flat[key] = new
    return flat


def changed_keys(old: dict, new: dict) -> dict[str, tuple]:
    """{key: (old, new)} for keys (free ones excluded) whose value differs. data.workers is not free on timm's
    NaFlex loader (data.native.loader=timm): each of its workers draws its own crops."""
    timm_route = "timm" in (old.get("data.native.loader"), new.get("data.native.loader"))
    free = FREE_KEYS - {"data.workers"} if timm_route else FREE_KEYS
    return {
        k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if k not in free and old.get(k) != new.get(k)
    }


def check_resume_changes(cfg: Config, run_dir: Path, step: int, epoch: int, accept: bool, write: bool) -> dict:
    """Refuse (ConfigError naming each key) or, with `accept`, record the changes `cfg` makes to the run."""
    old = config_in_force(run_dir)
    if old is None:
        return {}
    changes = changed_keys(old, _resolved(cfg))
    if not changes:
        return {}
    listed = ", ".join(f"{k} {short_repr(a)} -> {short_repr(b)}" for k, (a, b) in changes.items())
    if not accept:
        raise ConfigError(
            f"--resume would change what {run_dir} was trained with: {listed}; drop these overrides to continue "
            f"the run as it was, or pass --accept-changes (train(..., accept_changes=True)) to continue with them "
            f"on purpose (recorded in {CHANGES})"
        )
    if write:
        row = dict(global_step=step, epoch=epoch, time=time.strftime("%Y-%m-%d %H:%M:%S"), changes=changes)
        with open(Path(run_dir) / CHANGES, "a") as f:
            f.write(json.dumps(row) + "\n")
    return changes


def _nfc_map(class_map: dict) -> dict:
    return {unicodedata.normalize("NFC", str(k)): v for k, v in class_map.items()}


def check_resume_data(source, meta: dict, state: dict, class_map: dict | None, num_items: int, in_chans: int) -> None:
    """Refuse (CheckpointError naming what differs) a resume whose data no longer matches the checkpoint's: class
    folders renamed, added or removed (the labels would silently change meaning), another number of input channels,
    or another number of training items (the data order of the rest of the run would differ)."""
    from .checkpoint import CheckpointError

    fix = "restore the data as it was, or start a new run (train.run_name=<new name>)"
    if meta.get("class_map") and class_map is not None:
        saved, now = _nfc_map(json.loads(meta["class_map"])), _nfc_map(class_map)
        if saved != now:
            gone = sorted(set(saved) - set(now))
            new = sorted(set(now) - set(saved))
            moved = sorted(c for c in set(saved) & set(now) if saved[c] != now[c])
            parts = [
                f"{what}: {', '.join(map(repr, names[:4]))}"
                for what, names in (("missing now", gone), ("new", new), ("with another index", moved))
                if names
            ]
            raise CheckpointError(
                f"the classes of the training data differ from those {source} was trained with ({'; '.join(parts)}); "
                f"resuming would change what each label means. {fix[0].upper()}{fix[1:]}"
            )
    if meta.get("in_chans") and int(meta["in_chans"]) != in_chans:
        raise CheckpointError(
            f"{source} was trained on {meta['in_chans']}-channel inputs, the data has {in_chans}; {fix}"
        )
    saved_items = state.get("train_items")
    if saved_items is not None and saved_items != num_items:
        raise CheckpointError(
            f"the training split has {num_items} items, but {source} was trained on {saved_items}; the rest of "
            f"the run would read another data order. {fix[0].upper()}{fix[1:]}"
        )


def _explicit(key: str, explicit: frozenset[str]) -> bool:
    return key in explicit or any(key.startswith(e + ".") for e in explicit)


def adopt_accepted_changes(cfg: Config, run_dir: Path, explicit: frozenset[str] = frozenset()) -> dict:
    """A plain `--resume` of a run with accepted changes continues the run as changed: every key the caller did not
    set on purpose (`explicit`: the override keys) and that still has the run's original value takes the value in
    force. Returns {key: value in force} adopted."""
    run_dir = Path(run_dir)
    if not (run_dir / CHANGES).is_file() or not (run_dir / "config.yaml").is_file():
        return {}
    original = _resolved(config_from_dict(read_yaml(run_dir / "config.yaml"), f" (in {run_dir / 'config.yaml'})"))
    in_force, now = config_in_force(run_dir), _resolved(cfg)
    adopt = {
        k: v
        for k, v in in_force.items()
        if not _explicit(k, explicit) and now.get(k) == original.get(k) and v != now.get(k)
    }
    for key, value in adopt.items():
        section, name, *rest = key.split(".")
        if not rest:
            setattr(getattr(cfg, section), name, value)
            continue
        target = getattr(getattr(cfg, section), name)
        for part in rest[:-1]:
            target = target.setdefault(part, {})
        target[rest[-1]] = value
    return adopt
