"""One step of a backbone (attention layer i: the PE's context, block i, the PE's site 'block') as one module call,
so that FSDP2 can gather block i and its PE's parameters of layer i together for exactly that step.

    x = run_layer(model, i, x, lambda x: step(i, x))  # the backbone; a plain call unless the model is sharded

Under `train.strategy=fsdp` the engine gives the model `layer_groups`: one `LayerGroup` per block, held in a plain
list (outside the module tree, so no state_dict key changes), whose children are the modules that own layer i's PE
parameters (`PosEncoding.layer_parameters`); `fully_shard([group, block])` then gathers them with the block when
the step starts and frees them when it ends.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["LayerGroup", "run_layer"]


class LayerGroup(nn.Module):
    """The owners of one layer's PE parameters (shared owners, such as a ParameterList of every layer's tables,
    included: FSDP is told which of their parameters this group holds); `forward(x, step)` is `step(x)`, copied when
    it is a view (e.g. CPE's tokens seen from its grid): FSDP hooks the group's output for the backward, and an
    in-place op on a view of it would lose that hook (a copy keeps the strides, so the numbers do not change)."""

    def __init__(self, owners: list[nn.Module]):
        super().__init__()
        self.owners = nn.ModuleList(owners)

    def forward(self, x: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        y = step(x)
        return y.clone() if y._base is not None else y


def run_layer(model: nn.Module, i: int, x: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor]):
    """step(x), inside layer i's LayerGroup when the model has them (sharded), else directly."""
    groups = model.__dict__.get("layer_groups")
    return step(x) if groups is None else groups[i](x, step)
