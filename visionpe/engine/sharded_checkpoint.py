"""The torch.distributed.checkpoint (DCP) backend of checkpoint_manager.py, for `train.strategy=fsdp` runs: every rank
writes its own shards.

A run directory holds `checkpoints/<tag>.dcp/`: DCP's files (model, optimizer and, with EMA, the EMA model), `meta.json`
(the weights' metadata as a safetensors checkpoint's: checkpoint_manager.run_header, plus the world size) and
`rank<r>.state.pt` per rank (its training state: train_state.TrainingParts.rank_state). The set is written under
`.partial-<tag>.dcp` and renamed into place once every rank is done; checkpoint.json (its `sharded` entry) then points
to it, as the manager does for every backend. Resuming needs the world size that wrote it; `load_sharded_weights`
reads one in a single process (visionpe-eval, export).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .checkpoint import CKPT_DIR, PARTIAL, POINTER, CheckpointError, fault_point, load_training_state, read_pointer
from .checkpoint_backend import Found, Unreadable, WriteFailed, describe_failure, warn_old_layout
from .dcp_reader import dcp_load, read_dcp_metadata
from .distributed import DistContext
from .fsdp import load_full_checked
from .train_state import TrainingParts

__all__ = ["SHARDED_SUFFIX", "ShardedBackend", "is_sharded_run", "load_sharded_weights"]

SHARDED_SUFFIX = ".dcp"


def is_sharded_run(path: str | os.PathLike) -> bool:
    """Is `path` a run directory whose latest checkpoint is sharded (or a sharded checkpoint folder itself)?"""
    path = Path(path)
    if path.is_dir() and path.name.endswith(SHARDED_SUFFIX):
        return True
    if path.is_dir() and any((path / CKPT_DIR).glob(f"*{SHARDED_SUFFIX}")):
        return True
    try:
        pointer = read_pointer(path) if path.is_dir() else None
    except CheckpointError:  # a corrupt pointer: the checkpoint files on disk decide (the manager falls back)
        return False
    return bool(pointer and pointer.get("sharded"))


def _tensor_state(parts: TrainingParts) -> dict:
    state = {
        "model": get_model_state_dict(parts.model),
        "optimizer": get_optimizer_state_dict(parts.model, parts.optimizer),
    }
    if parts.ema is not None:
        state["ema"] = get_model_state_dict(parts.ema)
    return state


def _fsync_write(path: Path, write) -> None:
    write(path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _as_header(meta: dict) -> dict[str, str]:
    """meta.json as a safetensors checkpoint's metadata (string values): what the data checks and loaders read."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


def _read_meta(folder: Path) -> dict:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {folder / 'meta.json'} ({e})") from None
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"{folder} has no DCP .metadata file (an incomplete write)")
    return meta


class ShardedBackend:
    strategy = "fsdp"

    def __init__(self):
        self._metas: dict[str, dict] = {}  # meta.json of checkpoints read by world_size, for read

    def tags_on_disk(self, ckpt_dir: Path) -> list[str]:
        return [p.name.removesuffix(SHARDED_SUFFIX) for p in ckpt_dir.glob(f"*{SHARDED_SUFFIX}") if p.is_dir()]

    def source(self, ckpt_dir: Path, tag: str) -> Path:
        return ckpt_dir / f"{tag}{SHARDED_SUFFIX}"

    def partial(self, ckpt_dir: Path, tag: str) -> Path:
        return ckpt_dir / f"{PARTIAL}{tag}{SHARDED_SUFFIX}"

    def prepare(self, ckpt_dir: Path, tag: str) -> None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.partial(ckpt_dir, tag), ignore_errors=True)
        self.partial(ckpt_dir, tag).mkdir()

    def payload(self, parts: TrainingParts, state: dict, header: dict[str, str], ctx: DistContext) -> tuple:
        return parts, state, {**header, "world_size": ctx.world_size, "ema": parts.ema is not None}

    def write(self, ckpt_dir: Path, tag: str, payload: tuple, ctx: DistContext) -> dict | None:
        parts, state, meta = payload
        tmp = self.partial(ckpt_dir, tag)
        try:
            dcp.save(_tensor_state(parts), checkpoint_id=tmp)
            _fsync_write(tmp / f"rank{ctx.rank}.state.pt", lambda p: torch.save(state, p))
            if ctx.is_main:
                _fsync_write(tmp / "meta.json", lambda p: p.write_text(json.dumps(meta, indent=1)))
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            raise WriteFailed(self.source(ckpt_dir, tag), e) from e
        return {"sharded": f"{CKPT_DIR}/{tag}{SHARDED_SUFFIX}"} if ctx.is_main else None

    def commit(self, ckpt_dir: Path, tag: str) -> None:
        fault_point("sharded-tmp")
        final = self.source(ckpt_dir, tag)
        if final.exists():  # a tag written again after a resume from an older checkpoint: never the pointed-to one
            shutil.rmtree(final)
        os.replace(self.partial(ckpt_dir, tag), final)
        fault_point("sharded")

    def remove(self, ckpt_dir: Path, tag: str) -> None:
        shutil.rmtree(self.source(ckpt_dir, tag), ignore_errors=True)

    def world_size(self, ckpt_dir: Path, tag: str) -> int:
        folder = self.source(ckpt_dir, tag)
        meta = _read_meta(folder)
        if not isinstance(meta.get("world_size"), int):
            raise CheckpointError(f"{folder / 'meta.json'} names no world size")
        self._metas[tag] = meta
        return meta["world_size"]

    def read(self, ckpt_dir: Path, tag: str, rank: int) -> Found:
        folder = self.source(ckpt_dir, tag)
        state = load_training_state(folder / f"rank{rank}.state.pt")
        meta = self._metas.pop(tag)
        return Found(tag, folder, state, bool(meta.get("ema")), meta=_as_header(meta))

    def load(self, found: Found, parts: TrainingParts, model_name: str) -> None:
        saved = {k for k in read_dcp_metadata(found.source).state_dict_metadata if k.startswith("model.")}
        if saved != {f"model.{k}" for k in parts.model.state_dict()}:  # an earlier PE layout, or another model
            return self._load_full(found, parts, model_name)
        state = _tensor_state(parts)
        try:  # DCP's index and values read without unpickling arbitrary objects (dcp_reader.py)
            dcp_load(state, found.source)
            set_model_state_dict(parts.model, state["model"])
            set_optimizer_state_dict(parts.model, parts.optimizer, state["optimizer"])
            if parts.ema is not None:
                set_model_state_dict(parts.ema, state["ema"])
        except CheckpointException as e:  # DCP fails on every rank together
            raise Unreadable(f"cannot read the shards of {found.source} ({describe_failure(e)})") from None

    def _load_full(self, found: Found, parts: TrainingParts, model_name: str) -> None:
        """Weights whose names are not the model's: read whole on each rank, placed (PE names of earlier releases
        under each block) and checked as a plain checkpoint's; the optimizer's moments, listed in the old parameter
        order, start again."""
        try:
            state, meta = load_sharded_weights(found.source)
            ema = load_sharded_weights(found.source, ema=True)[0] if parts.ema is not None else None
        except CheckpointException as e:
            raise Unreadable(f"cannot read the shards of {found.source} ({describe_failure(e)})") from None
        old_layout = load_full_checked(parts.model, state, meta, model_name, found.source)
        if ema is not None:
            load_full_checked(parts.ema, ema, meta, model_name, found.source)
        if old_layout:
            warn_old_layout(found.source)


def _sharded_folder(path: Path) -> Path:
    if path.name.endswith(SHARDED_SUFFIX):
        return path
    pointer = read_pointer(path) or {}
    if not pointer.get("sharded"):
        raise CheckpointError(f"{path} has no {POINTER} naming a sharded checkpoint; pass one of its {CKPT_DIR}/*.dcp")
    folder = path / pointer["sharded"]
    if not folder.is_dir():
        raise CheckpointError(f"{path / POINTER} points to {folder}, which is missing")
    return folder


def load_sharded_weights(path: str | os.PathLike, ema: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """(full state dict, safetensors-style metadata) of a sharded checkpoint (a run directory or a `.dcp` folder),
    read in this process alone: no process group, whatever world size wrote it."""
    folder = _sharded_folder(Path(path))
    meta = _read_meta(folder)
    if ema and not meta.get("ema"):
        raise CheckpointError(f"{path} has no EMA weights (train with train.ema=true)")
    prefix = "ema." if ema else "model."
    layout = read_dcp_metadata(folder).state_dict_metadata
    state = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in layout.items()
        if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    dcp_load(state, folder, no_dist=True)
    return {k.removeprefix(prefix): v for k, v in state.items()}, _as_header(meta)
