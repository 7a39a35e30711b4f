"""Swin Transformer (Liu et al., ICCV 2021) with a swappable PE acting inside its (shifted) windows.

Hierarchical stages (patch merging between them), each a run of blocks that alternate plain and shifted windows.
Every attention layer attends inside windows, and its PE sees a window-local layout (coordinates 0..ws-1,
`window_layout`); the shifted-window mask is one more additive bias, merged into the PE's context. The default PE
is Swin's relative position bias, which here is iRPE's product mapping with an identity index (`pe="rpb"`): one
implementation of bucketed relative bias serves both. Parameter names follow timm's `SwinTransformer` except the
bias tables, which live with the PE (which names, initialises and resizes them).

LePE in shifted windows: its depthwise conv on V runs per window (zero padding at window borders), so in a border
window of a shifted block it also reads neighbours from the wrapped-around region, which the mask cuts off only for
attention; CSWin, where LePE comes from, has no shifted windows.

Any input size works at call time: the image is zero-padded to whole patches, odd maps to even before merging and
every map to whole windows (padding never attended); a map no larger than the window is one unshifted window.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import ClassifierHead, PatchEmbed, get_act_layer, get_norm_layer, to_2tuple
from timm.models.swin_transformer import PatchMerging
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.checkpoint import checkpoint

from ..fx import fx_unsupported, is_fx_tracing
from ..layers import Attention, PreNormBlock
from ..layers.attention_layer import check_attn_drop
from ..layers.checks import check_images
from ..layout.tokens import TokenLayout, image_layout, is_symbolic, window_layout
from ..pos.base import AttnSpec, PEHost, PosContext, Positions
from ..pos.presets import build_pos_encoding
from .construction import UnsupportedPool, factory_kwargs, init_linears, layer_pos_no_weight_decay, place_layer_pos
from .param_groups import exact_no_weight_decay
from .staged import StagedModel
from .swin_windows import WindowPlan, plan_windows, window_mask

__all__ = ["SwinTransformer", "SwinBlock", "SwinStage"]

POOLS = ("", "avg", "max", "avgmax")  # pools that keep the pooled width (concatenating ones would double it)


def _check_pool(global_pool: str) -> None:
    if global_pool not in POOLS:
        raise UnsupportedPool(f"global_pool must be '', 'avg', 'max' or 'avgmax', got {global_pool!r}")


def stage_windows(window_size, num_stages: int) -> tuple[tuple[int, int], ...]:
    """An int, an (h, w) pair, or one int / pair per stage -> one (h, w) window per stage. With two stages a pair of
    ints is read as one window per stage."""
    if isinstance(window_size, int):
        window_size = [window_size] * num_stages
    elif len(window_size) == 2 and all(isinstance(w, int) for w in window_size) and num_stages != 2:
        window_size = [tuple(window_size)] * num_stages
    if len(window_size) != num_stages:
        raise ValueError(f"window_size needs one entry per stage ({num_stages}) or one for all, got {window_size}")
    out = tuple(to_2tuple(w) for w in window_size)
    if any(min(w) < 1 for w in out):
        raise ValueError(f"window sizes must be positive, got {out}")
    return out


class SwinBlock(PreNormBlock):
    """Window attention + MLP, pre-norm (timm names norm1, attn.{qkv, proj}, norm2, mlp); shifted: this block's
    windows are shifted by half a window; branch: PreNormBlock's options (mlp_ratio, drop_path, act_layer,
    norm_layer)."""

    def __init__(
        self, dim: int, num_heads: int, shifted: bool, qkv_bias: bool = True, proj_drop: float = 0.0, **branch
    ):
        super().__init__(dim, Attention(dim, num_heads, qkv_bias, proj_drop=proj_drop), proj_drop=proj_drop, **branch)
        self.shifted = shifted

    def forward(self, x: torch.Tensor, plan: WindowPlan, positions=None) -> torch.Tensor:
        """x [B, H, W, C]; attention runs on the windows of `plan` with the (PE + mask) context of `positions`
        (the forward's Positions over the window layout, or a PosContext as given); the PE's site 'block' after."""
        windows = self.attn(plan.partition(self.norm1(x)), self.context(positions))  # (B * nW, wh * ww, C)
        x = self.add_mlp(self.add_attn(x, plan.reverse(windows, x.shape[0])))
        B, H, W, C = x.shape
        flat = x.reshape(B, H * W, C)
        y = self.block_site(positions, flat, image_layout(H, W, 0, x.device))
        return x if y is flat else y.reshape(B, H, W, C).clone()  # x itself when no PE acts here; else no view


class EvenPatchMerging(PatchMerging):
    """timm's PatchMerging (same parameters, same output) with an odd map padded to 2 * ceil(H / 2) rows and
    columns: under symbolic sizes (torch.export) the 2 x 2 view then holds by construction, with no divisibility
    guard on the size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        h, w = (H + 1) // 2, (W + 1) // 2
        x = F.pad(x, (0, 0, 0, 2 * w - W, 0, 2 * h - H))
        x = x.reshape(B, h, 2, w, 2, C).permute(0, 1, 3, 4, 2, 5).flatten(3)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """Patch merging (stages after the first), then blocks alternating plain / shifted windows."""

    def __init__(self, in_dim: int, dim: int, depth: int, downsample: bool, norm_layer, drop_path, **block_kwargs):
        super().__init__()
        self.downsample = EvenPatchMerging(in_dim, dim, norm_layer=norm_layer) if downsample else nn.Identity()
        self.blocks = nn.ModuleList(
            SwinBlock(dim, shifted=j % 2 == 1, drop_path=drop_path[j], norm_layer=norm_layer, **block_kwargs)
            for j in range(depth)
        )


def _build_stages(dims, depths, heads, drop_path_rate: float, norm_layer, block_kwargs) -> nn.ModuleList:
    """The stages (patch merging into every stage after the first); drop path linear over all blocks."""
    total = sum(depths)
    dpr = [drop_path_rate * j / max(total - 1, 1) for j in range(total)]
    starts = [sum(depths[:s]) for s in range(len(depths))]
    return nn.ModuleList(
        SwinStage(
            dims[max(s - 1, 0)],
            dims[s],
            depths[s],
            downsample=s > 0,
            norm_layer=norm_layer,
            drop_path=dpr[starts[s] : starts[s] + depths[s]],
            num_heads=heads[s],
            **block_kwargs,
        )
        for s in range(len(depths))
    )


def _shift_bias(mask: torch.Tensor, batch: int) -> PosContext:
    nw, n, _ = mask.shape
    full = mask[None].expand(batch, nw, n, n).reshape(batch * nw, 1, n, n)  # window b * nW + w gets mask[w]
    return PosContext(bias=lambda q, k: full)


class SwinTransformer(StagedModel):
    output_fmt = "NHWC"  # forward_features returns [B, H, W, C], as timm's Swin
    stage_attr, width_attr, intermediate_formats = "layers", "dims", ("NCHW", "NHWC")

    @factory_kwargs
    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int | Sequence = 7,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        pe: str = "rpb",
        pe_kwargs: dict | None = None,
        norm_layer: str | type[nn.Module] | None = None,
        act_layer: str | type[nn.Module] | None = None,
    ):
        """embed_dim: width of stage 1 (doubling per stage). window_size: one for all stages or one per stage.
        pe: a PE preset (visionpe.pos.PE_PRESETS), 'rpb' being Swin's relative position bias; pe_kwargs override
        its options. norm_layer / act_layer: classes or timm's names; attn_drop_rate: timm's name, taken at 0."""
        super().__init__()
        _check_pool(global_pool)
        check_attn_drop(attn_drop_rate)
        if len(num_heads) != len(depths):
            raise ValueError(f"num_heads needs one entry per stage ({len(depths)}), got {tuple(num_heads)}")
        norm_layer = get_norm_layer(norm_layer) or nn.LayerNorm
        act_layer = get_act_layer(act_layer) or nn.GELU
        n = len(depths)
        dims = [embed_dim * 2**s for s in range(n)]
        for d, h in zip(dims, num_heads):
            if d % h:
                raise ValueError(f"stage width {d} is not divisible by {h} heads")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.dims = dims
        self.num_heads = tuple(num_heads)
        self.num_features = self.head_hidden_size = dims[-1]
        self.window_sizes = stage_windows(window_size, n)
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            norm_layer=norm_layer,
            output_fmt="NHWC",
            strict_img_size=False,
            dynamic_img_pad=True,
        )
        self.stage_starts = [sum(depths[:s]) for s in range(n)]
        blocks = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_drop=proj_drop_rate, act_layer=act_layer)
        self.layers = _build_stages(dims, depths, num_heads, drop_path_rate, norm_layer, blocks)
        self.pe_name = pe
        self.pe = build_pos_encoding(pe, self._host(), pe_kwargs)
        place_layer_pos(self.pe, self._blocks())

        self.norm = norm_layer(self.num_features)
        self.head = ClassifierHead(self.num_features, num_classes, global_pool, drop_rate, input_fmt="NHWC")
        r = self.patch_embed.patch_size[0]
        self.feature_info = [dict(module=f"layers.{s}", num_chs=dims[s], reduction=r * 2**s) for s in range(n)]
        self._init_layers()

    def _blocks(self) -> list:
        return [block for stage in self.layers for block in stage.blocks]

    def _host(self) -> PEHost:
        """What the PEs see: one AttnSpec per block, its grid the stage's window."""
        specs = tuple(
            AttnSpec(self.dims[s], self.num_heads[s], self.dims[s] // self.num_heads[s], grid=self.window_sizes[s])
            for s, stage in enumerate(self.layers)
            for _ in stage.blocks
        )
        return PEHost(
            dim=self.embed_dim,
            grid=tuple(self.patch_embed.grid_size),
            num_prefix=0,
            layers=specs,
            stage_starts=tuple(self.stage_starts),
        )

    def _init_layers(self) -> None:
        """The constructor's init (the draws a seeded model has always made)."""
        init_linears(self)
        self.pe.init_weights()

    # ---------------------------------------------------------------------------------------------------- forward

    def export_min_size(self) -> tuple[int, int]:
        """The least height and width from which every stage's map is larger than its window. torch.export with
        dynamic H, W serves any size from here up: windows and shifts are then the same at every size, and padding
        to whole patches, merges and windows is written without branches on the size. (Below it Swin clamps the
        window to the map and drops the shift, a different graph.)"""
        p = self.patch_embed.patch_size
        return tuple(max(p[a] * 2**s * win[a] for s, win in enumerate(self.window_sizes)) + 1 for a in (0, 1))

    def _check_export_size(self, h, w) -> None:
        mh, mw = self.export_min_size()
        if not (statically_known_true(h >= mh) and statically_known_true(w >= mw)):
            raise ValueError(
                f"Swin exports with dynamic height and width for sizes from {mh} x {mw} up (every stage's map larger "
                f"than its window, so windows and shifts do not depend on the size): declare "
                f"dynamic_shapes=({{2: Dim('h', min={mh}), 3: Dim('w', min={mw})}},)"
            )

    def _pad_to_patches(self, x: torch.Tensor) -> torch.Tensor:
        """Zero-pad images at the bottom / right to whole patches (as timm's PatchEmbed does), the padded size
        written as patches x patch so that symbolic sizes need no divisibility guard."""
        (ph, pw), (h, w) = self.patch_embed.patch_size, x.shape[-2:]
        pad = (0, pw * ((w + pw - 1) // pw) - w, 0, ph * ((h + ph - 1) // ph) - h)
        return F.pad(x, pad) if torch.compiler.is_compiling() or any(pad) else x  # traced: no guard on the size

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> patch tokens [B, H', W', C] with token-site PEs applied."""
        if is_fx_tracing():
            fx_unsupported("Swin (its windows, shifts and masks follow the input size)")
        check_images(x, self.in_chans, self.patch_embed.patch_size[0])
        if torch.compiler.is_exporting() and is_symbolic(x.shape[-2:]):
            self._check_export_size(*x.shape[-2:])
        x = self.patch_embed(self._pad_to_patches(x))  # (B, Hp, Wp, C)
        B, H, W, C = x.shape
        return self.pe.tokens(x.reshape(B, H * W, C), image_layout(H, W, 0, x.device)).reshape(B, H, W, C)

    def forward_stage(self, s: int, x: torch.Tensor) -> torch.Tensor:
        """Stage s on [B, H, W, C] (patch merging first): windows, layouts and masks are built once per stage."""
        stage = self.layers[s]
        x = stage.downsample(x)
        B, H, W, _ = x.shape
        plans = [plan_windows((H, W), self.window_sizes[s], shifted) for shifted in (False, True)]
        layout: TokenLayout = window_layout(*plans[0].window, device=x.device)  # both plans share the window
        masks = [window_mask(p, x.device) for p in plans]
        positions = [Positions(self.pe, layout, extra=None if m is None else _shift_bias(m, B)) for m in masks]
        for block in stage.blocks:
            plan, pos = plans[block.shifted], positions[block.shifted]
            if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x = checkpoint(block, x, plan, pos, use_reentrant=False)
            else:
                x = block(x, plan, pos)
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Images -> the last stage's normalised map [B, H, W, C]."""
        x = self.embed(x)
        for s in range(len(self.layers)):
            x = self.forward_stage(s, x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def _begin(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x)

    def _run_stage(self, s: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.forward_stage(s, x)
        return x, x

    def _format(self, y: torch.Tensor, nxt: torch.Tensor, s: int, output_fmt: str) -> torch.Tensor:
        return y.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else y  # NHWC: the model's own form

    # --------------------------------------------------------------------------------------------- timm interface

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        own = {f"pe.{n}" for n in self.pe.no_weight_decay()} | layer_pos_no_weight_decay(self)
        return exact_no_weight_decay(self, own)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^patch_embed|^pe\.",  # model-level PE parameters (APE); per-layer ones live in their block
            blocks=r"^layers\.(\d+)"
            if coarse
            else [
                (r"^layers\.(\d+).downsample", (0,)),
                (r"^layers\.(\d+)\.\w+\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        )

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new classifier (0: none) over the current width, on the model's device and dtype, in its train / eval
        mode; global_pool None keeps the pool."""
        if global_pool is not None:
            _check_pool(global_pool)
        ref = self.patch_embed.proj.weight
        self.head.reset(num_classes, global_pool, in_features=self.num_features, device=ref.device, dtype=ref.dtype)
        self.head.train(self.training)
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool

    def set_input_size(self, img_size=None, patch_size=None, window_size=None) -> None:
        """Change the reference input size, patch size and/or window size (one for all stages or one per stage).
        A new window resizes every relative-position table (bicubic, as timm does for Swin checkpoints)."""
        if img_size is not None or patch_size is not None:
            self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
            if patch_size is not None:
                for s, info in enumerate(self.feature_info):
                    info["reduction"] = self.patch_embed.patch_size[0] * 2**s
        if window_size is not None:
            self.window_sizes = stage_windows(window_size, len(self.layers))
        self.set_pe_host(self._host(), tuple(b.attn.pos for b in self._blocks()))
        if hasattr(self, "pretrained_cfg"):
            self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (self.in_chans, *self.patch_embed.img_size)}

    def token_grid(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """The last stage's map for an image of this size (padded to whole patches, then halved, rounding up)."""
        p = self.patch_embed.patch_size[0]
        h, w = -(-img_size[0] // p), -(-img_size[1] // p)
        for _ in range(len(self.layers) - 1):
            h, w = -(-h // 2), -(-w // 2)
        return h, w
