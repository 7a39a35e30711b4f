"""torchrun / DDP setup: gloo on CPU, nccl on GPU; only rank 0 writes files and prints.

Under `torchrun --nproc_per_node N train.py ...` the environment carries RANK / WORLD_SIZE / LOCAL_RANK; without it
everything below degrades to a single process with no process group.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "DistContext",
    "CollectiveError",
    "DistTimeoutError",
    "PeerFailedError",
    "init_distributed",
    "resolve_device",
    "all_reduce_sum",
    "all_reduce_max",
    "gather_objects",
    "barrier",
    "shutdown",
    "timeouts_explained",
    "resume_command",
]


class CollectiveError(RuntimeError):
    """A collective operation failed: another process of the group hung, died or lost its connection."""


class DistTimeoutError(CollectiveError):
    """Another process of the group did not answer within train.dist_timeout seconds."""


class PeerFailedError(CollectiveError):
    """Another process of the group died (or its connection broke) while this one waited for it in a collective."""


# how gloo and nccl word a peer that is gone (torch raises a plain RuntimeError for gloo's)
_PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote worker",
              "remote process", "connection refused")  # fmt: skip


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> cuda:<local rank> when CUDA is there, else cpu; 'cuda' without CUDA is an error naming the fix."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"train.device={name} but CUDA is not available; use train.device=cpu (or auto)")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    if name != "cpu":
        raise ValueError(f"train.device must be auto, cpu or cuda[:i], got {name!r}")
    return torch.device("cpu")


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> DistContext:
    """Join the process group torchrun set up (if any) and pick this process's device. A collective that waits
    longer than `timeout_s` for another rank fails (see timeouts_explained) instead of hanging."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        timeout = datetime.timedelta(seconds=timeout_s) if timeout_s else None
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", timeout=timeout)
    return DistContext(rank, world, local_rank, dev)


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(value: int, ctx: DistContext) -> int:
    """The largest of every rank's `value` (an int; a flag such as a pending signal's number)."""
    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj, ctx: DistContext) -> list:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    if dist.is_initialized():  # a group of one too (train.strategy=fsdp in one process)
        dist.destroy_process_group()


def resume_command(run_dir: str | os.PathLike) -> str:
    """The command that continues `run_dir`, with the launcher this process runs under: torchrun with the same
    number of processes (another number is refused on resume), or visionpe-train alone."""
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    run_dir = shlex.quote(str(run_dir))
    if world <= 1:
        return f"visionpe-train --resume {run_dir}"
    local = local or world
    where = (
        f"--standalone --nproc_per_node={local}"
        if local == world
        else f"--nnodes={world // local} --nproc_per_node={local} <the rendezvous options it was started with>"
    )
    return f"torchrun {where} {shlex.quote(sys.argv[0] or 'train.py')} --resume {run_dir}"


def _intact(run_dir: Path | None) -> str:
    """What a failed run leaves: its last checkpoint (checkpoint.json), and how to continue."""
    try:
        pointer = json.loads((Path(run_dir) / "checkpoint.json").read_text()) if run_dir else None
    except (OSError, ValueError):
        pointer = None
    if not isinstance(pointer, dict):
        return "no checkpoint was written yet"
    return (
        f"the last checkpoint (step {pointer.get('global_step')}, {Path(run_dir) / 'checkpoint.json'}) is intact; "
        f"continue with: {resume_command(run_dir)}"
    )


@contextlib.contextmanager
def timeouts_explained(ctx: DistContext, timeout_s: float | None, run_dir: Path | None = None):
    """Turn a collective's failure (gloo/nccl RuntimeError) into one line saying what happened and what is intact:
    a timeout is a DistTimeoutError, a peer that died a PeerFailedError."""
    try:
        yield
    except RuntimeError as e:
        text = str(e).lower()
        if not ctx.distributed or isinstance(e, CollectiveError):
            raise
        if "timed out" in text or "timeout" in text:
            raise DistTimeoutError(
                f"rank {ctx.rank}: another process did not respond within train.dist_timeout={timeout_s} s (it "
                f"hung or died; see its output); raise train.dist_timeout if a step or an evaluation really takes "
                f"longer; {_intact(run_dir)}"
            ) from None
        if isinstance(e, dist.DistError) or any(sign in text for sign in _PEER_GONE):
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            first = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0]  # gloo's starts with [file:line]
            raise PeerFailedError(
                f"rank {ctx.rank}: another process of the run died or lost its connection during a collective "
                f"operation ({first}; see its output for why); {_intact(run_dir)}"
            ) from None
        raise
