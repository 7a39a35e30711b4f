"""Whose a run directory is: a run writes only into a missing or empty folder, or one that a visionpe run wrote (what
it holds to resume from is checkpoint_manager.py's to find)."""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import CKPT_DIR, POINTER
from .config import ConfigError, read_yaml
from .runlock import LOCK_FILE

__all__ = ["check_run_dir_is_ours"]

SECTIONS = ("model", "data", "aug", "optim", "train", "eval")


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
