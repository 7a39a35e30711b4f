"""One cache mechanism for PE tables (rotations, cos / sin, bias tables, bucket ids), invalidated in one place.

An entry is found by a key (the options it was computed with) and the tensors it was computed from: `positions`
(by identity; with `by_value`, equal positions in a new tensor also hit) and `sources` (parameters, buffers: by
identity, storage and version). The entry holds those tensors, so their ids are never reused while it lives. An
optimizer step, a `load_state_dict` copy or any in-place write bumps a source's version; a rebuilt buffer or a resized
parameter is a new tensor: the entry is then no longer found. What neither shows (FSDP's all-gather into the same
storage, `.data` writes while training) is handled by `invalidate_tables`, which the backbone calls in one place
(`ContractModel`): on a train / eval switch that changes the mode (caches of `learned` tables only: the others come
from positions and fixed buffers), a new position mode, a new host, `load_state_dict` and rebuilt buffers. A switch
that changes nothing (eval -> eval) keeps every table. Under tracing (torch.compile, FX) nothing is cached: a Python
cache would be guarded on and recompile, so the graph computes the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..fx import is_fx_tracing

__all__ = ["TableCache", "invalidate_tables"]


def _state(t: torch.Tensor) -> tuple:
    return (t._version, t.data_ptr())


def _same_positions(a: torch.Tensor, b: torch.Tensor, by_value: bool) -> bool:
    if a is b:
        return True
    return by_value and a.shape == b.shape and a.device == b.device and a.dtype == b.dtype and torch.equal(a, b)


class TableCache:
    """The tables of the last `size` lookups (least recently used first out). learned: its tables come from trained
    parameters (a train / eval switch forgets them); by_value: positions equal in value to an entry's hit it."""

    def __init__(self, size: int = 32, learned: bool = False, by_value: bool = False):
        self.size, self.learned, self.by_value = size, learned, by_value
        self._entries: list = []  # [(key, positions, sources, their states, table)], most recent last

    def get(self, key, positions: Sequence[torch.Tensor] = (), sources: Sequence[torch.Tensor] = ()):
        for n in range(len(self._entries) - 1, -1, -1):  # the most recent first
            k, pos, src, states, table = self._entries[n]
            if (
                k == key
                and len(pos) == len(positions)
                and len(src) == len(sources)
                and all(s is t for s, t in zip(src, sources))
                and states == tuple(_state(t) for t in sources)
                and all(_same_positions(p, q, self.by_value) for p, q in zip(pos, positions))
            ):
                self._entries.append(self._entries.pop(n))
                return table
        return None

    def put(self, key, table, positions: Sequence[torch.Tensor] = (), sources: Sequence[torch.Tensor] = ()) -> None:
        entry = (key, tuple(positions), tuple(sources), tuple(_state(t) for t in sources), table)
        self._entries = [*self._entries, entry][-self.size :]

    def lookup(self, key, make: Callable, positions: Sequence[torch.Tensor] = (), sources: Sequence[torch.Tensor] = ()):
        """The entry's table, else `make()` computed as a constant (no autograd; outside inference mode, so that it
        serves training too) and kept. While tracing: `make()` alone."""
        if torch.compiler.is_compiling() or is_fx_tracing():
            with torch.no_grad():
                return make()
        table = self.get(key, positions, sources)
        if table is None:
            with torch.inference_mode(False), torch.no_grad():
                table = make()
            self.put(key, table, positions, sources)
        return table

    def clear(self) -> None:
        self._entries = []

    def tables(self) -> list:
        """The kept tables, least recently used first."""
        return [entry[-1] for entry in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __getstate__(self) -> dict:  # copied and pickled empty: the tables are recomputed where they are used
        return {**vars(self), "_entries": []}


def invalidate_tables(model: nn.Module, learned_only: bool = False) -> None:
    """Forget the tables of every TableCache held by a module of `model` (learned_only: of those marked learned)."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, TableCache) and (value.learned or not learned_only):
                value.clear()
