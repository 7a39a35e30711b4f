"""A single-stream transformer over tokens with a layout: the one trunk of the ViT, the video ViT and the multimodal
encoder.

A subclass owns the stem (`embed(...) -> tokens, layout`, tokens before the token-site PEs) and tells the trunk its
reference grid; this class owns the prefix tokens (CLS, registers), the PEs (built from a preset for a PEHost), the
blocks, the norms and the head, and the timm model interface. The layout's position scheme is the one the PE
declares (`pe.layout_scheme`, e.g. a RoPE-ND scheme), else the trunk's `default_scheme`.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import AttentionPoolLatent, get_act_layer, get_norm_layer
from timm.models._features import feature_take_indices
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import Block
from ..layers.attention_layer import check_attn_drop
from ..layout.batch import BatchLayout, is_native_batch
from ..layout.tokens import TokenLayout
from ..pos.base import AttnSpec, PEHost, PosEncoding, Positions
from ..pos.mm_schemes import segment_layout
from ..pos.presets import build_pos_encoding
from ..position_modes import EXTRAPOLATE, check_position_mode
from .construction import (
    ContractModel,
    UnsupportedPool,
    init_linears,
    layer_pos_no_weight_decay,
    place_layer_pos,
    place_like,
)
from .native_batch import NativePositions, NativeSites, masked_tokens, pool_images, pool_tokens
from .param_groups import exact_no_weight_decay

__all__ = ["TokenEncoder"]

POOLS = ("", "avg", "avgmax", "max", "token", "map")  # timm's ViT pools ('map': attention pooling, timm's layer)


class TokenEncoder(ContractModel):
    intermediate_formats: tuple[str, ...] = ("NCHW", "NLC")  # forward_intermediates' formats, the default first
    position_modes: tuple[str, ...] = (EXTRAPOLATE,)  # the test-time position modes it takes (visionpe.position_modes)

    def __init__(
        self,
        grid: tuple[int, int],
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool | str = True,
        qk_norm: bool = False,
        init_values: float | None = None,
        class_token: bool = True,
        reg_tokens: int = 0,
        embed_prefix: bool = False,
        fc_norm: bool | None = None,
        pool_include_prefix: bool = False,
        pre_norm: bool = False,
        final_norm: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        patch_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pe: str = "rope3d",
        pe_kwargs: dict | None = None,
        default_scheme: str = "rope3d",
        frames: int = 1,
        position_mode: str = EXTRAPOLATE,
        norm_layer: str | type[nn.Module] | None = None,
        act_layer: str | type[nn.Module] | None = None,
        norm_eps: float = 1e-6,
    ):
        """grid: the reference (H, W) patch grid the PEs are built for (frames: its token frames T);
        default_scheme: the position scheme of the layout when no PE declares one (e.g. for a learned APE);
        embed_prefix: a learned APE has entries for the prefix tokens too; fc_norm: norm after pooling instead of
        before (default: with a pool over the patches); pool_include_prefix: the avg / max / map pools read the
        prefix tokens too (timm's option); pre_norm / final_norm, pos_drop_rate: timm's norm before the
        blocks / after them, dropout after the token-site PEs; qkv_bias: True, False or "qv" (no k bias, as DINOv3);
        norm_layer / act_layer: classes or timm's names ('layernorm', 'gelu', ...); norm_eps: the LayerNorm epsilon
        when norm_layer is not given (1e-6; DINOv3 uses 1e-5); position_mode: one of the family's `position_modes`
        (changed later with `set_position_mode`). attn_drop_rate and patch_drop_rate are timm's names, taken at 0."""
        super().__init__()
        _check_pool(global_pool, class_token)
        _check_rates(attn_drop_rate, patch_drop_rate)
        norm_layer = get_norm_layer(norm_layer) or partial(nn.LayerNorm, eps=norm_eps)
        act_layer = get_act_layer(act_layer) or nn.GELU
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.pool_include_prefix = pool_include_prefix
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = int(class_token) + reg_tokens
        self.num_reg_tokens = reg_tokens
        self.default_scheme = default_scheme
        self.grad_checkpointing = False
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None

        self._pe_ref = dict(grid=tuple(grid), frames=int(frames), heads=num_heads, embed_prefix=embed_prefix)
        self.pe = build_pos_encoding(pe, self._host(depth), pe_kwargs)
        self.forget_pe_tables()  # the tables its build probe cached (small grids no forward uses)
        self.set_position_mode(position_mode)
        self.pe_name = pe
        self.pos_drop = nn.Dropout(pos_drop_rate) if pos_drop_rate else nn.Identity()  # no call per step at 0
        self.norm_pre = norm_layer(embed_dim) if pre_norm else nn.Identity()

        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # linear (no tensor: meta-safe)
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias, qk_norm, init_values, proj_drop_rate, dpr[i],
                  act_layer=act_layer, norm_layer=norm_layer) for i in range(depth)
        )  # fmt: skip
        place_layer_pos(self.pe, self.blocks)
        use_fc_norm = global_pool in ("avg", "avgmax", "max") if fc_norm is None else fc_norm
        self.norm = norm_layer(embed_dim) if final_norm and not use_fc_norm else nn.Identity()
        self._build_head(num_classes, use_fc_norm and final_norm, drop_rate, norm_layer, act_layer, mlp_ratio)

    def _build_head(self, num_classes: int, fc_norm: bool, drop_rate: float, norm_layer, act_layer, mlp_ratio) -> None:
        """What follows the blocks' final norm, as timm's ViT builds it: the attention pool of global_pool='map'
        (AttentionPoolLatent), the norm after the pool (fc_norm), dropout and the classifier."""
        dim, heads = self.embed_dim, self._pe_ref["heads"]
        self.attn_pool = None
        if self.global_pool == "map":
            self.attn_pool = AttentionPoolLatent(
                dim, num_heads=heads, mlp_ratio=mlp_ratio, norm_layer=norm_layer, act_layer=act_layer
            )
        self.fc_norm = norm_layer(dim) if fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()

    def _init_layers(self) -> None:
        """The constructor's init (the draws a seeded model has always made)."""
        for p in (self.cls_token, self.reg_token):
            if p is not None:
                nn.init.normal_(p, std=1e-6)
        init_linears(self.blocks)
        init_linears(self.head)
        if self.attn_pool is not None:
            self.attn_pool.init_weights()
        self.pe.init_weights()

    # ------------------------------------------------------------------------------------------------ positions

    def _host(self, depth: int | None = None) -> PEHost:
        """What the PEs see: the reference grid and frames, the prefix tokens and one AttnSpec per block."""
        ref, dim = self._pe_ref, self.embed_dim
        depth = len(self.blocks) if depth is None else depth
        return PEHost(
            dim=dim,
            grid=ref["grid"],
            num_prefix=self.num_prefix_tokens,
            layers=tuple(AttnSpec(dim, ref["heads"], dim // ref["heads"]) for _ in range(depth)),
            embed_prefix=ref["embed_prefix"],
            frames=ref["frames"],
        )

    @property
    def position_mode(self) -> str:
        """The test-time position mode (visionpe.position_modes), set with `set_position_mode`."""
        return self.pe.position_mode

    @position_mode.setter
    def position_mode(self, mode: str) -> None:  # `model.position_mode = mode` (the benchmark's) is the same setter
        self.set_position_mode(mode)

    def set_position_mode(self, mode: str) -> None:
        """Another of the family's `position_modes`: every PE of the model reads it (as `training`), and the tables
        cached under the old one are forgotten."""
        mode = check_position_mode(mode, self.position_modes)
        if mode != self.pe.position_mode:
            for module in self.pe.modules():
                if isinstance(module, PosEncoding):
                    module.position_mode = mode
            self.forget_pe_tables()

    def set_reference(self, grid: tuple[int, int], frames: int | None = None) -> None:
        """A new reference grid (timm's set_input_size): the PEs adapt their tables through `set_host`."""
        self._pe_ref["grid"] = tuple(grid)
        if frames is not None:
            self._pe_ref["frames"] = int(frames)
        self._set_host()

    def _set_host(self) -> None:
        self.set_pe_host(self._host(), tuple(block.attn.pos for block in self.blocks))

    @property
    def pos_scheme(self) -> str:
        """The position scheme of this model's layouts: the PE's, else the trunk's default."""
        return self.pe.layout_scheme or self.default_scheme

    def scheme_layout(self, segments, device=None) -> TokenLayout:
        """Layout of a segment spec under the model's position scheme, with the PE's per-forward options."""
        opts = self.pe.layout_options(self.training)
        return segment_layout(segments, self.pos_scheme, self.num_prefix_tokens, device, **opts)

    # ---------------------------------------------------------------------------------------------------- trunk

    def add_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, C] -> [B, P + N, C] with the CLS and register tokens in front."""
        prefix = [p.expand(x.shape[0], -1, -1) for p in (self.cls_token, self.reg_token) if p is not None]
        return torch.cat([*prefix, x], dim=1) if prefix else x

    def sites(self, layout: TokenLayout | BatchLayout):
        """What runs the PE sites for a layout: the PE itself, or per image for a batch of several (native)."""
        return NativeSites(self.pe) if isinstance(layout, BatchLayout) else self.pe

    def positions(self, layout: TokenLayout | BatchLayout) -> Positions:
        """What the blocks of one forward share (each turns it into its layer's context and site 'block')."""
        return NativePositions(self.pe, layout) if isinstance(layout, BatchLayout) else Positions(self.pe, layout)

    def run_block(self, i: int, x: torch.Tensor, positions: Positions) -> torch.Tensor:
        """Block i with its PE context and site 'block' (computed inside the block, from its own state)."""
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(self.blocks[i], x, positions, use_reentrant=False)
        return self.blocks[i](x, positions)

    def run_blocks(self, x: torch.Tensor, layout: TokenLayout | BatchLayout) -> torch.Tensor:
        """Token-site PEs, every block, the final norm: [B, P + N, C] -> [B, P + N, C]."""
        x = self.enter_blocks(x, layout)
        positions = self.positions(layout)
        for i in range(len(self.blocks)):
            x = self.run_block(i, x, positions)
        return self.norm(x)

    def enter_blocks(self, x: torch.Tensor, layout: TokenLayout | BatchLayout) -> torch.Tensor:
        """What the first block sees: the token-site PEs, then timm's position dropout and pre-norm."""
        return self.norm_pre(self.pos_drop(self.sites(layout).tokens(x, layout)))

    def pool(self, x: torch.Tensor, num_prefix: int | None = None) -> torch.Tensor:
        """[B, P + N, C] -> [B, C] by the global pool ('' keeps every token); the P = num_prefix (default the
        model's) prefix tokens join an avg / max / map pool only with pool_include_prefix, as in timm."""
        skip = 0 if self.pool_include_prefix else self.num_prefix_tokens if num_prefix is None else num_prefix
        if self.attn_pool is not None:
            return self.attn_pool(x[:, skip:])
        return pool_tokens(x, self.global_pool, skip)

    def native_features(self, x: torch.Tensor, layout: BatchLayout) -> dict:
        """forward_features of a native batch (visionpe.layout): tokens [B, L, C] after the final norm, which tokens
        are an image's (patch_valid [B, L]) and the BatchLayout, for forward_head."""
        return dict(patches=self.run_blocks(x, layout), patch_valid=layout.valid, layout=layout)

    def forward_head(self, x: torch.Tensor | dict, pre_logits: bool = False) -> torch.Tensor:
        """Pooled features -> logits; a native batch's features (a dict) give one row per image."""
        if isinstance(x, dict):
            x = pool_images(x["patches"], x["layout"], self.pool) if self.global_pool else x["patches"]
        else:
            x = self.pool(x)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def block_features(self, reduction: int) -> list[dict]:
        """timm's feature_info: every block's tokens, `reduction` pixels a token."""
        dim = self.embed_dim
        return [dict(module=f"blocks.{i}", num_chs=dim, reduction=reduction) for i in range(len(self.blocks))]

    def embed_native(self, x: dict) -> tuple[torch.Tensor, BatchLayout]:
        """A native batch (visionpe.layout) -> tokens [B, L, C] and their BatchLayout (models with a native stem)."""
        raise TypeError(f"{type(self).__name__} takes no native batch")

    def forward_features(self, x: torch.Tensor | dict) -> torch.Tensor | dict:
        """Input -> tokens [B, P + N, C] (see `embed`); a native batch (visionpe.layout) -> a dict of every item's
        tokens, for forward_head."""
        if is_native_batch(x):
            return self.native_features(*self.embed_native(x))
        return self.run_blocks(*self.embed(x))

    def forward(self, x: torch.Tensor | dict) -> torch.Tensor:
        """Logits [B, classes]; for a native batch one row per item (row order, then item order)."""
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor | dict,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str | None = None,
        intermediates_only: bool = False,
        output_dict: bool = False,
    ):
        """Features of the chosen blocks (timm's API) in one of `intermediate_formats` (default the first): maps
        (NCTHW, or NCHW for one frame) or NLC tokens, optionally with prefix tokens; output_dict: timm's dict form
        (`image_intermediates`, `image_intermediates_prefix`, `image_features`)."""
        output_fmt = self.intermediate_format(output_fmt)
        x, layout = self.embed_native(x) if is_native_batch(x) else self.embed(x)
        return self.intermediates(
            x, layout, indices, return_prefix_tokens, norm, stop_early, output_fmt, intermediates_only,
            output_dict=output_dict,
        )  # fmt: skip

    def intermediates(
        self,
        x: torch.Tensor,
        layout: TokenLayout,
        indices: int | list[int] | None,
        return_prefix_tokens: bool,
        norm: bool,
        stop_early: bool,
        output_fmt: str,
        intermediates_only: bool,
        visual: tuple[int, tuple[int, int, int]] | None = None,
        output_dict: bool = False,
    ):
        """timm's forward_intermediates over embedded tokens, optionally with the prefix tokens. output_fmt 'NLC':
        all non-prefix tokens; 'NCTHW' / 'NCHW': the visual tokens as maps [B, C, T, H, W] / [B, C, H, W] (T = 1).
        visual: (offset among the non-prefix tokens, (T, H, W)) of the visual tokens; default the layout's grid.
        A native batch (BatchLayout): 'NLC' only, the padding (and unused prefix slots) zero."""
        native = isinstance(layout, BatchLayout)
        if native and output_fmt != "NLC":
            raise ValueError(f"a native batch has no common grid: use output_fmt='NLC', not {output_fmt!r}")
        start, grid = visual if visual is not None else (0, (1, 1, 1) if native else layout.grid)
        if output_fmt == "NCHW" and grid[0] != 1:
            raise ValueError(f"output_fmt='NCHW' needs a single-frame grid, got (T, H, W) = {grid}; use 'NCTHW'")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x = self.enter_blocks(x, layout)
        positions = self.positions(layout)
        out = []
        for i in range(max_index + 1 if stop_early else len(self.blocks)):
            x = self.run_block(i, x, positions)
            if i in take_indices:
                y = self.norm(x) if norm else x
                out.append(masked_tokens(y, layout) if native else y)
        p = layout.prefix_length if native else self.num_prefix_tokens
        prefix = [y[:, :p] for y in out]
        out = [y[:, p:] for y in out]
        if output_fmt != "NLC":
            shape = grid[1:] if output_fmt == "NCHW" else grid
            n = grid[0] * grid[1] * grid[2]
            out = [y[:, start : start + n].transpose(1, 2).unflatten(2, shape).contiguous() for y in out]
        final = None if intermediates_only else self.norm(x)
        if native and final is not None:
            final = dict(patches=final, patch_valid=layout.valid, layout=layout)
        if output_dict:
            prefix = dict(image_intermediates_prefix=prefix) if return_prefix_tokens and p else {}
            return dict(image_intermediates=out, **prefix) | ({} if final is None else dict(image_features=final))
        if return_prefix_tokens and p:
            out = list(zip(out, prefix))
        return out if intermediates_only else (final, out)

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | list[int] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        **inputs,
    ) -> list:
        """The DINO-style accessor timm's ViT keeps: the features of the last `n` blocks (or of blocks `n`), as
        maps in the default format (reshape) or NLC tokens; forward_intermediates with intermediates_only. `inputs`:
        the multimodal encoder's other inputs (text_ids, text_split)."""
        return self.forward_intermediates(
            x, indices=n, return_prefix_tokens=return_prefix_tokens, norm=norm,
            output_fmt=self.intermediate_formats[0] if reshape else "NLC", intermediates_only=True, **inputs,
        )  # fmt: skip

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head=True):
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]  # each block's PE state goes with it
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take_indices

    # --------------------------------------------------------------------------------------------- timm interface

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        own = {"cls_token", "reg_token"} | {f"pe.{n}" for n in self.pe.no_weight_decay()}
        return exact_no_weight_decay(self, own | layer_pos_no_weight_decay(self))

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            # per-layer PE parameters live in their block; the model-level PE (`pe.*`) joins the stem
            stem=r"^cls_token|^reg_token|^patch_embed|^token_merger|^text_embed|^markers|^pe\.|^norm_pre",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm\.", (99999,))],
        )

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new classifier (0: none) on the model's device and dtype, in its train / eval mode; global_pool None
        keeps the pool."""
        if global_pool is not None:
            _check_pool(global_pool, self.cls_token is not None)
            if global_pool == "map" and self.attn_pool is None:
                raise UnsupportedPool(
                    "reset_classifier cannot add attention pooling (global_pool='map'); build the model with it"
                )
            if global_pool != "map":
                self.attn_pool = None
            self.global_pool = global_pool
        self.num_classes = num_classes
        head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head = place_like(head, self)


def _check_rates(attn_drop_rate: float, patch_drop_rate: float) -> None:
    """timm's attn_drop_rate and patch_drop_rate are taken at 0 only (the layer's check says why for attention)."""
    check_attn_drop(attn_drop_rate)
    if patch_drop_rate:
        raise ValueError(
            f"patch_drop_rate={patch_drop_rate}: dropping patch tokens is not supported (the PEs and the token layout "
            f"keep every patch); use drop_path_rate or pos_drop_rate"
        )


def _check_pool(global_pool: str, class_token: bool) -> None:
    if global_pool not in POOLS:
        raise UnsupportedPool(f"global_pool must be one of {', '.join(map(repr, POOLS))}, got {global_pool!r}")
    if global_pool == "token" and not class_token:
        raise UnsupportedPool("global_pool='token' needs a CLS token (class_token=True); use global_pool='avg'")
