"""Multi-head self-attention that takes one extra argument: the layer's PosContext (visionpe.attention)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.backends import attend, attend_rows, attend_with_probs, get_attn_backend
from ..attention.inputs import AttnRoute, PosContext
from ..attention.rows import RowBias, RowValue

__all__ = ["Attention", "attention_core", "check_attn_drop"]


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: PosContext | AttnRoute | None,
    scale: float | None = None,
) -> torch.Tensor:
    """q [B, H, N, d], k/v [B, H, M, d] -> [B, H, N, d] with the PE sites qk, logits and values applied and the
    context's mask. An AttnRoute (a batch of several images, visionpe.models.native_batch) runs attention itself."""
    if ctx is None:
        return attend(q, k, v, scale=scale)
    if isinstance(ctx, AttnRoute):
        return ctx.attend(q, k, v, scale)
    if ctx.rotate is not None:
        q, k = ctx.rotate(q, k)
    if ctx.mask is None and _row_terms(ctx) and get_attn_backend() != "math":  # math: the whole-matrix reference
        return attend_rows(q, k, v, ctx.bias, ctx.value, scale)
    bias = ctx.bias(q, k) if ctx.bias is not None else None
    probs = None
    if ctx.needs_probs:
        out, probs = attend_with_probs(q, k, v, bias, scale, mask=ctx.mask)
    else:
        out = attend(q, k, v, bias, scale, mask=ctx.mask)
    if ctx.value is not None:
        out = ctx.value(v, out, probs)
    return out


def _row_terms(ctx: PosContext) -> bool:
    """Whether every logits / value term of ctx can be produced a block of query rows at a time."""
    if ctx.bias is None and ctx.value is None:
        return False
    return (ctx.bias is None or isinstance(ctx.bias, RowBias)) and (
        ctx.value is None or isinstance(ctx.value, RowValue)
    )


QKV_BIAS_MODES = (True, False, "qv")


def check_attn_drop(rate: float) -> None:
    """timm's attn_drop_rate is taken at 0 only: the attention backends here run without dropout on the weights."""
    if rate:
        raise ValueError(
            f"attn_drop_rate={rate}: attention dropout is not supported by the attention backends here (xformers, "
            f"SDPA, flex, math run without it); use drop_path_rate or proj_drop_rate instead"
        )


class Attention(nn.Module):
    """timm-compatible parameter names (qkv, q_norm, k_norm, proj) so ViT/DeiT checkpoints load directly.

    qkv_bias: True, False, or "qv": biases on q and v only (DINOv3, BEiT/EVA); `qkv.bias` keeps its [3 * dim] shape
    and its k third is not used (fixed at zero in the forward, so it gets no gradient)."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool | str = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = nn.LayerNorm,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        if qkv_bias not in QKV_BIAS_MODES:
            raise ValueError(f"qkv_bias must be True, False or 'qv' (no k bias), got {qkv_bias!r}")
        self.qv_bias_only = qkv_bias == "qv"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=bool(qkv_bias))
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        check_attn_drop(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, ctx: PosContext | AttnRoute | None = None) -> torch.Tensor:
        B, N, C = x.shape
        if self.qv_bias_only:
            b = self.qkv.bias
            qkv = F.linear(x, self.qkv.weight, torch.cat([b[:C], torch.zeros_like(b[C : 2 * C]), b[2 * C :]]))
        else:
            qkv = self.qkv(x)
        qkv = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        x = attention_core(q, k, v, ctx, self.scale)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))
