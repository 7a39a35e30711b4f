"""Checkpoint files that survive a kill and load without unpickling anything: the atomic write, the fault hooks, the
safetensors weights, the pointer and the scan for a run's checkpoints. checkpoint_manager.py writes and resumes a
run's checkpoints through them, whatever its strategy.

A plain (ddp) run directory holds `checkpoints/<tag>.safetensors` (the weights, with the model name and the
resolved config in the safetensors metadata), `<tag>-ema.safetensors` when EMA is on, and `<tag>.state.pt`
(optimizer, scheduler, scaler, RNG states, position in the data: tensors and plain Python values only, read back with
`torch.load(weights_only=True)`). Every file is written to a temporary name and renamed into place, and
`checkpoint.json`, the pointer to the latest complete set, is replaced last: a kill at any moment leaves the previous
checkpoint intact and pointed to. A sharded (fsdp) run keeps the same pointer, its tensors and per-rank states in
`<tag>.dcp/` (sharded_checkpoint.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..zoo.checkpoint_filters import kind_mismatches

__all__ = [
    "CheckpointError",
    "CheckpointRef",
    "POINTER",
    "atomic_write",
    "atomic_write_text",
    "save_weights",
    "load_weights",
    "write_checkpoint",
    "write_plain_files",
    "remove_plain_files",
    "publish_checkpoint",
    "WriteFailed",
    "write_error",
    "find_checkpoint",
    "read_pointer",
    "load_training_state",
    "current_layout",
    "load_into_model",
    "DiskFullError",
    "is_disk_full",
    "disk_full_error",
    "check_world_size",
    "remove_leftovers",
    "resume_candidates",
    "checkpoint_tags",
    "KILL_AT_ENV",
    "fault_point",
    "begin_write",
    "is_plain_name",
    "pointer_history",
]

POINTER = "checkpoint.json"
CKPT_DIR = "checkpoints"
_UMASK = os.umask(0)
os.umask(_UMASK)


class CheckpointError(ValueError):
    """A checkpoint that is missing, broken or does not fit the model; the message names the fix. `every_rank`: every
    process of the run raises the same one (the command line prints it once, from rank 0)."""

    every_rank = False


class DiskFullError(CheckpointError):
    """The disk filled up while a checkpoint was written; the previous checkpoint is intact."""


# Fault injection for tests: "<phase>,<k>" SIGKILLs this process (rank 0 of a sharded run) when the k-th checkpoint
# write (1-based) reaches <phase>: weights-tmp / state-tmp / pointer-tmp (temporary file written and fsynced, not yet
# renamed), weights / state / pointer (renamed into place), sharded-tmp / sharded (a sharded checkpoint's folder
# written by every rank / renamed into place), pruned (old checkpoints deleted).
KILL_AT_ENV = "VISIONPE_FAULT_KILL_AT"
PARTIAL = ".partial-"  # the prefix of a sharded checkpoint's folder while its ranks write it
_writes = 0


def begin_write() -> None:
    """Count one more checkpoint write (the k of KILL_AT_ENV)."""
    global _writes
    _writes += 1


def fault_point(name: str) -> None:
    spec = os.environ.get(KILL_AT_ENV)
    if spec and spec.split(",")[0] == name and int(spec.split(",")[1]) == _writes:
        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write(path: str | os.PathLike, write, phase: str | None = None) -> None:
    """`write(tmp)` to a temporary name, fsynced, then renamed to `path` (fault points `<phase>-tmp`, `<phase>`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        try:
            write(tmp)
            os.chmod(tmp, 0o666 & ~_UMASK)  # some writers create 0600 files
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        except Exception as e:  # safetensors and torch.save report a full disk in their own error types
            if is_disk_full(e, tmp.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp)) from e
            raise
        if phase:
            fault_point(f"{phase}-tmp")
        os.replace(tmp, path)
        if phase:
            fault_point(phase)
    finally:
        if tmp.exists():
            tmp.unlink()


_atomic = atomic_write  # its earlier name (tests/test_destinations.py)


def is_disk_full(e: Exception, folder: Path) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    try:  # torch.save says only "file write failed": the disk is full if it has less than a write's worth left
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


def remove_leftovers(run_dir: str | os.PathLike) -> list[Path]:
    """Delete what a killed writer left in a run directory: temporary files (`.<name>.tmp-<pid>`) and the folders of
    sharded checkpoints its ranks had not finished (`checkpoints/.partial-<tag>.dcp`)."""
    run_dir = Path(run_dir)
    stale = [p for d in (run_dir, run_dir / CKPT_DIR) if d.is_dir() for p in d.glob(".*.tmp-*")]
    for p in stale:
        p.unlink(missing_ok=True)
    partial = list((run_dir / CKPT_DIR).glob(f"{PARTIAL}*")) if (run_dir / CKPT_DIR).is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return stale + partial


def atomic_write_text(path: str | os.PathLike, text: str, phase: str | None = None) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text), phase)


def save_weights(
    path: str | os.PathLike, state_dict: dict[str, torch.Tensor], metadata: dict[str, str], phase: str | None = None
) -> None:
    """A state dict as safetensors, atomically; tensors that share memory are stored as copies."""
    tensors, seen = {}, set()
    for k, v in state_dict.items():
        v = v.detach().cpu()
        ptr = v.untyped_storage().data_ptr() if v.numel() else None
        tensors[k] = v.clone() if ptr in seen else v.contiguous()
        if ptr is not None:
            seen.add(ptr)
    meta = {k: str(v) for k, v in metadata.items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), phase)


def load_weights(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
    return tensors, meta


# ----------------------------------------------------------------------------------------------- run checkpoints


@dataclass
class CheckpointRef:
    """The files of one checkpoint and what the pointer says about it."""

    weights: Path
    ema: Path | None = None
    state: Path | None = None
    info: dict | None = None  # the pointer: epoch, batch, global_step, finished, ...


def write_checkpoint(
    run_dir: str | os.PathLike,
    tag: str,
    model_state: dict,
    metadata: dict[str, str],
    train_state: dict,
    ema_state: dict | None = None,
    info: dict | None = None,
    keep: int = 2,
) -> CheckpointRef:
    """Write weights, EMA weights and training state under `tag`, then move the pointer, then prune old tags (one
    process; checkpoint_manager.py's path, as a training run writes). A full disk is a DiskFullError naming the path;
    the previous checkpoint stays intact and pointed to."""
    begin_write()
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / CKPT_DIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    try:
        entries = write_plain_files(ckpt_dir, tag, model_state, metadata, train_state, ema_state)
    except WriteFailed as e:
        raise write_error(run_dir, e.error, e.path) from None
    try:
        pointer = publish_checkpoint(run_dir, tag, {**(info or {}), **entries}, keep, lambda: None, remove_plain_files)
    except OSError as e:
        raise write_error(run_dir, e, run_dir / POINTER) from None
    return find_checkpoint_in(run_dir, pointer)


class WriteFailed(Exception):
    """Writing checkpoint file `path` failed with `error` (the manager makes every rank agree on it)."""

    def __init__(self, path: Path, error: BaseException):
        super().__init__(str(error))
        self.path, self.error = path, error


def write_error(run_dir: Path, error: BaseException, path: Path) -> BaseException:
    """What a failed checkpoint write of `path` raises: a DiskFullError for a full disk, else the error itself."""
    return disk_full_error(run_dir, path) if is_disk_full(error, path.parent) else error


def write_plain_files(
    ckpt_dir: Path, tag: str, model_state: dict, metadata: dict[str, str], train_state: dict, ema_state: dict | None
) -> dict:
    """A plain checkpoint's files, each renamed into place once written (WriteFailed naming the file if one cannot
    be); returns the pointer's entries."""
    weights, ema, state = (
        ckpt_dir / f"{tag}.safetensors",
        ckpt_dir / f"{tag}-ema.safetensors",
        ckpt_dir / f"{tag}.state.pt",
    )
    path = weights
    try:
        save_weights(weights, model_state, metadata, phase="weights")
        if ema_state is not None:
            path = ema
            save_weights(ema, ema_state, {**metadata, "ema": "true"})
        path = state
        atomic_write(state, lambda tmp: torch.save(train_state, tmp), "state")
    except Exception as e:
        raise WriteFailed(path, e) from e
    rel = f"{CKPT_DIR}/{tag}"
    return {"weights": f"{rel}.safetensors", "ema": f"{rel}-ema.safetensors" if ema_state is not None else None,
            "state": f"{rel}.state.pt"}  # fmt: skip


def remove_plain_files(ckpt_dir: Path, tag: str) -> None:
    for name in (f"{tag}.safetensors", f"{tag}-ema.safetensors", f"{tag}.state.pt"):
        (ckpt_dir / name).unlink(missing_ok=True)


def publish_checkpoint(run_dir: Path, tag: str, info: dict, keep: int, commit, remove) -> dict:
    """Rank 0, checkpoint `tag` written: `commit()` it into place, point checkpoint.json to it (`info` and the history
    of the newest `keep` tags), `remove(ckpt_dir, tag)` the older ones, delete leftovers; returns the pointer."""
    keep = max(keep, 1)
    history = [t for t in pointer_history(run_dir) if t != tag] + [tag]  # plain names only (read_pointer)
    commit()
    pointer = {**info, "history": history[-keep:]}
    atomic_write_text(run_dir / POINTER, json.dumps(pointer, indent=1), "pointer")
    for stale in history[:-keep]:
        remove(run_dir / CKPT_DIR, stale)
    remove_leftovers(run_dir)  # a killed earlier write's (one writer per run directory)
    fault_point("pruned")
    return pointer


def is_plain_name(name: object) -> bool:
    """A file or folder name with no path in it: a non-empty string, not `.` or `..`, without separators or NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def _pointer_problem(pointer: object) -> str | None:
    """What makes a parsed checkpoint.json unusable (None: nothing). Every file it names must be a plain name in the
    run's checkpoints/ folder: a crafted pointer must not make a resume read or delete files elsewhere."""
    if not isinstance(pointer, dict):
        return f"it holds a JSON {type(pointer).__name__}, not an object"
    if not pointer.get("weights") and not pointer.get("sharded"):
        return "it names no checkpoint (no 'weights' or 'sharded' entry)"
    for key in ("weights", "ema", "state", "sharded"):
        value = pointer.get(key)
        if value is None:
            continue
        parts = value.split("/") if isinstance(value, str) else []
        if len(parts) != 2 or parts[0] != CKPT_DIR or not is_plain_name(parts[1]):
            return f"its {key!r} entry {value!r} is not a file name in {CKPT_DIR}/"
    history = pointer.get("history", [])
    if not isinstance(history, list):
        return f"its 'history' is a JSON {type(history).__name__}, not a list of checkpoint names"
    bad = [t for t in history if not is_plain_name(t)]
    if bad:
        return f"its 'history' names {bad[0]!r}, not a checkpoint name in {CKPT_DIR}/"
    return None


def disk_full_error(run_dir: Path, path: str | os.PathLike) -> DiskFullError:
    """The one line for a checkpoint write into `run_dir` that filled the disk at `path`: what is still intact."""
    try:
        pointer = read_pointer(run_dir) or {}
    except CheckpointError:  # a pointer that names files outside the run: nothing there is vouched for
        pointer = {}
    previous = pointer.get("sharded") or pointer.get("weights")
    kept = (
        f"the previous checkpoint {run_dir / previous} is intact (checkpoint.json still points to it)"
        if previous
        else "no earlier checkpoint"
    )
    return DiskFullError(
        f"disk full while writing checkpoint {path}; {kept}. Free space on {run_dir}'s disk and continue with --resume"
    )


def check_world_size(source: str | os.PathLike, written: int, now: int) -> None:
    """A resume needs the number of processes that wrote the checkpoint: the global batch, the data order and each
    rank's random streams depend on it (DDP and fsdp alike)."""
    if written != now:
        how = "one process (without torchrun)" if written == 1 else f"torchrun --nproc_per_node ... totalling {written}"
        error = CheckpointError(
            f"{source} was written by {written} processes, this run has {now}: resume with {how} (the global batch, "
            f"the data order and each rank's random streams depend on it), or export its weights (visionpe-export) "
            f"and start a new run from them"
        )
        error.every_rank = True
        raise error


def read_pointer(run_dir: Path) -> dict | None:
    """The run's checkpoint.json (None if it has none); a CheckpointError if it is not JSON, not of its shape, or
    names a file outside the run's checkpoints/ folder."""
    path = run_dir / POINTER
    if not path.is_file():
        return None
    try:
        pointer = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is corrupt ({e}); point it at a checkpoint in {run_dir / CKPT_DIR}") from None
    problem = _pointer_problem(pointer)
    if problem:
        raise CheckpointError(f"{path} is corrupt ({problem}); point it at a checkpoint in {run_dir / CKPT_DIR}")
    return pointer


def pointer_history(run_dir: Path) -> list[str]:
    """The checkpoint tags the run's pointer lists, oldest first; [] when it has none or it is unreadable (a writer
    then replaces it, pruning nothing it names)."""
    try:
        return (read_pointer(run_dir) or {}).get("history", [])
    except CheckpointError:
        return []


def find_checkpoint(path: str | os.PathLike) -> CheckpointRef | None:
    """The latest checkpoint of a run directory (None if it has none yet), or a given .safetensors file."""
    path = Path(path)
    if path.is_dir():
        pointer = read_pointer(path)
        return None if pointer is None else find_checkpoint_in(path, pointer)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path} is not a .safetensors file; pass a run directory or its weights file")
        state = path.with_name(path.name.removesuffix("-ema.safetensors").removesuffix(".safetensors") + ".state.pt")
        return CheckpointRef(path, None, state if state.is_file() else None, None)
    raise CheckpointError(f"checkpoint {path} does not exist; pass a run directory or a .safetensors file")


def find_checkpoint_in(run_dir: Path, pointer: dict) -> CheckpointRef:
    """The files of the checkpoint `pointer` (a plain run's checkpoint.json) names; a CheckpointError if one is
    missing."""
    ref = CheckpointRef(
        run_dir / pointer["weights"],
        run_dir / pointer["ema"] if pointer.get("ema") else None,
        run_dir / pointer["state"] if pointer.get("state") else None,
        pointer,
    )
    for p in (ref.weights, ref.ema, ref.state):
        if p is not None and not p.is_file():
            raise CheckpointError(f"{run_dir / POINTER} points to {p}, which is missing")
    return ref


def checkpoint_tags(run_dir: Path, on_disk: list[str], warn: bool = True) -> list[str]:
    """The run's checkpoint tags, newest first: the pointer's history, then (pointer unreadable, or a checkpoint
    written but not yet pointed to) `on_disk`, the tags whose files are in checkpoints/. A corrupt pointer is a
    warning (`warn`): the files on disk stand in for it."""
    try:
        tags = (read_pointer(run_dir) or {}).get("history", [])[::-1]
    except CheckpointError as e:
        if warn:
            warnings.warn(f"{e}; looking for checkpoints in {run_dir / CKPT_DIR}", stacklevel=3)
        tags = []
    found = sorted((t for t in on_disk if not t.startswith(PARTIAL)), reverse=True)  # e<epoch>-b<batch>, zero-padded
    return tags + [t for t in found if t not in tags]


def plain_tags_on_disk(ckpt_dir: Path) -> list[str]:
    """The tags of the plain checkpoints in `ckpt_dir` (by their training-state files)."""
    return [p.name.removesuffix(".state.pt") for p in ckpt_dir.glob("*.state.pt")]


def resume_candidates(run_dir: str | os.PathLike) -> list[CheckpointRef]:
    """The plain run's checkpoints, newest first: the pointer's history, or (pointer unreadable) the files on disk."""
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / CKPT_DIR
    refs = []
    for t in checkpoint_tags(run_dir, plain_tags_on_disk(ckpt_dir)):
        ema = ckpt_dir / f"{t}-ema.safetensors"
        refs.append(
            CheckpointRef(ckpt_dir / f"{t}.safetensors", ema if ema.is_file() else None, ckpt_dir / f"{t}.state.pt")
        )
    return refs


def load_training_state(path: str | os.PathLike) -> dict:
    """The training-state file, read with weights_only=True (no arbitrary objects are unpickled)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot read training state {path} ({e})") from None


def current_layout(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` in the model's names: PE entries of the layout before each attention layer owned its PE state
    (`pe.encodings.<kind>.tables.k.3`, written by earlier releases) moved under their block
    (visionpe.pos.checkpoint.place_flat_entries); a state already in the model's names is returned as it is."""
    from ..pos.base import PosStack
    from ..pos.checkpoint import place_flat_entries

    if not isinstance(getattr(model, "pe", None), PosStack):
        return state
    return place_flat_entries(model, state)


def load_into_model(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    meta: dict[str, str],
    model_name: str,
    source: str | os.PathLike,
) -> bool:
    """Load weights, with an error naming the mismatch when they come from another model or configuration.
    Returns whether they were in the PE layout of earlier releases (see `current_layout`)."""
    trained = meta.get("model")
    if trained and trained != model_name:
        raise CheckpointError(
            f"{source} holds weights of model {trained!r}, not {model_name!r}; use "
            f"model.name={trained} (or drop the model.name override)"
        )
    placed = current_layout(model, state)
    old_layout = placed.keys() != state.keys()
    state = placed
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    kinds = kind_mismatches(state, own)  # int64 / bool values cast into float weights: garbage, no error
    if kinds:
        raise CheckpointError(
            f"{source} does not hold weights of model {model_name!r}: {len(kinds)} tensor(s) of another kind of "
            f"number ({'; '.join(kinds[:3])}); use the file the training wrote"
        )
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if shapes:
            parts.append(f"{len(shapes)} of another shape (checkpoint vs model: {'; '.join(shapes[:3])})")
        raise CheckpointError(
            f"{source} does not fit model {model_name!r}: {', '.join(parts)}; was it trained with "
            f"another model, model.kwargs or dataset (number of classes, channels)?"
        )
    model.load_state_dict(state)
    return old_layout
