"""Pre-norm transformer blocks: `PreNormBlock` owns the residual pair every backbone here shares (timm names norm1,
attn, ls1, norm2, mlp, ls2) and turns the forward's `Positions` into its layer's context with its own positional
state (`attn.pos`, placed by the backbone); `Block` is the DeiT / timm block over tokens."""

from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, Mlp
from torch import nn

from ..attention.inputs import AttnRoute, LayerPositions, PosContext
from .attention_layer import Attention

__all__ = ["Block", "PreNormBlock"]


class PreNormBlock(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)), each branch with optional LayerScale and drop path. A subclass
    builds its attention (the constructor's RNG draws: attention, then MLP), hands on the branch options it does not
    use itself (the defaults live here) and says how it runs (`forward`)."""

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        mlp_ratio: float = 4.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        init_values: float | None = None,
    ):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def context(self, positions: LayerPositions | PosContext | None) -> PosContext | AttnRoute | None:
        """This layer's context: from the forward's Positions and this layer's state, or a PosContext as given."""
        return positions.context(self.attn.pos) if isinstance(positions, LayerPositions) else positions

    def block_site(self, positions: LayerPositions | PosContext | None, x: torch.Tensor, layout=None) -> torch.Tensor:
        """The PE's site 'block' after this block (x [B, P + N, C]; layout: the tokens', default the attention's).
        A view it returns comes back as a copy: FSDP hooks the block's output, and an in-place op on a view would
        lose the hook."""
        y = positions.block(self.attn.pos, x, layout) if isinstance(positions, LayerPositions) else x
        return y.clone() if y is not x and y._base is not None else y

    def add_attn(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x plus the attention branch's output (computed from norm1(x))."""
        return x + self.drop_path1(self.ls1(out))

    def add_mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class Block(PreNormBlock):
    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool | str = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
    ):
        attn = Attention(dim, num_heads, qkv_bias, qk_norm, proj_drop=proj_drop, norm_layer=norm_layer)
        super().__init__(dim, attn, mlp_ratio, proj_drop, drop_path, act_layer, norm_layer, init_values)

    def forward(self, x: torch.Tensor, positions: LayerPositions | PosContext | None = None) -> torch.Tensor:
        x = self.add_mlp(self.add_attn(x, self.attn(self.norm1(x), self.context(positions))))
        return self.block_site(positions, x)
