"""Sharded checkpoints of `train.strategy=fsdp` runs, written by every rank with torch.distributed.checkpoint (DCP).

A run directory holds `checkpoints/<tag>.dcp/`: DCP's files (model, optimizer and, with EMA, the EMA model, each
rank writing its own shards), `meta.json` (the same metadata as a safetensors checkpoint: model, config, classes, plus
the world size) and `rank<r>.state.pt` per rank (scheduler, scaler, that rank's RNG states, the position in the data;
read back with `torch.load(weights_only=True)`). The set is written under `.partial-<tag>.dcp`, renamed into place
once every rank is done, and only then does `checkpoint.json` (its `sharded` entry) point to it: a kill at any moment
leaves the previous checkpoint intact and pointed to. Resuming needs the world size that wrote it (the data order and
the per-rank RNG streams depend on it); `load_sharded_weights` reads one in a single process (visionpe-eval, export).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .checkpoint import (
    CKPT_DIR,
    KILL_AT_ENV,
    POINTER,
    CheckpointError,
    CheckpointRef,
    atomic_write_text,
    load_training_state,
    pointer_history,
    read_pointer,
    remove_stale_tmp,
    rng_state,
)
from .dcp_reader import dcp_load, read_dcp_metadata

__all__ = [
    "SHARDED_SUFFIX",
    "is_sharded_run",
    "save_sharded",
    "check_sharded_run_dir",
    "load_sharded",
    "load_sharded_weights",
]

SHARDED_SUFFIX = ".dcp"
PARTIAL = ".partial-"
_writes = 0


def _phase(name: str) -> None:
    """Fault injection for tests (as in checkpoint.py): VISIONPE_FAULT_KILL_AT=<phase>,<k> SIGKILLs rank 0 when its
    k-th sharded write reaches sharded-tmp (all ranks written, not renamed), sharded (renamed), pointer, pruned."""
    spec = os.environ.get(KILL_AT_ENV)
    if spec and spec.split(",")[0] == name and int(spec.split(",")[1]) == _writes:
        os.kill(os.getpid(), signal.SIGKILL)


def is_sharded_run(path: str | os.PathLike) -> bool:
    """Is `path` a run directory whose latest checkpoint is sharded (or a sharded checkpoint folder itself)?"""
    path = Path(path)
    if path.is_dir() and path.name.endswith(SHARDED_SUFFIX):
        return True
    if path.is_dir() and any((path / CKPT_DIR).glob(f"*{SHARDED_SUFFIX}")):
        return True
    try:
        pointer = read_pointer(path) if path.is_dir() else None
    except CheckpointError:  # a corrupt pointer: the checkpoint files on disk decide (run_dir.py falls back)
        return False
    return bool(pointer and pointer.get("sharded"))


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _tensor_state(tr) -> dict:
    state = {"model": get_model_state_dict(tr.model), "optimizer": get_optimizer_state_dict(tr.model, tr.optimizer)}
    if tr.ema is not None:
        state["ema"] = get_model_state_dict(tr.ema.module)
    return state


def _rank_state(tr) -> dict:
    seconds, cpu_seconds = tr.spent()
    return {
        "spent": (seconds, cpu_seconds),
        "epoch": tr.epoch,
        "batch": tr.batch,
        "global_step": tr.global_step,
        "loss_tally": tr.tally.state(tr.ctx),
        "scheduler": tr.scheduler.state_dict() if tr.scheduler else None,
        "scaler": tr.scaler.state_dict(),
        "rng": rng_state(),
        "sched_key": tr._sched_key(),
        "world_size": tr.ctx.world_size,
    }


def _fsync_write(path: Path, write) -> None:
    write(path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_sharded(tr, finished: bool = False) -> None:
    """Every rank: write the trainer's checkpoint under a temporary folder; rank 0 renames it, points to it, prunes."""
    global _writes
    _writes += 1
    ckpt_dir = tr.run_dir / CKPT_DIR
    tag = f"e{tr.epoch:04d}-b{tr.batch:06d}"
    tmp, final = ckpt_dir / f"{PARTIAL}{tag}{SHARDED_SUFFIX}", ckpt_dir / f"{tag}{SHARDED_SUFFIX}"
    if tr.ctx.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    dcp.save(_tensor_state(tr), checkpoint_id=tmp)
    state = _rank_state(tr)
    _fsync_write(tmp / f"rank{tr.ctx.rank}.state.pt", lambda p: torch.save(state, p))
    if tr.ctx.is_main:
        meta = {**tr._metadata(), "world_size": tr.ctx.world_size, "ema": tr.ema is not None}
        _fsync_write(tmp / "meta.json", lambda p: p.write_text(json.dumps(meta, indent=1)))
    _barrier()
    if tr.ctx.is_main:
        _phase("sharded-tmp")
        old_history = pointer_history(tr.run_dir)  # plain names only (read_pointer checks them)
        if final.exists():  # a tag written again after a resume from an older checkpoint: never the pointed-to one
            shutil.rmtree(final)
        os.replace(tmp, final)
        _phase("sharded")
        history = [t for t in old_history if t != tag] + [tag]
        keep = max(tr.cfg.train.keep_checkpoints, 1)
        seconds, cpu_seconds = state["spent"]
        pointer = dict(
            tr.checkpoint_info(finished, seconds, cpu_seconds),
            sharded=str(final.relative_to(tr.run_dir)),
            world_size=tr.ctx.world_size,
            history=history[-keep:],
        )
        atomic_write_text(tr.run_dir / POINTER, json.dumps(pointer, indent=1))
        _phase("pointer")
        for stale in history[:-keep]:
            shutil.rmtree(ckpt_dir / f"{stale}{SHARDED_SUFFIX}", ignore_errors=True)
        _phase("pruned")
    _barrier()


def _candidates(run_dir: Path) -> list[Path]:
    """Sharded checkpoint folders, newest first: the pointer's history, then (pointer unreadable) those on disk."""
    ckpt_dir = run_dir / CKPT_DIR
    try:
        tags = (read_pointer(run_dir) or {}).get("history", [])[::-1]
    except CheckpointError:
        tags = []
    found = sorted(
        (p.name.removesuffix(SHARDED_SUFFIX) for p in ckpt_dir.glob(f"*{SHARDED_SUFFIX}") if p.is_dir()),
        reverse=True,
    )
    tags += [t for t in found if t not in tags and not t.startswith(PARTIAL)]
    return [ckpt_dir / f"{t}{SHARDED_SUFFIX}" for t in tags if (ckpt_dir / f"{t}{SHARDED_SUFFIX}").is_dir()]


def _read_meta(folder: Path) -> dict:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {folder / 'meta.json'} ({e})") from None
    if not (folder / ".metadata").is_file():
        raise CheckpointError(f"{folder} has no DCP .metadata file (an incomplete write)")
    return meta


def check_sharded_run_dir(tr, resume: bool) -> tuple:
    """Trainer._check_run_dir for fsdp runs: (checkpoint to resume, (None, None, this rank's training state)) or
    (None, None); a DDP run, an existing run without --resume, or another world size is a CheckpointError."""
    run_dir, ctx = tr.run_dir, tr.ctx
    pointer = None
    if (run_dir / POINTER).is_file():
        try:
            pointer = read_pointer(run_dir)
        except CheckpointError as e:  # as for ddp runs: the checkpoint folders on disk, newest first
            pointer = {}  # there, unreadable: the directory still holds a run
            if resume and ctx.is_main:
                warnings.warn(f"{e}; looking for checkpoints in {run_dir / CKPT_DIR}", stacklevel=2)
    if pointer is not None and pointer.get("weights") and not pointer.get("sharded"):
        raise CheckpointError(
            f"{run_dir} was trained with train.strategy=ddp (safetensors checkpoints); continue it with "
            f"train.strategy=ddp, or export its weights and start a new fsdp run from them (docs/training.md)"
        )
    if not tr.sharded:
        raise CheckpointError(
            f"{run_dir} was trained with train.strategy=fsdp (sharded checkpoints); continue it with "
            f"train.strategy=fsdp, or export its weights (visionpe-export) and start a new run from them"
        )
    candidates = _candidates(run_dir) if run_dir.is_dir() else []
    if resume and not candidates:
        raise CheckpointError(f"nothing to resume in {run_dir} (no sharded checkpoint); start without --resume")
    if not resume and (candidates or pointer is not None):
        raise CheckpointError(
            f"{run_dir} already holds a run; continue it with --resume, or start a new "
            f"one with train.run_name=<new name> (or train.output_dir=...)"
        )
    if not resume:
        return None, None
    if ctx.is_main:
        remove_stale_tmp(run_dir)
        for partial in (run_dir / CKPT_DIR).glob(f"{PARTIAL}*"):
            shutil.rmtree(partial, ignore_errors=True)
    broken = []
    for folder in candidates:
        try:
            meta = _read_meta(folder)
            if meta["world_size"] != ctx.world_size:
                raise ValueError(meta["world_size"])
            state = load_training_state(folder / f"rank{ctx.rank}.state.pt")
        except CheckpointError as e:
            broken.append(str(e))
            continue
        except ValueError:
            raise CheckpointError(
                f"{folder} was written by {meta['world_size']} processes, this run has {ctx.world_size}: resume "
                f"with torchrun --nproc_per_node ... totalling {meta['world_size']} (the data order and each "
                f"rank's random streams depend on it), or export its weights (visionpe-export) and start a new "
                f"run from them"
            ) from None
        return CheckpointRef(folder, None, None, pointer), (None, None, state)
    raise CheckpointError(f"no readable checkpoint in {run_dir}: {'; '.join(broken)}; start a new run")


def load_sharded(tr, ref: CheckpointRef) -> None:
    """Every rank: model, optimizer and EMA shards from the checkpoint folder `ref.weights` into the trainer."""
    folder = ref.weights
    meta = _read_meta(folder)
    if tr.ema is not None and not meta.get("ema"):
        raise CheckpointError(
            f"{folder} has no EMA weights but train.ema=true; resume with train.ema=false or start a new run"
        )
    state = _tensor_state(tr)
    dcp_load(state, folder)  # DCP's index and values read without unpickling arbitrary objects (dcp_reader.py)
    set_model_state_dict(tr.model, state["model"])
    set_optimizer_state_dict(tr.model, tr.optimizer, state["optimizer"])
    if tr.ema is not None:
        set_model_state_dict(tr.ema.module, state["ema"])


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
    out_meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    return {k.removeprefix(prefix): v for k, v in state.items()}, out_meta
