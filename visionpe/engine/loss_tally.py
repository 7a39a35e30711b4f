"""The training loss a run logs: its mean over each window of `train.log_every` steps (a metrics line; the windows
end at the epoch's steps log_every, 2 x log_every, ... and at its last step) and over the epoch (the epoch's log
line). A checkpoint keeps the sums the epoch has reached, so a run resumed mid-epoch logs the same windows and the
same epoch mean as one that never stopped."""

from __future__ import annotations

import torch

from .distributed import DistContext, all_reduce_sum, gather_objects

__all__ = ["LossTally"]


class LossTally:
    def __init__(self, device: torch.device):
        self.window = torch.zeros((), device=device)  # this rank's loss summed over the window (no sync per step)
        self.steps = 0  # steps in the window
        self.epoch_sum, self.epoch_steps = 0.0, 0  # the closed windows: mean x steps, and their steps

    def reset(self) -> None:
        """A new epoch: an empty window and no closed ones."""
        self.window.zero_()
        self.steps, self.epoch_sum, self.epoch_steps = 0, 0.0, 0

    def add(self, loss: torch.Tensor) -> None:
        self.window += loss.detach()
        self.steps += 1

    def close(self, ctx: DistContext) -> float:
        """The window's mean over every rank's steps; it joins the epoch's sums and a new window begins."""
        mean = all_reduce_sum(self.window.float().clone(), ctx).item() / (self.steps * ctx.world_size)
        self.epoch_sum, self.epoch_steps = self.epoch_sum + mean * self.steps, self.epoch_steps + self.steps
        self.window.zero_()
        self.steps = 0
        return mean

    def epoch_mean(self) -> float:
        return self.epoch_sum / max(self.epoch_steps, 1)

    def finite(self) -> bool:
        return bool(torch.isfinite(self.window))

    def state(self, ctx: DistContext) -> dict:
        """What a checkpoint keeps. Every rank calls it (each rank's open window is gathered)."""
        windows = gather_objects(float(self.window), ctx)
        return {"windows": windows, "steps": self.steps, "epoch_sum": self.epoch_sum, "epoch_steps": self.epoch_steps}

    def load(self, state: dict | None, ctx: DistContext) -> None:
        """Continue from a checkpoint's tally (None: one written before it was kept; the window and epoch start
        afresh). A checkpoint of another world size shares its ranks' open window out evenly."""
        if not state:
            return
        windows = state["windows"]
        own = windows[ctx.rank] if len(windows) == ctx.world_size else sum(windows) / ctx.world_size
        self.window.fill_(own)
        self.steps, self.epoch_sum, self.epoch_steps = state["steps"], state["epoch_sum"], state["epoch_steps"]
