"""The safetensors backend of checkpoint_manager.py (train.strategy=ddp, and one process): rank 0 writes
`checkpoints/<tag>.safetensors` (the weights, their metadata: checkpoint_manager.run_header), `<tag>-ema.safetensors`
with EMA, and `<tag>.state.pt` (the training state with the optimizer's and every rank's RNG states), each file
renamed into place once written (checkpoint.atomic_write)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import (
    load_into_model,
    load_training_state,
    load_weights,
    plain_tags_on_disk,
    remove_plain_files,
    write_plain_files,
)
from .checkpoint_backend import Found, OldLayoutResumeWarning, warn_old_layout
from .distributed import DistContext, gather_objects
from .train_state import TrainingParts, written_world_size

__all__ = ["PlainBackend", "PlainPayload", "OldLayoutResumeWarning"]


@dataclass
class PlainPayload:
    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor] | None
    metadata: dict[str, str]
    state: dict  # the training state, optimizer included


class PlainBackend:
    strategy = "ddp"

    def __init__(self):
        self._states: dict[str, dict] = {}  # training states read by world_size, for read

    def tags_on_disk(self, ckpt_dir: Path) -> list[str]:
        return plain_tags_on_disk(ckpt_dir)

    def source(self, ckpt_dir: Path, tag: str) -> Path:
        return ckpt_dir / f"{tag}.safetensors"

    def partial(self, ckpt_dir: Path, tag: str) -> None:
        return None

    def prepare(self, ckpt_dir: Path, tag: str) -> None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)

    def payload(self, parts: TrainingParts, state: dict, header: dict[str, str], ctx: DistContext) -> PlainPayload:
        rngs = gather_objects(state["rng"], ctx)  # rank 0 writes every rank's streams
        if not ctx.is_main:
            return None
        state = dict(state, optimizer=parts.optimizer.state_dict(), rng=rngs[0])
        state["rng_ranks"] = rngs if ctx.distributed else None  # each rank resumes its own streams
        ema = parts.ema.state_dict() if parts.ema is not None else None
        return PlainPayload(parts.model.state_dict(), ema, header, state)

    def write(self, ckpt_dir: Path, tag: str, payload: PlainPayload | None, ctx: DistContext) -> dict | None:
        if payload is None:  # ranks other than 0
            return None
        return write_plain_files(ckpt_dir, tag, payload.model, payload.metadata, payload.state, payload.ema)

    def commit(self, ckpt_dir: Path, tag: str) -> None:
        pass  # each file was renamed into place as it was written

    def remove(self, ckpt_dir: Path, tag: str) -> None:
        remove_plain_files(ckpt_dir, tag)

    def world_size(self, ckpt_dir: Path, tag: str) -> int:
        self._states[tag] = load_training_state(ckpt_dir / f"{tag}.state.pt")
        return written_world_size(self._states[tag])

    def read(self, ckpt_dir: Path, tag: str, rank: int) -> Found:
        state = self._states.pop(tag)
        weights = load_weights(self.source(ckpt_dir, tag))
        ema_path = ckpt_dir / f"{tag}-ema.safetensors"
        ema = load_weights(ema_path) if ema_path.is_file() else None
        return Found(tag, self.source(ckpt_dir, tag), state, ema is not None, weights[1], (weights, ema, ema_path))

    def load(self, found: Found, parts: TrainingParts, model_name: str) -> None:
        weights, ema, ema_path = found.files
        old_layout = load_into_model(parts.model, *weights, model_name, found.source)
        if parts.ema is not None:
            load_into_model(parts.ema, *ema, model_name, ema_path)
        if old_layout:  # its moments are listed in the parameter order of the earlier layout: not reusable
            warn_old_layout(found.source)
        else:
            parts.optimizer.load_state_dict(found.state["optimizer"])
