"""FIRE in 2D: visionpe's own extension of FIRE (Li et al., ICLR 2024, arXiv:2310.04418) to image grids. FIRE has no
official 2D form; this one is defined and tested here (docs/pes.md).

For query i and key j with positions p (patch units): bias_h(i, j) = MLP(psi(d_ij) / psi(max(L, D)))_h, where
- d_ij = ||p_j - p_i||_2, the Euclidean distance (symmetric: FIRE's listing also takes |i - j|);
- D is the diagonal of the box spanned by the query and key positions of the attention (the largest distance a
  query can have to a key on a grid): FIRE's "progressive interpolation" normaliser, so the MLP's input stays in
  [0, 1] at any grid size; the 1D query index i has no 2D analogue, and a grid-wide D keeps the bias a function of
  the offset alone;
- psi(x) = log(|c| x + 1), c learnable (init 0.1);
- L = |L_multiplier| * init_L, L_multiplier learnable (init 1) and init_L the diagonal of the reference grid (the
  attention window for Swin), kept as a buffer so a checkpoint keeps its threshold; grids smaller than L are not
  stretched;
- MLP: Linear(1, 32) -> ReLU -> Linear(32, H), torch's default init, one bias per head; eps = 1e-6 guards the
  division.
As FIRE shares its encoding across layers, one set of parameters serves every layer of a stage (all layers of a
ViT; a stage of Swin / CvT, whose head count and grid change per stage). Prefix tokens get no bias.
State dict (per stage s): `stages.{s}.mlp.{0,2}.{weight,bias}`, `stages.{s}.c`, `stages.{s}.L_multiplier`,
`stages.{s}.init_L`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .offset_bias import OffsetBiasPE

__all__ = ["FIRE2D"]

EPS = 1e-6


def _diagonal(grid: tuple[int, int]) -> float:
    return math.hypot(grid[0] - 1, grid[1] - 1)


class _FIREStage(nn.Module):
    """The parameters of one stage: MLP, c, L_multiplier and the reference threshold init_L."""

    def __init__(self, heads: int, hidden: int, init_l: float):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, heads))
        self.c = nn.Parameter(torch.empty(1))  # [1], not a scalar: FSDP2 shards only tensors with a dim
        self.L_multiplier = nn.Parameter(torch.empty(1))
        self.register_buffer("init_L", torch.full((), float(init_l)))
        self.ref_L = float(init_l)
        self.reset()

    def reset(self) -> None:
        if self.c.is_meta:
            return
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                m.reset_parameters()
        with torch.no_grad():
            self.c.fill_(0.1)
            self.L_multiplier.fill_(1.0)
            self.init_L.fill_(self.ref_L)

    def bias(self, d: torch.Tensor, diameter: torch.Tensor) -> torch.Tensor:
        """d [...] distances, diameter [] -> [H, ...]."""
        c = self.c.abs()[0]
        threshold = (self.L_multiplier[0] * self.init_L).abs()
        norm = torch.log(c * torch.maximum(threshold, diameter) + 1) + EPS
        x = torch.log(c * d + 1) / norm
        return self.mlp(x[..., None]).movedim(-1, 0)


class FIRE2D(OffsetBiasPE):
    """2D FIRE (see the module docstring): a small MLP of a progressively normalised log distance per head."""

    learned = True

    def __init__(self, host, hidden: int = 32):
        super().__init__(host)
        starts = tuple(host.stage_starts)
        stages = []
        for s, first in enumerate(starts):
            last = starts[s + 1] if s + 1 < len(starts) else host.depth
            heads = {host.layers[i].num_heads for i in range(first, last)}
            if len(heads) != 1:
                raise ValueError(f"FIRE2D shares one MLP per stage, but stage {s} has head counts {sorted(heads)}")
            grid = host.layers[first].grid or host.grid
            stages.append(_FIREStage(heads.pop(), int(hidden), _diagonal(grid)))
        self.stages = nn.ModuleList(stages)
        self._layer_stage = tuple(sum(i >= first for first in starts) - 1 for i in range(host.depth))

    def init_weights(self):
        for stage in self.stages:
            stage.reset()

    def set_host(self, host, layers=()):
        """A pruned staged backbone (fewer stages): the MLPs of the stages that went go with them."""
        super().set_host(host, layers)
        if len(host.stage_starts) < len(self.stages):
            self.stages = self.stages[: len(host.stage_starts)]

    def stage_of(self, i: int) -> int:
        return self._layer_stage[i]

    def constant(self):
        return not self.training

    def table_key(self, i):
        return self.stage_of(i)

    def table_sources(self, i):
        stage = self.stages[self.stage_of(i)]
        return (*stage.parameters(), *stage.buffers())  # a trained, loaded or resized MLP is another table

    def offset_fn(self, i, q, kv):
        stage = self.stages[self.stage_of(i)]
        # the diagonal of the box spanned by the queries and keys: the largest offset per axis
        lo, hi = (
            torch.minimum(q.pos.min(0).values, kv.pos.min(0).values),
            torch.maximum(q.pos.max(0).values, kv.pos.max(0).values),
        )
        diameter = (hi - lo).double().square().sum().sqrt()

        def fn(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            dtype = stage.c.dtype
            d = (u * u + v * v).sqrt().to(dtype)
            return stage.bias(d, diameter.to(device=d.device, dtype=dtype))

        return fn
