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
    with open(path, "a") as f:
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
