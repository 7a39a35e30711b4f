"""What a checkpoint storage format provides to checkpoint_manager.py: the Backend protocol and the values that cross
it. Two backends: plain_checkpoint.py (safetensors, rank 0 writes; train.strategy=ddp and one process) and
sharded_checkpoint.py (torch.distributed.checkpoint, every rank writes its shards; train.strategy=fsdp)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch.distributed.checkpoint.api import CheckpointException

from .checkpoint import CheckpointError, WriteFailed
from .distributed import DistContext
from .train_state import TrainingParts

__all__ = [
    "Backend",
    "Found",
    "WriteFailed",
    "Unreadable",
    "OldLayoutResumeWarning",
    "warn_old_layout",
    "failure_causes",
    "describe_failure",
]


@dataclass
class Found:
    """A checkpoint chosen to resume from, read as far as the backend reads before the model exists."""

    tag: str
    source: Path  # what messages name: the weights file or the sharded checkpoint's folder
    state: dict  # this rank's training state (train_state.TrainingParts.rank_state, as written)
    has_ema: bool
    meta: dict[str, str] | None = None  # the weights' metadata, when read ahead (the data they were trained on)
    files: Any = None  # what the backend read ahead for `load`


class Unreadable(CheckpointError):
    """A checkpoint's tensors cannot be read (found only when loading them): the resume falls back to an older one."""


class OldLayoutResumeWarning(UserWarning):
    """A run written by a release before each attention layer owned its PE state resumed: its weights load (mapped
    under each block), its optimizer's moments, listed in the old parameter order, start again."""


def warn_old_layout(source: Path) -> None:
    warnings.warn(
        f"{source} holds PE parameters in the layout of an earlier visionpe release: the weights "
        "load, the optimizer's moments start again (schedule, step and data position resume)",
        OldLayoutResumeWarning,
        stacklevel=4,
    )


class Backend(Protocol):
    strategy: str  # the train.strategy whose checkpoints it stores

    def tags_on_disk(self, ckpt_dir: Path) -> list[str]: ...

    def source(self, ckpt_dir: Path, tag: str) -> Path: ...

    def partial(self, ckpt_dir: Path, tag: str) -> Path | None:
        """The folder a write fills before it is renamed into place (None: files are renamed one by one)."""

    def prepare(self, ckpt_dir: Path, tag: str) -> None:
        """Rank 0, before any rank writes."""

    def payload(self, parts: TrainingParts, state: dict, header: dict[str, str], ctx: DistContext) -> Any:
        """Every rank: what `write` stores (the backend's collectives run here)."""

    def write(self, ckpt_dir: Path, tag: str, payload: Any, ctx: DistContext) -> dict | None:
        """Every rank: store `payload` (WriteFailed if it cannot); rank 0 returns the pointer's entries."""

    def commit(self, ckpt_dir: Path, tag: str) -> None:
        """Rank 0, every rank's write done: move the checkpoint into place."""

    def remove(self, ckpt_dir: Path, tag: str) -> None: ...

    def world_size(self, ckpt_dir: Path, tag: str) -> int:
        """The number of processes that wrote checkpoint `tag` (a CheckpointError if it cannot be read)."""

    def read(self, ckpt_dir: Path, tag: str, rank: int) -> Found:
        """This rank's training state of `tag` and what is read ahead (a CheckpointError if it cannot be read)."""

    def load(self, found: Found, parts: TrainingParts, model_name: str) -> None:
        """The model, optimizer and EMA tensors of `found` into `parts` (Unreadable: fall back to an older one)."""


def failure_causes(e: BaseException) -> list[BaseException]:
    """The exceptions behind `e`: DCP reports each rank's failure inside one CheckpointException."""
    return [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]


def describe_failure(e: BaseException) -> str:
    cause = failure_causes(e)[0]
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
