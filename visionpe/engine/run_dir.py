"""What a run directory holds when a run starts: nothing (a new run), or checkpoints to resume from.

A new run into a directory that holds a run is refused; a resume reads the newest readable checkpoint, falling back
from a corrupt newest one with a warning (see checkpoint.py for how checkpoints survive kills).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .checkpoint import (
    CKPT_DIR,
    POINTER,
    CheckpointError,
    load_training_state,
    load_weights,
    remove_stale_tmp,
    resume_candidates,
)
from .config import ConfigError, read_yaml
from .runlock import LOCK_FILE

__all__ = ["CorruptCheckpointWarning", "resume_files", "check_run_dir_is_ours", "warn_fell_back"]

SECTIONS = ("model", "data", "aug", "optim", "train", "eval")


class CorruptCheckpointWarning(UserWarning):
    """The newest checkpoint could not be read; the run resumed from an older, valid one."""


def warn_fell_back(run_dir: Path, why: str, name: str, step: int) -> None:
    """The warning of a resume that skipped an unreadable newest checkpoint (`why`) for the older `name`."""
    warnings.warn(
        f"the newest checkpoint of {run_dir} is unreadable ({why}); resuming from the newest valid one, {name} "
        f"(step {step})",
        CorruptCheckpointWarning,
        stacklevel=3,
    )


def resume_files(run_dir: Path, resume: bool, is_main: bool) -> tuple:
    """(checkpoint to resume, its files read: weights, EMA weights, training state), or (None, None)."""
    candidates = resume_candidates(run_dir) if run_dir.is_dir() else []
    if resume and not candidates:
        raise CheckpointError(f"nothing to resume in {run_dir} (no checkpoint.json); start without --resume")
    if not resume and (candidates or (run_dir / "checkpoint.json").is_file()):
        raise CheckpointError(
            f"{run_dir} already holds a run; continue it with --resume, or start a new "
            f"one with train.run_name=<new name> (or train.output_dir=...)"
        )
    if not resume:
        return None, None
    if is_main:
        remove_stale_tmp(run_dir)
    broken = []
    for ref in candidates:  # newest first: a corrupt newest checkpoint falls back to the newest valid one
        try:
            weights = load_weights(ref.weights)
            ema = load_weights(ref.ema) if ref.ema is not None else None
            state = load_training_state(ref.state)
        except CheckpointError as e:
            broken.append(str(e))
            continue
        if broken and is_main:
            warn_fell_back(run_dir, broken[0], ref.weights.name, state["global_step"])
        return ref, (weights, ema, state)
    raise CheckpointError(f"no readable checkpoint in {run_dir}: {'; '.join(broken)}; start a new run")


def _wrote_config(path: Path, run_name: str) -> bool:
    """Is `path` a config.yaml that a run of this project saved: every section, and the run's own name?"""
    try:
        data = read_yaml(path)
    except (ConfigError, OSError):
        return False
    if not isinstance(data, dict) or not all(isinstance(data.get(s), dict) for s in SECTIONS):
        return False
    return data["train"].get("run_name") == run_name


def check_run_dir_is_ours(run_dir: Path) -> None:
    """A ConfigError unless `run_dir` is missing, empty, or a run directory this project wrote (its lock, its
    checkpoint pointer or files, or a config.yaml it saved): a run never writes over a folder of someone else's."""
    if run_dir.is_symlink() and not run_dir.exists():
        raise ConfigError(
            f"run directory {run_dir} is a symbolic link to {os.readlink(run_dir)}, which is missing or loops; "
            f"remove the link or set train.run_name to another name"
        )
    if not run_dir.is_dir():
        return  # missing (created later) or a file (writable_run_dir names it)
    names = sorted(p.name for p in run_dir.iterdir())
    lock = run_dir / LOCK_FILE
    ckpts = run_dir / CKPT_DIR
    if (
        not names
        or (lock.is_file() and not lock.is_symlink())
        or (run_dir / POINTER).is_file()
        or (ckpts.is_dir() and any(p.name.endswith((".state.pt", ".dcp")) for p in ckpts.iterdir()))
        or _wrote_config(run_dir / "config.yaml", run_dir.name)
    ):
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise ConfigError(
        f"{run_dir} is a folder that no visionpe run wrote (it holds {shown}); a run would overwrite its "
        f"config.yaml and metrics.jsonl: choose another train.run_name or train.output_dir"
    )
