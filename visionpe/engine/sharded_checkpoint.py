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
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
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
    _disk_full,
    atomic_write_text,
    check_world_size,
    disk_full_error,
    load_training_state,
    pointer_history,
    read_pointer,
    remove_stale_tmp,
    rng_state,
)
from .dcp_reader import dcp_load, read_dcp_metadata
from .distributed import gather_objects
from .run_dir import warn_fell_back

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


def _causes(e: BaseException) -> list[BaseException]:
    """The exceptions behind `e`: DCP reports each rank's failure inside one CheckpointException."""
    return [exc for exc, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]


def _describe(e: BaseException) -> str:
    cause = _causes(e)[0]
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__


def _agree(tr, error: BaseException | None, path: Path, partial: Path | None = None) -> None:
    """Every rank: wait for the others, and fail together if any rank failed writing checkpoint `path` (instead of
    waiting at a barrier for a rank that gave up). A full disk on any rank is one DiskFullError on every rank, after
    rank 0 removed the `partial` folder."""
    report = None
    if error is not None:
        report = ("disk" if any(_disk_full(c, path.parent) for c in _causes(error)) else "other", _describe(error))
    reports = [(r, rep) for r, rep in enumerate(gather_objects(report, tr.ctx)) if rep is not None]
    if not reports:
        return
    if tr.ctx.is_main and partial is not None:
        shutil.rmtree(partial, ignore_errors=True)
    if any(kind == "disk" for _, (kind, _) in reports):
        error = disk_full_error(tr.run_dir, path)
        error.every_rank = True
        raise error from None
    if error is not None and not isinstance(error, CheckpointException):
        raise error
    rank, (_, what) = reports[0]
    raise CheckpointError(f"rank {rank} failed writing checkpoint {path} ({what}); the previous checkpoint is intact")


def save_sharded(tr, finished: bool = False) -> None:
    """Every rank: write the trainer's checkpoint under a temporary folder; rank 0 renames it, points to it, prunes.
    A failed write on any rank (a full disk: DiskFullError) fails every rank, and the previous checkpoint stays."""
    global _writes
    _writes += 1
    ckpt_dir = tr.run_dir / CKPT_DIR
    tag = f"e{tr.epoch:04d}-b{tr.batch:06d}"
    tmp, final = ckpt_dir / f"{PARTIAL}{tag}{SHARDED_SUFFIX}", ckpt_dir / f"{tag}{SHARDED_SUFFIX}"
    error = None
    if tr.ctx.is_main:
        try:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        except OSError as e:
            error = e
    _agree(tr, error, final, tmp)
    try:
        dcp.save(_tensor_state(tr), checkpoint_id=tmp)
        state = _rank_state(tr)
        _fsync_write(tmp / f"rank{tr.ctx.rank}.state.pt", lambda p: torch.save(state, p))
        if tr.ctx.is_main:
            meta = {**tr._metadata(), "world_size": tr.ctx.world_size, "ema": tr.ema is not None}
            _fsync_write(tmp / "meta.json", lambda p: p.write_text(json.dumps(meta, indent=1)))
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        error = e
    _agree(tr, error, final, tmp)
    if tr.ctx.is_main:
        try:
            _publish(tr, tmp, final, tag, finished, state["spent"])
        except OSError as e:
            error = e
    _agree(tr, error, tr.run_dir / POINTER)


def _publish(tr, tmp: Path, final: Path, tag: str, finished: bool, spent: tuple) -> None:
    """Rank 0: rename the written folder into place, point checkpoint.json to it, prune the oldest."""
    ckpt_dir = final.parent
    _phase("sharded-tmp")
    old_history = pointer_history(tr.run_dir)  # plain names only (read_pointer checks them)
    if final.exists():  # a tag written again after a resume from an older checkpoint: never the pointed-to one
        shutil.rmtree(final)
    os.replace(tmp, final)
    _phase("sharded")
    history = [t for t in old_history if t != tag] + [tag]
    keep = max(tr.cfg.train.keep_checkpoints, 1)
    seconds, cpu_seconds = spent
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
    broken: list[str] = []
    folder, state = _first_readable(tr, candidates, broken)
    ref = CheckpointRef(folder, None, None, pointer)
    if broken and ctx.is_main:
        warn_fell_back(run_dir, broken[0], folder.name, state["global_step"])
    return ref, (None, None, state)


def _first_readable(tr, candidates: list[Path], broken: list[str]) -> tuple[Path, dict]:
    """(folder, this rank's training state) of the first candidate that every rank can read; why each one before it
    was skipped goes to `broken`. A checkpoint of another world size is refused (check_world_size)."""
    ctx = tr.ctx
    for folder in candidates:
        error, state = None, None
        try:
            meta = _read_meta(folder)
        except CheckpointError as e:
            error = str(e)
        else:
            written = meta.get("world_size")
            if not isinstance(written, int):
                error = f"{folder / 'meta.json'} names no world size"
            else:
                check_world_size(folder, written, ctx.world_size)  # before any collective: every rank refuses
                try:
                    state = load_training_state(folder / f"rank{ctx.rank}.state.pt")
                except CheckpointError as e:
                    error = str(e)
        errors = [e for e in gather_objects(error, ctx) if e]  # every rank takes the same checkpoint
        if not errors:
            return folder, state
        broken.append(errors[0])
    error = CheckpointError(f"no readable checkpoint in {tr.run_dir}: {'; '.join(broken)}; start a new run")
    error.every_rank = True
    raise error


def load_sharded(tr, ref: CheckpointRef, state: dict) -> tuple[CheckpointRef, dict]:
    """Every rank: model, optimizer and EMA shards from the checkpoint folder `ref.weights` into the trainer. Shards
    that cannot be read (DCP fails on every rank together) fall back to the next older readable checkpoint, with the
    warning of a DDP resume. Returns the checkpoint loaded and this rank's training state (`state`, or the older's)."""
    folder, broken = ref.weights, []
    while True:
        try:
            _load_folder(tr, folder)
            break
        except CheckpointException as e:
            broken.append(f"cannot read the shards of {folder} ({_describe(e)})")
        candidates = _candidates(tr.run_dir)
        older = candidates[candidates.index(folder) + 1 :] if folder in candidates else []
        folder, state = _first_readable(tr, older, broken)
    if broken:
        if tr.ctx.is_main:
            warn_fell_back(tr.run_dir, broken[0], folder.name, state["global_step"])
        ref = CheckpointRef(folder, None, None, ref.info)
    return ref, state


def _load_folder(tr, folder: Path) -> None:
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
