"""One cache mechanism for PE tables (rotations, cos / sin), invalidated in one place.

An entry is found by the positions tensor it was computed for (held, so its id is never reused) and a key that
holds the identity and version (`_version`) of every tensor it was computed from: an optimizer step, a
`load_state_dict` copy or any in-place write bumps the version and the entry is no longer found. What a version
counter cannot see (FSDP's all-gather into the same storage, `.data` writes while training) is handled by
`invalidate_tables`, which the backbone calls in one place (`ContractModel`): on a train / eval switch that changes
the mode, on `load_state_dict` and when buffers are rebuilt. A switch that changes nothing (eval -> eval) keeps them.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TableCache", "invalidate_tables", "sources_key"]


def sources_key(*tensors: torch.Tensor) -> tuple:
    """What identifies the values of `tensors`: their identity, storage, version, device and dtype."""
    return tuple((id(t), t.data_ptr(), t._version, t.device, t.dtype) for t in tensors)


class TableCache:
    """The tables of the last `size` (positions tensor, key) pairs."""

    def __init__(self, size: int = 32):
        self.size = size
        self._entries: list = []  # [(pos tensor, key, table)]

    def get(self, pos: torch.Tensor, key: tuple):
        for p, k, table in self._entries:
            if p is pos and k == key:
                return table
        return None

    def put(self, pos: torch.Tensor, key: tuple, table) -> None:
        self._entries = [*self._entries, (pos, key, table)][-self.size :]

    def clear(self) -> None:
        self._entries = []

    def __len__(self) -> int:
        return len(self._entries)


def invalidate_tables(model: nn.Module) -> None:
    """Forget every TableCache held by a module of `model`."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, TableCache):
                value.clear()
