"""CvT (Wu et al., "CvT: Introducing Convolutions to Vision Transformers", ICCV 2021) with a swappable PE.

Three stages, each a strided convolutional token embedding (conv + LayerNorm) followed by transformer blocks whose
attention projects q, k and v through a depthwise conv + BatchNorm (stride 1 for q, 2 for k/v) and a linear layer.
The CLS token joins in the last stage only and bypasses the convolutions. The paper's models have no positional
encoding at all (`pe="nope"`); the others are options.

Positions: stage s attends over its own query grid (raw integer coordinates of that grid). Keys and values sit on
the stride-2 grid; they get the coordinates of their cell centres in query-grid units (`cell_centre_layout`), so a
relative PE compares q and k in one coordinate frame. (The stride-2 conv's receptive field is centred on query
cell 2i; the cell it summarises, [2i, 2i + 1], is centred on 2i + 0.5. We use the cell centre.)

Weight-compatibility quirks kept: the attention scale is dim^-0.5 over the full width, not head_dim^-0.5 (official
code); the official models use QuickGELU (`act_layer="quick_gelu"`, the default), the Hugging Face port GELU
(`act_layer="gelu"`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from functools import partial

import torch
from timm.layers import get_act_layer, get_norm_layer, trunc_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..fx import fx_unsupported, is_fx_tracing
from ..layers.attention_layer import check_attn_drop
from ..layers.checks import check_images
from ..layers.patch_resize import check_patch_size
from ..layout.tokens import TokenLayout, cell_centre_layout, image_layout
from ..pos.base import AttnSpec, PEHost, Positions
from ..pos.presets import build_pos_encoding
from .construction import (
    UnsupportedPool,
    factory_kwargs,
    init_linears,
    layer_pos_no_weight_decay,
    place_layer_pos,
    place_like,
)
from .cvt_layers import CvtBlock, CvtStage
from .param_groups import exact_no_weight_decay
from .staged import StagedModel

__all__ = ["ConvolutionalVisionTransformer"]


def _stage_tuple(value, n: int, what: str) -> tuple:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n:
            raise ValueError(f"{what} needs one value per stage ({n}), got {tuple(value)}")
        return tuple(value)
    return (value,) * n


def _stage_embeds(n: int, kernel, stride, padding) -> list[dict]:
    """Each stage's token embedding (kernel, stride, padding): one value for all stages or one per stage."""
    kernels = _stage_tuple(kernel, n, "patch_size")
    strides, paddings = _stage_tuple(stride, n, "patch_stride"), _stage_tuple(padding, n, "patch_padding")
    return [dict(kernel=k, stride=s, padding=p) for k, s, p in zip(kernels, strides, paddings)]


def _drop_rates(drop_path_rate, n: int) -> tuple[float, ...]:
    """One drop-path rate per stage: as given, or the last stage's (official: the stages before it have none)."""
    if isinstance(drop_path_rate, Sequence):
        return _stage_tuple(drop_path_rate, n, "drop_path_rate")
    return (0.0,) * (n - 1) + (drop_path_rate,)


def _build_stages(in_chans, dims, depths, heads, embeds, rates, cls_token, norm_layer, block_kwargs) -> nn.ModuleList:
    """The stages: embedding s (kernel, stride, padding), its blocks (drop path linear up to rates[s]); the CLS token
    joins in the last stage."""
    stages, n = [], len(depths)
    for s in range(n):
        in_dim = in_chans if s == 0 else dims[s - 1]
        stages.append(
            CvtStage(
                in_dim,
                dims[s],
                depths[s],
                embed=embeds[s],
                cls_token=cls_token and s == n - 1,
                norm_layer=norm_layer,
                num_heads=heads[s],
                drop_path=[rates[s] * j / max(depths[s] - 1, 1) for j in range(depths[s])],
                **block_kwargs,
            )
        )
    return nn.ModuleList(stages)


class ConvolutionalVisionTransformer(StagedModel):
    stage_attr, width_attr, intermediate_formats, pruned_pool = "stages", "embed_dims", ("NCHW", "NLC"), "avg"

    @factory_kwargs
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str | None = None,
        embed_dims: Sequence[int] = (64, 192, 384),
        depths: Sequence[int] = (1, 2, 10),
        num_heads: Sequence[int] = (1, 3, 6),
        patch_size: Sequence[int] = (7, 3, 3),
        patch_stride: Sequence[int] = (4, 2, 2),
        patch_padding: Sequence[int] = (2, 1, 1),
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        kernel_qkv: int = 3,
        stride_kv: int = 2,
        padding_q: int = 1,
        padding_kv: int = 1,
        cls_token: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float | Sequence[float] = 0.0,
        pe: str = "nope",
        pe_kwargs: dict | None = None,
        act_layer: str | type[nn.Module] = "quick_gelu",
        norm_layer: str | type[nn.Module] | None = None,
    ):
        """embed_dims/depths/num_heads and the patch_* conv settings are per stage. cls_token: a CLS token joins in
        the last stage (then global_pool defaults to 'token', else 'avg'). drop_path_rate: the last stage's rate
        (official: stages 1-2 have none), or one per stage, linear over each stage's blocks.
        pe: a PE preset (visionpe.pos.PE_PRESETS), 'nope' for the paper's models; pe_kwargs override its options.
        act_layer: 'quick_gelu' (official weights) or 'gelu' (Hugging Face transformers port); norm_layer: a class
        or timm's name; attn_drop_rate: timm's name, taken at 0."""
        super().__init__()
        check_attn_drop(attn_drop_rate)
        n = len(depths)
        embed_dims, num_heads = _stage_tuple(embed_dims, n, "embed_dims"), _stage_tuple(num_heads, n, "num_heads")
        embeds = _stage_embeds(n, patch_size, patch_stride, patch_padding)
        global_pool = global_pool if global_pool is not None else ("token" if cls_token else "avg")
        self._check_pool(global_pool, cls_token)
        norm_layer = get_norm_layer(norm_layer) or partial(nn.LayerNorm, eps=1e-5)
        act_layer = get_act_layer(act_layer)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.embed_dims = embed_dims
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.num_prefix_tokens = int(cls_token)
        self.grad_checkpointing = False

        attn = dict(
            qkv_bias=qkv_bias, kernel_size=kernel_qkv, stride_kv=stride_kv, padding_q=padding_q, padding_kv=padding_kv
        )
        blocks = dict(mlp_ratio=mlp_ratio, proj_drop=proj_drop_rate, act_layer=act_layer, attn_kwargs=attn)
        rates = _drop_rates(drop_path_rate, n)
        self.stages = _build_stages(
            in_chans, embed_dims, depths, num_heads, embeds, rates, cls_token, norm_layer, blocks
        )
        # global block index of each stage's first block
        self.stage_starts = [sum(depths[:s]) for s in range(n)]

        self.num_heads = tuple(num_heads)
        self.pe = build_pos_encoding(pe, self._host(), pe_kwargs)
        place_layer_pos(self.pe, self._blocks())
        self.pe_name = pe

        self.norm = norm_layer(embed_dims[-1])
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.feature_info = self._feature_info()
        self._init_layers()

    def _feature_info(self) -> list[dict]:
        strides = (stage.patch_embed.stride for stage in self.stages)
        reductions = itertools.accumulate(strides, operator.mul)
        dims = self.embed_dims
        return [dict(module=f"stages.{s}", num_chs=c, reduction=r) for s, (c, r) in enumerate(zip(dims, reductions))]

    @staticmethod
    def _check_pool(global_pool: str, cls_token: bool) -> None:
        if global_pool not in ("", "avg", "token"):
            raise UnsupportedPool(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if global_pool == "token" and not cls_token:
            raise UnsupportedPool("global_pool='token' needs cls_token=True; use global_pool='avg' without a CLS token")

    def _init_layers(self) -> None:
        """The constructor's init (the draws a seeded model has always made)."""
        for stage in self.stages:
            if stage.cls_token is not None:
                trunc_normal_(stage.cls_token, std=0.02)
        init_linears(self)
        self.pe.init_weights()

    # ------------------------------------------------------------------------------------------------ positions

    def _blocks(self) -> list:
        return [block for stage in self.stages for block in stage.blocks]

    def _host(self) -> PEHost:
        """What the PEs see: one AttnSpec per block on its stage's query grid at the reference size."""
        grids = self.stage_grids(self.img_size)
        depths = [len(stage.blocks) for stage in self.stages]
        return PEHost(
            dim=self.embed_dims[0],
            grid=grids[0],
            num_prefix=self.num_prefix_tokens,
            layers=tuple(
                AttnSpec(d, h, d // h, grid=g)
                for d, h, g, n in zip(self.embed_dims, self.num_heads, grids, depths)
                for _ in range(n)
            ),
            embed_prefix=False,
            stage_starts=tuple(dict.fromkeys(start for start, n in zip(self.stage_starts, depths) if n)),
        )

    def stage_grids(self, img_size: tuple[int, int]) -> list[tuple[int, int]]:
        """Query grid of every stage for an H x W image; a clear error when the image is too small."""
        grids, hw = [], tuple(img_size)
        for s, stage in enumerate(self.stages):
            hw = stage.patch_embed.out_size(hw)
            if min(hw) < 1:
                pe = stage.patch_embed
                raise ValueError(
                    f"image {img_size[0]} x {img_size[1]} is too small for CvT: stage {s}'s embedding "
                    f"(kernel {pe.kernel}, stride {pe.stride}, padding {pe.padding}) leaves no tokens; "
                    f"use images of at least {self.min_img_size()} px"
                )
            grids.append(hw)
        return grids

    def min_img_size(self) -> int:
        """Smallest square image every stage can embed."""
        size = 1
        while True:
            hw = (size, size)
            ok = True
            for stage in self.stages:
                hw = stage.patch_embed.out_size(hw)
                ok = ok and min(hw) >= 1
            if ok:
                return size
            size += 1

    def layouts(self, s: int, hw: tuple[int, int], device=None) -> tuple[TokenLayout, TokenLayout]:
        """(query layout, key/value layout) of stage s at query grid hw; k/v at their cell centres."""
        stage = self.stages[s]
        attn = stage.blocks[0].attn if len(stage.blocks) else None
        q_layout = image_layout(hw[0], hw[1], stage.num_prefix, device)
        if attn is None:
            return q_layout, q_layout
        kh, kw = attn.kv_grid(hw)
        kv_layout = cell_centre_layout(kh, kw, attn.stride_kv, stage.num_prefix, device)
        return q_layout, kv_layout

    # ---------------------------------------------------------------------------------------------------- forward

    def _run_block(self, block: CvtBlock, x, hw, num_prefix, positions: Positions):
        """A block with its PE context and site 'block' (computed inside the block, from its own state)."""
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(block, x, hw, num_prefix, positions, use_reentrant=False)
        return block(x, hw, num_prefix, positions)

    def forward_stage(self, s: int, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Stage s: [B, C_in, H, W] (images or the previous stage's map) -> tokens [B, P + h*w, C] and (h, w)."""
        stage = self.stages[s]
        x = stage.patch_embed(x)  # (B, h, w, C)
        B, h, w, C = x.shape
        x = x.reshape(B, h * w, C)
        if stage.cls_token is not None:
            x = torch.cat([stage.cls_token.expand(B, -1, -1), x], dim=1)
        layouts = self.layouts(s, (h, w), x.device)
        if s == 0:
            x = self.pe.tokens(x, layouts[0])
        positions = Positions(self.pe, *layouts)
        for block in stage.blocks:
            x = self._run_block(block, x, (h, w), stage.num_prefix, positions)
        return x, (h, w)

    @staticmethod
    def _to_map(x: torch.Tensor, hw: tuple[int, int], num_prefix: int) -> torch.Tensor:
        x = x[:, num_prefix:]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], hw[0], hw[1])  # (B, C, h, w)

    def _check(self, x: torch.Tensor) -> None:
        if is_fx_tracing():
            fx_unsupported("CvT (its stages' grids and key layouts follow the input size)")
        h, w = check_images(x, self.in_chans, 1, what="pixel")
        self.stage_grids((h, w))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> the last stage's tokens [B, P + h*w, C] after the final norm (P = 1 with a CLS token)."""
        self._check(x)
        for s in range(len(self.stages)):
            tokens, hw = self.forward_stage(s, x)
            if s < len(self.stages) - 1:
                x = self._to_map(tokens, hw, self.stages[s].num_prefix)
        return self.norm(tokens)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        if self.global_pool == "token":
            return x[:, 0]
        if self.global_pool == "avg":
            return x[:, self.stages[-1].num_prefix :].mean(dim=1)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def _begin(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return x

    def _run_stage(self, s: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, hw = self.forward_stage(s, x)
        return tokens, self._to_map(tokens, hw, self.stages[s].num_prefix)

    def _format(self, y: torch.Tensor, nxt: torch.Tensor, s: int, output_fmt: str) -> torch.Tensor:
        """Tokens -> NCHW maps or NLC tokens, CLS excluded."""
        p = self.stages[s].num_prefix
        return self._to_map(y, tuple(nxt.shape[-2:]), p) if output_fmt == "NCHW" else y[:, p:]

    # --------------------------------------------------------------------------------------------- timm interface

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {f"stages.{s}.cls_token" for s, st in enumerate(self.stages) if st.cls_token is not None}
        names |= {f"pe.{n}" for n in self.pe.no_weight_decay()} | layer_pos_no_weight_decay(self)
        return exact_no_weight_decay(self, names)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^stages\.0\.patch_embed|^pe\.",  # model-level PE parameters; per-layer ones live in their block
            blocks=r"^stages\.(\d+)"
            if coarse
            else [
                (r"^stages\.(\d+)\.patch_embed", (0,)),
                (r"^stages\.(\d+)\.cls_token", (0,)),
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        )

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool:
                self._check_pool(global_pool, self.stages[-1].cls_token is not None)
            self.global_pool = global_pool
        head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.head = place_like(head, self)

    def set_input_size(self, img_size=None, patch_size: int | None = None) -> None:
        """Change the reference input size (CvT has no size-dependent tables; PEs that have them are resampled).
        patch_size: the first stage's stride (px per token); its kernel and padding scale with it and the kernel is
        PI-resized (FlexiViT; `ConvEmbed.set_stride`)."""
        if img_size is not None:
            self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if patch_size is not None:
            self.stages[0].patch_embed.set_stride(check_patch_size(patch_size))
            self.feature_info = self._feature_info()
        self.set_pe_host(self._host(), tuple(b.attn.pos for b in self._blocks()))
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (self.in_chans, *self.img_size)}

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The last stage's query grid for an image of this size."""
        return self.stage_grids(img_size)[-1]
