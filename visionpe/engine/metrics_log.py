"""`metrics.jsonl`: one JSON object a line, appended by rank 0; trimmed back to a checkpoint's step on resume.

A crash while appending can leave the last line cut off; `trim_metrics` drops such a line (it is after the
checkpoint's step anyway: the checkpoint is written after its metrics). A bad line elsewhere is an error naming the
file and the line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint import CheckpointError, atomic_write_text

__all__ = ["METRICS", "append_metrics", "trim_metrics"]

METRICS = "metrics.jsonl"


def append_metrics(path: str | os.PathLike, row: dict) -> None:
    """Append one line; a symbolic link put in the run's place is refused, never followed (its target is kept)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise CheckpointError(
                f"{path} is a symbolic link; a run writes its own metrics file: remove the link"
            ) from None
        raise e
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(row, allow_nan=False) + "\n")


def trim_metrics(path: str | os.PathLike, global_step: int) -> None:
    """Keep the lines of steps up to `global_step` (those logged after the checkpoint belong to the stopped run)."""
    path = Path(path)
    if not path.is_file():
        return
    lines = path.read_text(errors="replace").splitlines()
    keep = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:  # cut off by a crash while it was appended
                continue
            raise CheckpointError(
                f"{path} line {i + 1} is not JSON ({e}); fix or delete that line, then resume again"
            ) from None
        if row.get("global_step", 0) <= global_step:
            keep.append(line)
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))
