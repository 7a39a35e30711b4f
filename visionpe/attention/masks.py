"""Block-diagonal attention masks for batches of several images (padded or packed rows) and the masked kernels.

An `AttnMask` holds one segment id per token: a query attends to exactly the keys of its own row with the same id
(an image with its prefix tokens; the padding of a row is one more segment, so no query row is fully masked and no
softmax gives NaN). `visionpe.attention.attend(..., mask=)` turns it into what each backend takes: a boolean mask
(SDPA), -inf logits (math), a flex-attention BlockMask (CUDA), or xformers' BlockDiagonalMask when every segment is a
contiguous run of tokens.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["AttnMask", "flex_available", "flex_attend", "xformers_block_attend"]


class AttnMask:
    """ids: long [B, N], the segment of each token (queries and keys are the same tokens)."""

    def __init__(self, ids: torch.Tensor):
        if ids.ndim != 2:
            raise ValueError(f"AttnMask ids must be [B, N], got shape {tuple(ids.shape)}")
        self.ids = ids
        self._dense: torch.Tensor | None = None
        self._block_mask = None
        self._seqlens: list[int] | None | bool = False  # False: not computed yet

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.ids.shape)

    def dense(self) -> torch.Tensor:
        """bool [B, 1, N, N], True where a query may attend to a key (computed once)."""
        if self._dense is None:
            self._dense = (self.ids[:, :, None] == self.ids[:, None, :]).unsqueeze(1)
        return self._dense

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, H, N, N] (or a broadcastable bias) with -inf between segments."""
        return logits.masked_fill(~self.dense(), float("-inf"))

    def seqlens(self) -> list[int] | None:
        """Lengths of the segments in token order over the flattened [B * N] tokens when every segment is one
        contiguous run (xformers' BlockDiagonalMask), else None."""
        if self._seqlens is False:
            ids = self.ids
            change = torch.ones_like(ids, dtype=torch.bool)
            change[:, 1:] = ids[:, 1:] != ids[:, :-1]  # a new run starts (every row starts one)
            runs = int(change.sum())
            segments = int(sum(len(set(r)) for r in ids.tolist()))
            if runs != segments:
                self._seqlens = None
            else:
                starts = change.flatten().nonzero().flatten()
                ends = torch.cat([starts[1:], starts.new_tensor([ids.numel()])])
                self._seqlens = (ends - starts).tolist()
        return self._seqlens

    def block_mask(self):
        """flex attention's BlockMask of this mask (computed once)."""
        if self._block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            ids = self.ids

            def same_segment(b, h, q, k):
                return ids[b, q] == ids[b, k]

            b, n = ids.shape
            self._block_mask = create_block_mask(same_segment, b, None, n, n, device=ids.device)
        return self._block_mask


@functools.lru_cache(maxsize=1)
def flex_available() -> bool:
    """True when this PyTorch has flex attention (torch.nn.attention.flex_attention)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_kernel(device: torch.device):
    """flex_attention, compiled on CUDA (the fused kernel); eager elsewhere (the reference, e.g. for tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled_flex() if device.type == "cuda" else flex_attention


def flex_attend(q, k, v, bias: torch.Tensor | None, scale: float, mask: AttnMask) -> torch.Tensor:
    """Masked attention with flex attention: the BlockMask skips the blocks between images; a bias (broadcastable
    to [B, H, N, N]) is read by a score_mod."""
    score_mod = None
    if bias is not None:
        full = bias.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])

        def score_mod(score, b, h, qi, ki):
            return score + full[b, h, qi, ki]

    kernel = flex_kernel(q.device)
    return kernel(q, k, v, score_mod=score_mod, block_mask=mask.block_mask(), scale=scale)


def xformers_block_attend(q, k, v, scale: float, seqlens: list[int]) -> torch.Tensor:
    """xformers' memory-efficient kernel on the batch flattened to one sequence of segments [1, B * N, H, d]."""
    import xformers.ops as xops
    from xformers.ops import fmha

    b, h, n, d = q.shape
    bias = fmha.BlockDiagonalMask.from_seqlens(seqlens)

    def flat(t):
        return t.transpose(1, 2).reshape(1, b * n, h, t.shape[-1])

    out = xops.memory_efficient_attention(flat(q), flat(k), flat(v), attn_bias=bias, scale=scale)
    return out.reshape(b, n, h, v.shape[-1]).transpose(1, 2)
