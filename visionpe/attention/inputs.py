"""What an attention layer reads besides q, k and v: one `PosContext` per layer per forward (the PEs' terms and a
batch's mask), or an `AttnRoute` that runs the layer's attention itself (a native batch, per group of images).
Attention declares these types and reads nothing else; the PEs and the backbones build them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .masks import AttnMask

__all__ = ["AttnRoute", "LayerPositions", "PosContext"]


@dataclass
class PosContext:
    """What one attention layer needs from its PEs for one forward.

    rotate: (q, k) -> (q, k), q/k [B, H, N|M, d]                      site "qk"
    bias: (q, k) -> additive logits bias, broadcastable to [B, H, N, M]  site "logits"
    value: (v, out, probs) -> out, v [B, H, M, d], out [B, H, N, d]      site "values"
    needs_probs: a value term needs the attention probabilities (math backend)
    mask: attention only within each image of a batch of several (visionpe.attention); None: every key
    """

    rotate: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    bias: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    value: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None
    needs_probs: bool = False
    mask: AttnMask | None = None


class AttnRoute(ABC):
    """A layer's attention that its owner runs instead of one kernel call: over a batch of several images, each group
    of same-grid images as an ordinary batch with its own PosContext, or the whole batch masked
    (visionpe.models.native_batch)."""

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
        """q [B, H, N, d], k/v [B, H, M, d] -> [B, H, N, d]."""


class LayerPositions(ABC):
    """What every layer of one forward shares, as a block reads it: the block hands over its own positional state
    (`attn.pos`) and gets its layer's context, and runs the PEs' site 'block' after itself (visionpe.pos.base's
    Positions; a native batch's per image group)."""

    @abstractmethod
    def context(self, own) -> PosContext | AttnRoute | None:
        """The context of the layer whose state is `own` (called inside its block's forward)."""

    @abstractmethod
    def block(self, own, x: torch.Tensor, layout=None) -> torch.Tensor:
        """Site 'block' after the layer whose state is `own`; x [B, P + N, C]."""
