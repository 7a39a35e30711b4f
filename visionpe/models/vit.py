"""ViT / DeiT with a swappable positional encoding: the token-encoder trunk with a patch stem.

The model turns an image into tokens and a TokenLayout, and hands the layout to its PEs: `pe.tokens` after the
patch embedding, `pe.context(i, layout)` to attention layer i, `pe.block(i, ...)` after block i. Any input size
works at call time; a size that is not a multiple of the patch is zero-padded at the bottom/right.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed, get_act_layer, get_norm_layer, to_2tuple
from torch import nn

from ..fx import is_fx_tracing
from ..layers.checks import check_images, patch_grid
from ..layers.token_merger import AdaptiveTokenMerger
from ..layout.tokens import TokenLayout, image_layout
from ..position_modes import EXTRAPOLATE, IMAGE_MODES, INTERPOLATE
from .construction import factory_kwargs
from .native_batch import embed_patches
from .token_encoder import TokenEncoder

__all__ = ["VisionTransformer"]


def _check_stem(reg_tokens: int, token_merger: int, patch_size: int) -> None:
    if reg_tokens < 0:
        raise ValueError(f"reg_tokens is a number of register tokens and must be >= 0, got {reg_tokens}")
    if token_merger < 0 or patch_size % 2**token_merger:
        raise ValueError(f"token_merger={token_merger}: use m >= 0 with 2^m dividing patch_size ({patch_size})")


class VisionTransformer(TokenEncoder):
    position_modes = IMAGE_MODES

    @factory_kwargs
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        class_token: bool = True,
        reg_tokens: int = 0,
        no_embed_class: bool = False,
        pe: str = "ape",
        pe_kwargs: dict | None = None,
        position_mode: str = EXTRAPOLATE,
        token_merger: int = 0,
        merger_grid: int | tuple[int, int] | None = None,
        pre_norm: bool = False,
        norm_layer: str | type[nn.Module] | None = None,
        act_layer: str | type[nn.Module] | None = None,
        **kwargs,
    ):
        """pe: a PE preset name (visionpe.pos.PE_PRESETS); pe_kwargs override its options.
        position_mode: 'extrapolate' (raw patch indices at any size), 'interpolate' (positions rescaled to the
        reference grid, the counterpart of APE resampling), or 'ntk' / 'yarn' (raw indices; rotary PEs rescale
        their frequencies by the size ratio, visionpe.pos.rope_scaling; other PEs read them as 'extrapolate').
        token_merger: m > 0 adds ViTAR's Adaptive Token Merger: patches of patch_size / 2^m are merged down to
        merger_grid (default: the img_size / patch_size grid) at any input size, so the blocks always see that grid.
        pre_norm: a norm before the blocks and a patch embedding without bias (CLIP's layout, as timm builds it).
        Other kwargs (qkv_bias, fc_norm, drop rates, ...): see TokenEncoder."""
        _check_stem(reg_tokens, token_merger, patch_size)
        merge = 2**token_merger
        norm_layer, act_layer = get_norm_layer(norm_layer), get_act_layer(act_layer)  # timm's names too: 'gelu'
        # the stem is built before the trunk so that parameters draw from the RNG in the stem -> PE -> blocks order
        patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size // merge,
            in_chans=in_chans,
            embed_dim=embed_dim,
            output_fmt="NHWC",
            strict_img_size=False,
            dynamic_img_pad=True,
            bias=not pre_norm,
        )
        pe_grid = _pe_grid(patch_embed, merge, merger_grid)  # the grid the blocks and PEs are built for
        merger = None
        if token_merger or merger_grid:
            norm = norm_layer or partial(nn.LayerNorm, eps=1e-6)
            merger = AdaptiveTokenMerger(embed_dim, pe_grid, num_heads, mlp_ratio, norm, act_layer or nn.GELU,
                                         patch_embed.grid_size)  # fmt: skip
        super().__init__(
            grid=pe_grid,
            num_classes=num_classes,
            global_pool=global_pool,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            class_token=class_token,
            reg_tokens=reg_tokens,
            embed_prefix=not no_embed_class,
            pe=pe,
            pe_kwargs=pe_kwargs,
            position_mode=position_mode,
            pre_norm=pre_norm,
            norm_layer=norm_layer,
            act_layer=act_layer,
            **kwargs,
        )
        self.patch_embed = patch_embed
        self.token_merger = merger
        self.in_chans = in_chans
        self.no_embed_class = no_embed_class
        self.merge_factor, self.merger_grid = merge, merger_grid
        self.feature_info = self.block_features(self.patch_embed.patch_size[0] * merge)
        self._init_layers()

    @property
    def pe_grid(self) -> tuple[int, int]:
        """The reference grid the blocks and PEs are built for."""
        return self._pe_ref["grid"]

    # ------------------------------------------------------------------------------------------------ positions

    def layout(self, grid: tuple[int, int], device=None) -> TokenLayout:
        """The layout of an H x W patch grid, with positions rescaled to the reference grid in 'interpolate' mode."""
        layout = image_layout(grid[0], grid[1], self.num_prefix_tokens, device)
        ref = self.pe_grid
        if self.position_mode == INTERPOLATE and tuple(grid) != tuple(ref):
            scale = torch.tensor([ref[1] / grid[1], ref[0] / grid[0]], device=layout.pos.device)
            layout = layout.with_pos(layout.pos * scale)
        return layout

    # ---------------------------------------------------------------------------------------------------- forward

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, TokenLayout]:
        """Images [B, C, H, W] -> tokens [B, P + N, C] (before the token-site PEs) and their layout."""
        check_images(x, self.in_chans, self.patch_embed.patch_size[0])
        x = self.patch_embed(x)  # (B, Hp, Wp, C)
        if self.token_merger is not None:
            x = self.token_merger(x)  # (B, G_h, G_w, C)
        B, Hp, Wp, C = x.shape
        device = x.device
        if is_fx_tracing():  # FX: the reference grid, its layout a constant of the graph (visionpe.fx)
            (Hp, Wp), device = self.pe_grid, next(self.parameters()).device
        return self.add_prefix(x.reshape(B, Hp * Wp, C)), self.layout((Hp, Wp), device)

    def embed_native(self, x: dict):
        """A native batch (a NaFlex dict, visionpe.layout) -> tokens [B, L, C] and their BatchLayout."""
        return embed_patches(self, x)

    # --------------------------------------------------------------------------------------------- timm interface

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the reference input size (and patch size): learned tables are resampled to the new grid."""
        if patch_size is not None:
            patch_size = patch_size // self.merge_factor  # the token merger's finer patches
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        grid = _pe_grid(self.patch_embed, self.merge_factor, self.merger_grid)
        if self.token_merger is not None:
            self.token_merger.grid = grid
        self.set_reference(grid)
        if patch_size is not None:
            self.feature_info = self.block_features(self.patch_embed.patch_size[0] * self.merge_factor)
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (self.in_chans, *self.patch_embed.img_size)}

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid an image of this size becomes (padded up to whole patches; the merger grid with ATM)."""
        if self.token_merger is not None:
            return self.pe_grid
        return patch_grid(img_size[0], img_size[1], self.patch_embed.patch_size[0])


def _pe_grid(patch_embed: PatchEmbed, merge: int, merger_grid) -> tuple[int, int]:
    if merger_grid:
        return to_2tuple(merger_grid)
    return tuple(-(-g // merge) for g in patch_embed.grid_size)
