"""Native-resolution batches through a token-encoder model: the PE sites per image, the masked context, pooling.

The generic route, correct for every PE: each group of images with the same grid is gathered into an ordinary batch
[G, Pfx + H*W, C] with the layout the model gives such an image alone, the PE's site functions run on it as they do
on an image tensor, and the results are scattered back. Attention runs either per group the same way (each group's
q / k / v through `attention_core` with its own context: the work of the images alone) or over the whole batch with
the batch's `AttnMask` (rotations and value terms per group, logits biases placed block-diagonally into one
[B, H, L, L] bias): one masked kernel, which flex attention makes block-sparse on CUDA. Batch format:
`visionpe.layout`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.backends import resolve_backend
from ..attention.inputs import AttnRoute, PosContext
from ..attention.masks import AttnMask
from ..attention.rows import RowValue
from ..layers.attention_layer import attention_core
from ..layers.patch_resize import resize_kernel
from ..layout.batch import BatchLayout, ImageGroup, check_native, native_layout, regrid_layout
from ..pos.base import LayerPos, PosEncoding, Positions, PosStack

__all__ = [
    "pool_tokens",
    "NativePositions",
    "NativeSites",
    "embed_patches",
    "pool_images",
    "masked_tokens",
    "set_native_attention",
    "embed_tubelets",
    "stem_weight",
]


NATIVE_ATTENTION = ("auto", "images", "mask")
_native_attention = "auto"


def set_native_attention(mode: str) -> None:
    """How attention runs over a native batch: 'images' (each group of same-grid images as an ordinary batch: the
    work of the images alone, no padding), 'mask' (the whole [B, L] batch with the block-diagonal mask: one kernel,
    block-sparse with flex attention on CUDA), or 'auto' ('mask' where flex attention runs it and the PEs add no
    logits or value terms, else 'images')."""
    global _native_attention
    if mode not in NATIVE_ATTENTION:
        raise ValueError(f"native attention mode must be one of {NATIVE_ATTENTION}, got {mode!r}")
    _native_attention = mode


def _use_mask(q: torch.Tensor, mask: AttnMask, contexts: list[PosContext]) -> bool:
    """auto: the masked route where flex attention runs it and no PE adds a bias or value term (those would need a
    dense [B, H, L, L] bias; per group they run row-blocked, visionpe.attention.attend_rows)."""
    if _native_attention != "auto":
        return _native_attention == "mask"
    if any(c.bias is not None or c.value is not None for c in contexts):
        return False
    return resolve_backend(q, None, mask) == "flex"


def _acts(pe: PosEncoding, site: str) -> bool:
    """Whether a PE (or any PE of a stack) overrides a token site ('tokens' or 'block')."""
    parts = pe.encodings.values() if isinstance(pe, PosStack) else [pe]
    return any(getattr(type(p), site) is not getattr(PosEncoding, site) for p in parts)


def _tokens_first(t: torch.Tensor) -> torch.Tensor:
    """[B, H, L, d] -> [B * L, H, d] (a view for the attention layer's q / k / v)."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def _heads_gather(flat: torch.Tensor, group: ImageGroup) -> torch.Tensor:
    """flat [B * L, H, d] -> the group's [G, H, S, d]."""
    return flat.index_select(0, group.index.flatten()).unflatten(0, group.index.shape).transpose(1, 2)


def _scatter_heads(base: torch.Tensor, shape, parts: list[tuple[ImageGroup, torch.Tensor]]) -> torch.Tensor:
    """base [B * L, H, d] with each group's [G, H, S, d] values in place (one index_copy), as [B, H, L, d]."""
    b, h, n, d = shape
    if parts:
        index = torch.cat([g.index.flatten() for g, _ in parts])
        values = torch.cat([t.transpose(1, 2).flatten(0, 1) for _, t in parts]).to(base.dtype)
        base = base.index_copy(0, index, values)
    return base.view(b, n, h, d).transpose(1, 2)


def _local(layout: BatchLayout, group: ImageGroup) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [G, 1, 1], query index [G, S, 1], key index [G, 1, S]) of a group's block in a [B, L, L] matrix."""
    local = group.index - group.rows[:, None] * layout.length
    return group.rows[:, None, None], local[:, :, None], local[:, None, :]


class _Segmented(AttnRoute):
    """One layer's attention over a native batch, from one PosContext per group of images."""

    def __init__(self, layout: BatchLayout, contexts: list[PosContext | None]):
        self.layout = layout
        self.contexts = contexts
        self.parts = [(g, c) for g, c in zip(layout.groups, contexts) if c is not None]

    def attend(self, q, k, v, scale):
        """Each group as an ordinary batch (its PE context as for the images alone; padding outputs 0), or the
        whole batch masked (`set_native_attention`)."""
        if _use_mask(q, self.layout.mask, [c for _, c in self.parts]):
            return attention_core(q, k, v, self.masked(), scale)
        fq, fk, fv = _tokens_first(q), _tokens_first(k), _tokens_first(v)
        outs = []
        for group, ctx in zip(self.layout.groups, self.contexts):
            qg, kg, vg = (_heads_gather(t, group) for t in (fq, fk, fv))
            outs.append((group, attention_core(qg, kg, vg, ctx, scale)))
        b, h, n, _ = q.shape
        return _scatter_heads(v.new_zeros(b * n, h, v.shape[3]), (b, h, n, v.shape[3]), outs)

    def masked(self) -> PosContext:
        """The context of the masked route: the groups' terms assembled over the whole batch."""
        parts = [c for _, c in self.parts]
        return PosContext(
            rotate=self.rotate if any(c.rotate is not None for c in parts) else None,
            bias=self.bias if any(c.bias is not None for c in parts) else None,
            value=self.value if any(c.value is not None for c in parts) else None,
            needs_probs=any(c.needs_probs or isinstance(c.value, RowValue) for c in parts),
            mask=self.layout.mask,
        )

    def _replace(self, t: torch.Tensor, parts: list[tuple[ImageGroup, torch.Tensor]]) -> torch.Tensor:
        """t [B, H, L, d] with the groups' tokens replaced (out of place)."""
        return _scatter_heads(_tokens_first(t).clone(), t.shape, parts) if parts else t

    def rotate(self, q, k):
        fq, fk = _tokens_first(q), _tokens_first(k)
        rq, rk = [], []
        for group, ctx in self.parts:
            if ctx.rotate is not None:
                qg, kg = ctx.rotate(_heads_gather(fq, group), _heads_gather(fk, group))
                rq.append((group, qg))
                rk.append((group, kg))
        return self._replace(q, rq), self._replace(k, rk)

    def bias(self, q, k):
        """The groups' biases block-diagonally in one [B, H, L, L] (0 elsewhere; the mask blocks it)."""
        b, h, n, _ = q.shape
        fq, fk = _tokens_first(q), _tokens_first(k)
        out = None
        for group, ctx in self.parts:
            if ctx.bias is None:
                continue
            bg = ctx.bias(_heads_gather(fq, group), _heads_gather(fk, group))
            s = group.index.shape[1]
            bg = bg.expand(group.index.shape[0], h, s, s).permute(0, 2, 3, 1)
            if out is None:
                out = q.new_zeros(b, n, n, h, dtype=bg.dtype)
            out = out.index_put(_local(self.layout, group), bg.to(out.dtype))
        return out.permute(0, 3, 1, 2)

    def value(self, v, out, probs):
        fv, fo = _tokens_first(v), _tokens_first(out)
        parts = []
        for group, ctx in self.parts:
            if ctx.value is None:
                continue
            pg = None
            if probs is not None:
                pg = probs.permute(0, 2, 3, 1)[_local(self.layout, group)].permute(0, 3, 1, 2)
            parts.append((group, ctx.value(_heads_gather(fv, group), _heads_gather(fo, group), pg)))
        return self._replace(out, parts)


class NativeSites:
    """A model's PE sites over a BatchLayout, with the signatures of PosEncoding's (the layout argument is the
    BatchLayout itself)."""

    def __init__(self, pe: PosEncoding):
        self.pe = pe

    def tokens(self, x: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        return layout.map_images(x, self.pe.tokens) if _acts(self.pe, "tokens") else x


class NativePositions(Positions):
    """The Positions of a native batch (`layout` a BatchLayout): each layer's context and site 'block' per image
    group, with the signatures of Positions'."""

    def context(self, own: LayerPos) -> AttnRoute:
        layout, i = self.layout, own.index
        return _Segmented(layout, [self.pe.context(i, group.layout, None, own) for group in layout.groups])

    def block(self, own: LayerPos, x: torch.Tensor, layout=None) -> torch.Tensor:
        if not _acts(self.pe, "block"):
            return x
        return self.layout.map_images(x, lambda xg, lg: self.pe.block(own.index, xg, lg, own))


# --------------------------------------------------------------------------------------------------------- stem


def _native_tokens(model, batch: dict, weight: torch.Tensor, bias, dims: int) -> tuple[torch.Tensor, BatchLayout]:
    """Flattened patches (tubelets) [B, N, D] through the stem's linear map -> tokens [B, L, C] with zero prefix
    slots and padding, and the BatchLayout."""
    patches, coords, ids = check_native(batch, weight.shape[1], dims)
    layout = native_layout(coords, ids, model.num_prefix_tokens, lambda g: model.layout(g, patches.device))
    e = F.linear(patches.to(weight.dtype), weight, bias)  # [B, N, C]
    x = torch.cat([e.new_zeros(e.shape[0], layout.prefix_length, e.shape[-1]), e], dim=1)
    return x * layout.valid[..., None].to(x.dtype), layout  # padding patches carry nothing


def _with_prefix(model, x: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
    """The CLS and register tokens of every image in their slots."""
    p = model.num_prefix_tokens
    for group in layout.groups:
        x = layout.scatter(x, group, model.add_prefix(layout.gather(x, group)[:, p:]))
    return x


def stem_weight(conv: nn.Conv2d | nn.Conv3d, patches) -> torch.Tensor:
    """The stem's kernel as a linear map on flattened patches ((pt,) ph, pw, c order). A batch that carries its own
    patch size (unflattened patches [B, N, (pt,) ph, pw, C] of another ph x pw, as timm's NaFlex loader makes them
    with `patch_size_choices`) gets the kernel PI-resized to it (FlexiViT, timm's PatchEmbedInterpolator route);
    the token grid is then the batch's patch_coord grid, which the PEs and learned tables follow."""
    w = conv.weight
    frames = w.ndim - 4  # 0: image patches, 1: tubelets
    if isinstance(patches, torch.Tensor) and patches.ndim == 5 + frames and patches.shape[-1] == w.shape[1]:
        if frames and patches.shape[2] != w.shape[2]:
            raise ValueError(
                f"native batch: tubelets of {patches.shape[2]} frames, the model's have {w.shape[2]}; only the "
                f"spatial patch size may differ per batch (patchify clips with tubelet={w.shape[2]})"
            )
        w = resize_kernel(w, tuple(patches.shape[-3:-1]))
    return w.permute(0, *range(2, w.ndim), 1).flatten(1)


def embed_patches(model, batch: dict) -> tuple[torch.Tensor, BatchLayout]:
    """A NaFlex dict -> tokens [B, L, C] (prefix tokens in their slots, padding zero, before the token-site PEs)
    and their BatchLayout, for a ViT (`patch_embed`, optional `token_merger`, `add_prefix`, `layout`); patches at
    the model's patch size or, unflattened, at their own (`stem_weight`)."""
    stem = model.patch_embed
    weight = stem_weight(stem.proj, batch.get("patches"))  # the patch conv on (ph, pw, c)-flattened patches
    x, layout = _native_tokens(model, batch, weight, stem.proj.bias, 2)
    x = stem.norm(x)
    if model.token_merger is not None:
        x, layout = _merge(model, x, layout)
    return _with_prefix(model, x, layout), layout


def embed_tubelets(model, batch: dict) -> tuple[torch.Tensor, BatchLayout]:
    """A native batch of clips (tubelets flattened in (pt, ph, pw, c) order, patch_coord (t, y, x)) -> tokens
    [B, L, C] and their BatchLayout, for a video ViT (`patch_embed.proj` a Conv3d)."""
    proj = model.patch_embed.proj
    x, layout = _native_tokens(model, batch, stem_weight(proj, batch.get("patches")), proj.bias, 3)
    return _with_prefix(model, x, layout), layout


def _merge(model, x: torch.Tensor, layout: BatchLayout) -> tuple[torch.Tensor, BatchLayout]:
    """ViTAR's token merger per group of images: every image down to the merger grid."""
    grid = model.pe_grid
    merged = regrid_layout(layout, grid, lambda g: model.layout(g, x.device))
    (target,) = merged.groups
    out = x.new_zeros(merged.batch, merged.length, x.shape[-1])
    p = layout.num_prefix
    for group in layout.groups:
        cells = layout.gather(x, group)[:, p:].unflatten(1, group.grid)  # [G, h, w, C]
        tokens = model.token_merger(cells).flatten(1, 2)  # [G, gh * gw, C]
        index = target.index[group.images][:, p:]
        out = out.flatten(0, 1).index_copy(0, index.flatten(), tokens.flatten(0, 1)).view_as(out)
    return out, merged


# --------------------------------------------------------------------------------------------------------- head


def pool_tokens(x: torch.Tensor, global_pool: str, num_prefix: int) -> torch.Tensor:
    """Tokens [B, N, C] -> [B, C] as timm's ViT pools them: the CLS token ('token'), or the mean ('avg'), maximum
    ('max') or the average of both ('avgmax') over the tokens after the first `num_prefix`; '' keeps every token."""
    if not global_pool:
        return x
    if global_pool == "token":
        return x[:, 0]
    patches = x[:, num_prefix:]
    if global_pool == "avg":
        return patches.mean(1)
    if global_pool == "max":
        return patches.amax(1)
    return 0.5 * (patches.amax(1) + patches.mean(1))


def pool_images(x: torch.Tensor, layout: BatchLayout, pool) -> torch.Tensor:
    """Tokens [B, L, C] -> one row per image [I, C], each image pooled alone: `pool(tokens, num_prefix)` maps a
    group of same-grid images [G, Pfx + H*W, C] (as `layout.gather` gives them) to [G, C]."""
    out = x.new_zeros(layout.num_images, x.shape[-1])
    for group in layout.groups:
        out = out.index_copy(0, group.images, pool(layout.gather(x, group), layout.num_prefix))
    return out


def masked_tokens(x: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
    """x [B, L, C] with the padding tokens (and unused prefix slots) set to zero."""
    return x * layout.valid[..., None].to(x.dtype)
