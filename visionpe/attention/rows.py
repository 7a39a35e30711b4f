"""Position terms attention takes a block of query rows at a time (`visionpe.attention.attend_rows`): the attention
never holds a whole [B, H, N, M] bias, and the bias-only case still runs on the fused backends. Attention declares
these types; a PE (e.g. iRPE's bucketed terms) implements them."""

from __future__ import annotations

import torch

__all__ = ["RowBias", "RowValue"]


class RowBias:
    """An additive logits bias that can be produced for a block of query rows. `prepare(q, k)` does the work shared
    by every block (once per call); `rows(state, start, stop)` returns the bias of query rows [start, stop),
    broadcastable to [B, H, stop - start, M]. Calling it gives the whole bias (the reference path)."""

    def prepare(self, q: torch.Tensor, k: torch.Tensor) -> object:
        return q, k

    def rows(self, state: object, start: int, stop: int) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.rows(self.prepare(q, k), 0, q.shape[-2])


class RowValue:
    """A value term that reads the attention probabilities of a block of query rows: `rows(probs, start, stop)`
    with probs [B, H, stop - start, M] returns what to add to those rows' output. Calling it adds the whole term."""

    def rows(self, probs: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, v: torch.Tensor, out: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
        if probs is None:
            raise RuntimeError("this value term needs the attention probabilities (PosContext.needs_probs)")
        return out + self.rows(probs, 0, probs.shape[-2])
