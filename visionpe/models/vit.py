"""ViT / DeiT with a swappable positional encoding.

The model turns an image into tokens and a TokenLayout, and hands the layout to its PEs: `pe.tokens` after the
patch embedding, `pe.context(i, layout)` to attention layer i, `pe.block(i, ...)` after block i. Any input size
works at call time; a size that is not a multiple of the patch is zero-padded at the bottom/right.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed, to_2tuple, trunc_normal_
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import Block
from ..layers.checks import check_images, patch_grid
from ..layers.token_merger import AdaptiveTokenMerger
from ..layout import TokenLayout, image_layout
from ..pos.base import AttnSpec, PEHost
from ..pos.presets import build_pos_encoding

__all__ = ["VisionTransformer"]

POSITION_MODES = ("extrapolate", "interpolate")


class VisionTransformer(nn.Module):
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
        qkv_bias: bool = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        class_token: bool = True,
        reg_tokens: int = 0,
        no_embed_class: bool = False,
        fc_norm: bool | None = None,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pe: str = "ape",
        pe_kwargs: dict | None = None,
        position_mode: str = "extrapolate",
        token_merger: int = 0,
        merger_grid: int | tuple[int, int] | None = None,
        norm_layer: type[nn.Module] | None = None,
        act_layer: type[nn.Module] | None = None,
    ):
        """pe: a PE preset name (visionpe.pos.PE_PRESETS); pe_kwargs override its options.
        position_mode: 'extrapolate' (raw patch indices at any size) or 'interpolate' (positions rescaled to the
        reference grid, the counterpart of APE resampling).
        token_merger: m > 0 adds ViTAR's Adaptive Token Merger: patches of patch_size / 2^m are merged down to
        merger_grid (default: the img_size / patch_size grid) at any input size, so the blocks always see that grid."""
        super().__init__()
        if global_pool not in ("", "avg", "token"):
            raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without a CLS token")
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        act_layer = act_layer or nn.GELU
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.in_chans = in_chans
        self.num_prefix_tokens = int(class_token) + reg_tokens
        self.num_reg_tokens = reg_tokens
        self.no_embed_class = no_embed_class
        self.position_mode = position_mode
        self.grad_checkpointing = False

        if token_merger < 0 or patch_size % 2**token_merger:
            raise ValueError(f"token_merger={token_merger}: use m >= 0 with 2^m dividing patch_size ({patch_size})")
        merge = 2**token_merger
        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size // merge,
            in_chans=in_chans,
            embed_dim=embed_dim,
            output_fmt="NHWC",
            strict_img_size=False,
            dynamic_img_pad=True,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        self.merge_factor, self.merger_grid = merge, merger_grid
        self.pe_grid = self._pe_grid()  # the grid the blocks and PEs are built for
        self.token_merger = None
        if token_merger or merger_grid:
            self.token_merger = AdaptiveTokenMerger(
                embed_dim, self.pe_grid, num_heads, mlp_ratio, norm_layer, act_layer, self.patch_embed.grid_size
            )

        host = PEHost(
            dim=embed_dim,
            grid=self.pe_grid,
            num_prefix=self.num_prefix_tokens,
            layers=tuple(AttnSpec(embed_dim, num_heads, embed_dim // num_heads) for _ in range(depth)),
            embed_prefix=not no_embed_class,
        )
        self.pe = build_pos_encoding(pe, host, pe_kwargs)
        self.pe_name = pe

        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads,
                mlp_ratio,
                qkv_bias,
                qk_norm,
                init_values,
                proj_drop_rate,
                dpr[i],
                act_layer=act_layer,
                norm_layer=norm_layer,
            )
            for i in range(depth)
        )
        use_fc_norm = global_pool == "avg" if fc_norm is None else fc_norm
        self.norm = nn.Identity() if use_fc_norm else norm_layer(embed_dim)
        self.fc_norm = norm_layer(embed_dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        r = self.patch_embed.patch_size[0] * merge
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=r) for i in range(depth)]
        self.init_weights()

    def init_weights(self) -> None:
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # ------------------------------------------------------------------------------------------------ positions

    def layout(self, grid: tuple[int, int], device=None) -> TokenLayout:
        """The layout of an H x W patch grid, with positions rescaled to the reference grid in 'interpolate' mode."""
        if self.position_mode not in POSITION_MODES:
            raise ValueError(f"position_mode must be one of {POSITION_MODES}, got {self.position_mode!r}")
        layout = image_layout(grid[0], grid[1], self.num_prefix_tokens, device)
        ref = self.pe_grid
        if self.position_mode == "interpolate" and tuple(grid) != tuple(ref):
            scale = torch.tensor([ref[1] / grid[1], ref[0] / grid[0]], device=layout.pos.device)
            layout = layout.with_pos(layout.pos * scale)
        return layout

    def _pe_grid(self) -> tuple[int, int]:
        if self.merger_grid:
            return to_2tuple(self.merger_grid)
        return tuple(-(-g // self.merge_factor) for g in self.patch_embed.grid_size)

    def set_position_mode(self, mode: str) -> None:
        if mode not in POSITION_MODES:
            raise ValueError(f"position_mode must be one of {POSITION_MODES}, got {mode!r}")
        self.position_mode = mode

    # ---------------------------------------------------------------------------------------------------- forward

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, TokenLayout]:
        """Images [B, C, H, W] -> tokens [B, P + N, C] with the token-site PEs applied, and their layout."""
        check_images(x, self.in_chans, self.patch_embed.patch_size[0])
        x = self.patch_embed(x)  # (B, Hp, Wp, C)
        if self.token_merger is not None:
            x = self.token_merger(x)  # (B, G_h, G_w, C)
        B, Hp, Wp, C = x.shape
        x = x.reshape(B, Hp * Wp, C)
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(B, -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(B, -1, -1))
        if prefix:
            x = torch.cat([*prefix, x], dim=1)
        layout = self.layout((Hp, Wp), x.device)
        return self.pe.tokens(x, layout), layout

    def run_block(self, i: int, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        ctx = self.pe.context(i, layout)
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            x = checkpoint(self.blocks[i], x, ctx, use_reentrant=False)
        else:
            x = self.blocks[i](x, ctx)
        return self.pe.block(i, x, layout)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x, layout = self.embed(x)
        for i in range(len(self.blocks)):
            x = self.run_block(i, x, layout)
        return self.norm(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        if self.global_pool == "token":
            return x[:, 0]
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.fc_norm(self.pool(x)))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Features of the chosen blocks (timm's API): NCHW maps or NLC tokens, optionally with prefix tokens."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, layout = self.embed(x)
        Hp, Wp = layout.hw
        intermediates = []
        last = max_index if stop_early else len(self.blocks) - 1
        for i in range(last + 1):
            x = self.run_block(i, x, layout)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        p = self.num_prefix_tokens
        prefix = [y[:, :p] for y in intermediates]
        intermediates = [y[:, p:] for y in intermediates]
        if output_fmt == "NCHW":
            intermediates = [y.reshape(y.shape[0], Hp, Wp, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if return_prefix_tokens and p:
            intermediates = list(zip(intermediates, prefix))
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head=True):
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take_indices

    # --------------------------------------------------------------------------------------------- timm interface

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "reg_token"} | {f"pe.{n}" for n in self.pe.no_weight_decay()}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^cls_token|^reg_token|^pe|^patch_embed|^token_merger",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("", "avg", "token"):
                raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the reference input size (and patch size): learned tables are resampled to the new grid."""
        if patch_size is not None:
            patch_size = patch_size // self.merge_factor  # the token merger's finer patches
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        self.pe_grid = self._pe_grid()
        if self.token_merger is not None:
            self.token_merger.grid = self.pe_grid
        self.pe.set_grid(self.pe_grid)
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (self.in_chans, *self.patch_embed.img_size)}

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The patch grid an image of this size becomes (padded up to whole patches; the merger grid with ATM)."""
        if self.token_merger is not None:
            return self.pe_grid
        return patch_grid(img_size[0], img_size[1], self.patch_embed.patch_size[0])
