"""What a `--resume` may change: overrides that change what is trained are refused unless accepted on purpose.

The run directory's `config.yaml` keeps the config the run started with; every accepted change is appended to
`config_changes.jsonl` with the step at which it took effect, so the config in force is `config.yaml` plus those
changes. Keys that cannot change the trained weights (threads, logging, progress, checkpoint cadence, what is
evaluated and how fast) may differ freely.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from .config import Config, ConfigError, config_from_dict, config_to_dict

__all__ = ["FREE_KEYS", "CHANGES", "config_in_force", "changed_keys", "check_resume_changes"]

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
        "data.workers",  # items are seeded per (seed, epoch, index): the same with any worker count
        "data.eval_batch_size",
    }
)


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"optim": {"lr": 1}, "model": {"kwargs": {"depth": 2}}} -> {"optim.lr": 1, "model.kwargs.depth": 2}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))  # an empty dict adds nothing: {} and unset are the same
        else:
            out[f"{prefix}{k}"] = v
    return out


def _resolved(cfg: Config) -> dict:
    flat = _flatten(config_to_dict(cfg))
    flat["model.img_size"] = flat.get("model.img_size") or flat["data.resolution"]  # as the trainer resolves it
    return flat


def config_in_force(run_dir: Path) -> dict | None:
    """The run's config as flat {key: value}: config.yaml plus every accepted change (None: no config.yaml)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    flat = _resolved(config_from_dict(yaml.safe_load(path.read_text()), f" (in {path})"))
    log = Path(run_dir) / CHANGES
    if log.is_file():
        for line in log.read_text().splitlines():
            if line.strip():
                for key, (_, new) in json.loads(line)["changes"].items():
                    flat[key] = new
    return flat


def changed_keys(old: dict, new: dict) -> dict[str, tuple]:
    """{key: (old, new)} for keys (free ones excluded) whose value differs."""
    return {
        k: (old.get(k), new.get(k))
        for k in sorted(set(old) | set(new))
        if k not in FREE_KEYS and old.get(k) != new.get(k)
    }


def check_resume_changes(cfg: Config, run_dir: Path, step: int, epoch: int, accept: bool, write: bool) -> dict:
    """Refuse (ConfigError naming each key) or, with `accept`, record the changes `cfg` makes to the run."""
    old = config_in_force(run_dir)
    if old is None:
        return {}
    changes = changed_keys(old, _resolved(cfg))
    if not changes:
        return {}
    listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
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
