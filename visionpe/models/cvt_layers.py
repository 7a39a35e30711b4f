"""CvT's building blocks: convolutional token embedding, convolutional projections and the attention over them.

The attention takes one extra argument, the layer's PosContext; q is on the full grid, k/v on the stride-2 grid.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from ..layers import PreNormBlock, attention_core
from ..layers.patch_resize import resized_conv
from ..pos.base import PosContext

__all__ = ["ConvAttention", "ConvEmbed", "CvtBlock", "CvtStage", "conv_out_size", "conv_projection"]


def conv_out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a convolution (floor mode)."""
    return (size + 2 * padding - kernel) // stride + 1


class ConvEmbed(nn.Module):
    """Stage token embedding: strided conv, then LayerNorm over channels (official names `proj`, `norm`)."""

    def __init__(self, in_chans: int, dim: int, kernel: int, stride: int, padding: int, norm_layer):
        super().__init__()
        self.kernel, self.stride, self.padding = kernel, stride, padding
        self.proj = nn.Conv2d(in_chans, dim, kernel, stride, padding)
        self.norm = norm_layer(dim)

    def out_size(self, hw: tuple[int, int]) -> tuple[int, int]:
        return tuple(conv_out_size(s, self.kernel, self.stride, self.padding) for s in hw)

    def set_stride(self, stride: int) -> None:
        """FlexiViT for an overlapping conv: a token every `stride` px, the kernel and padding scaled by the same
        r = stride / self.stride (each window of an image resized by r is the resized window), the kernel PI-resized
        (visionpe.layers.patch_resize). r must leave a whole kernel and padding."""
        k, s, p = self.kernel, self.stride, self.padding
        if (k * stride) % s or (p * stride) % s:
            step = math.lcm(s // math.gcd(s, k), s // math.gcd(s, p))
            raise ValueError(
                f"patch_size={stride}: CvT's first embedding (kernel {k}, stride {s}, padding {p}) scaled by "
                f"{stride}/{s} leaves a kernel of {k * stride / s:g} px and padding of {p * stride / s:g} px; use a "
                f"multiple of {step} (e.g. {', '.join(str(step * i) for i in (1, 2, 3))})"
            )
        kernel, padding = k * stride // s, p * stride // s
        self.proj = resized_conv(self.proj, kernel, stride, padding)
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))  # [B, C_in, H, W] -> [B, H', W', C]


def conv_projection(dim: int, kernel: int, stride: int, padding: int) -> nn.Sequential:
    """Depthwise conv (no bias) + BatchNorm: CvT's "dw_bn" projection (official names `conv`, `bn`)."""
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(dim, dim, kernel, stride, padding, groups=dim, bias=False),
            bn=nn.BatchNorm2d(dim),
        )
    )


class ConvAttention(nn.Module):
    """Multi-head attention over convolutional projections; q on the full grid, k/v on the stride-`stride_kv` grid."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        kernel_size: int = 3,
        stride_kv: int = 2,
        padding_q: int = 1,
        padding_kv: int = 1,
        proj_drop: float = 0.0,
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        if kernel_size != 2 * padding_q + 1:
            raise ValueError(
                f"the query projection must keep the grid: kernel {kernel_size} needs padding_q "
                f"{(kernel_size - 1) // 2}, got {padding_q}"
            )
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = dim**-0.5  # official quirk: full width, not head_dim (kept for weight compatibility)
        self.kernel_size, self.stride_kv, self.padding_kv = kernel_size, stride_kv, padding_kv
        self.conv_proj_q = conv_projection(dim, kernel_size, 1, padding_q)
        self.conv_proj_k = conv_projection(dim, kernel_size, stride_kv, padding_kv)
        self.conv_proj_v = conv_projection(dim, kernel_size, stride_kv, padding_kv)
        self.proj_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_k = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def kv_grid(self, hw: tuple[int, int]) -> tuple[int, int]:
        """The key/value grid of an H x W query grid."""
        return tuple(conv_out_size(s, self.kernel_size, self.stride_kv, self.padding_kv) for s in hw)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        return x.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)  # (B, heads, N, d)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], num_prefix: int, ctx: PosContext | None = None):
        """x [B, P + H*W, C] -> [B, P + H*W, C]; the P prefix tokens skip the convolutions."""
        B, _, C = x.shape
        prefix, x = x[:, :num_prefix], x[:, num_prefix:]
        grid = x.transpose(1, 2).reshape(B, C, hw[0], hw[1])
        q, k, v = (
            proj(grid).flatten(2).transpose(1, 2) for proj in (self.conv_proj_q, self.conv_proj_k, self.conv_proj_v)
        )
        if num_prefix:
            q, k, v = (torch.cat([prefix, t], dim=1) for t in (q, k, v))
        q, k, v = self._heads(self.proj_q(q)), self._heads(self.proj_k(k)), self._heads(self.proj_v(v))
        out = attention_core(q, k, v, ctx, self.scale)  # (B, heads, P + H*W, d)
        out = out.transpose(1, 2).reshape(B, out.shape[2], C)  # the token count spelled out: B may be 0
        return self.proj_drop(self.proj(out))


class CvtBlock(PreNormBlock):
    """Pre-norm block around ConvAttention (official names norm1, attn, norm2, mlp). attn_kwargs: ConvAttention's
    options (qkv_bias, kernel_size, stride_kv, padding_q, padding_kv); branch: PreNormBlock's (mlp_ratio,
    drop_path, act_layer, norm_layer)."""

    def __init__(self, dim: int, num_heads: int, proj_drop: float = 0.0, attn_kwargs: dict | None = None, **branch):
        attn = ConvAttention(dim, num_heads, proj_drop=proj_drop, **(attn_kwargs or {}))
        super().__init__(dim, attn, proj_drop=proj_drop, **branch)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], num_prefix: int, positions=None):
        """positions: the forward's Positions (or a PosContext as given)."""
        x = self.add_mlp(self.add_attn(x, self.attn(self.norm1(x), hw, num_prefix, self.context(positions))))
        return self.block_site(positions, x)


class CvtStage(nn.Module):
    """Conv token embedding, optional CLS token, blocks. The model runs the blocks (it owns the PE)."""

    def __init__(self, in_chans: int, dim: int, depth: int, embed: dict, cls_token: bool, norm_layer, **block_kwargs):
        super().__init__()
        self.patch_embed = ConvEmbed(in_chans, dim, norm_layer=norm_layer, **embed)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cls_token else None
        dpr = block_kwargs.pop("drop_path")
        self.blocks = nn.ModuleList(
            CvtBlock(dim, drop_path=dpr[j], norm_layer=norm_layer, **block_kwargs) for j in range(depth)
        )

    @property
    def num_prefix(self) -> int:
        return 0 if self.cls_token is None else 1
