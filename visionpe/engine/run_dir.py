"""What a run directory holds when a run starts: nothing (a new run), or checkpoints to resume from.

A new run into a directory that holds a run is refused; a resume reads the newest readable checkpoint, falling back
from a corrupt newest one with a warning (see checkpoint.py for how checkpoints survive kills).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from .checkpoint import CheckpointError, load_training_state, load_weights, remove_stale_tmp, resume_candidates

__all__ = ["CorruptCheckpointWarning", "resume_files", "warn_fell_back"]


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
