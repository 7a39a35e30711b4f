"""The parts of a run that a checkpoint holds, by name, each saving and loading its own state.

    parts = TrainingParts(model, optimizer, schedule, scaler, ema, position, tally, cost, rng, train_items)
    state = parts.rank_state(ctx)  # this rank's training state: plain values, weights_only-loadable
    parts.load_rank_state(state, ctx)

The tensors (model, optimizer, EMA) are the checkpoint backend's to store (safetensors or DCP); everything else
travels in one flat dict whose keys are the ones earlier releases wrote (`<tag>.state.pt`, `rank<r>.state.pt`), so
their checkpoints still resume.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .config import Config
from .distributed import DistContext
from .loss_tally import LossTally

__all__ = ["Position", "RunCost", "Schedule", "TrainingParts", "rng_state", "set_rng_state", "written_world_size"]


@dataclass
class Position:
    """Where the run stands in its data: the epoch, the batch within it (0: the epoch has not started), the step."""

    epoch: int = 0
    batch: int = 0
    global_step: int = 0

    @property
    def tag(self) -> str:
        """The name of a checkpoint written here (zero-padded: names sort by position)."""
        return f"e{self.epoch:04d}-b{self.batch:06d}"

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "global_step": self.global_step}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch, self.global_step = state["epoch"], state["batch"], state["global_step"]


class RunCost:
    """Wall and CPU seconds (this process) the run has cost, its earlier attempts up to the checkpoint included."""

    def __init__(self):
        self.started = (time.perf_counter(), time.process_time())
        self.before: tuple[float, float] | None = (0.0, 0.0)  # None: an earlier attempt's cost is unknown

    def spent(self) -> tuple[float, float] | tuple[None, None]:
        if self.before is None:
            return None, None
        wall = self.before[0] + time.perf_counter() - self.started[0]
        cpu = self.before[1] + time.process_time() - self.started[1]
        return round(wall, 3), round(cpu, 3)  # milliseconds: a short run's cost is not rounded to 0

    def state_dict(self) -> dict:
        return {"spent": self.spent()}

    def load_state_dict(self, state: dict) -> None:
        spent = state.get("spent")  # missing: a checkpoint from before the cost was kept
        self.before = tuple(spent) if spent is not None and None not in spent else None


class Schedule:
    """The per-step learning-rate schedule (None: constant) and the settings it was built from: a checkpoint's
    schedule is restored only if they are the same (else the one the config builds now goes on)."""

    def __init__(self, scheduler, cfg: Config, steps_per_epoch: int):
        self.scheduler = scheduler
        self.key = json.dumps([dataclasses.asdict(cfg.optim), cfg.train.epochs, steps_per_epoch])

    def step_update(self, global_step: int) -> None:
        if self.scheduler is not None:
            self.scheduler.step_update(num_updates=global_step)

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict() if self.scheduler else None, "sched_key": self.key}

    def load_state_dict(self, state: dict) -> None:
        if self.scheduler is not None and state.get("scheduler") and state.get("sched_key") == self.key:
            self.scheduler.load_state_dict(state["scheduler"])


def rng_state() -> dict:
    """Every global RNG the training loop draws from (dropout, drop path, mixup), as weights_only-loadable values."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_gauss": random.getstate()[2],
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "numpy_gauss": [int(np_state[3]), float(np_state[4])],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    has_gauss, cached = state["numpy_gauss"]
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def written_world_size(state: dict) -> int:
    """The number of processes that wrote a training state (older ones tell it by their per-rank RNG states)."""
    return state.get("world_size") or len(state.get("rng_ranks") or [None])


@dataclass
class TrainingParts:
    """What a checkpoint saves and a resume restores, by name. `ema` is the EMA's averaged model (None: no EMA)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler
    ema: nn.Module | None
    position: Position
    tally: LossTally
    cost: RunCost
    train_items: int | None  # the training set's length (None: a stream), checked on resume

    def rank_state(self, ctx: DistContext) -> dict:
        """This rank's training state, tensors of the model, optimizer and EMA aside (every rank calls it: the loss
        tally's open windows are gathered)."""
        return {
            **self.cost.state_dict(),
            **self.position.state_dict(),
            "loss_tally": self.tally.state(ctx),
            **self.schedule.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "world_size": ctx.world_size,
            "train_items": self.train_items,
        }

    def load_rank_state(self, state: dict, ctx: DistContext) -> None:
        """Continue from a training state; a plain run's lists every rank's RNG states (`rng_ranks`)."""
        self.schedule.load_state_dict(state)
        self.scaler.load_state_dict(state["scaler"])
        ranks = state.get("rng_ranks")
        set_rng_state(ranks[ctx.rank] if ranks and len(ranks) == ctx.world_size else state["rng"])
        self.position.load_state_dict(state)
        self.tally.load(state.get("loss_tally"), ctx)
        self.cost.load_state_dict(state)
