"""LePE (Dong et al., CSWin Transformer): locally-enhanced positional encoding on the values.

Each attention layer adds DWConv(V) to its output: out = softmax(q k^T s) V + DWConv3x3(V), with V the value tokens
on their grid ([B, heads * d, H, W], all heads together as before the head split; depthwise, with bias, zero padding).
Windowed attention passes window-local layouts (grid (1, ws, ws)) and V [B * nW, heads, ws * ws, d]: the conv then
runs per window, padded with zeros at window borders, as in CSWin's stripes.
Prefix tokens (CLS, registers; CSWin has none) get no LePE term, and are not part of the conv's input.
Each layer holds its conv (`blocks.{i}.attn.pos.lepe.weight` [heads * d, 1, k, k] and `.bias`; flat names, as in
checkpoints before each layer owned its state: `convs.{i}.weight`, `convs.{i}.bias`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import PEHost, PosContext, PosEncoding

__all__ = ["LePE"]


class LePE(PosEncoding):
    """A depthwise conv on V per attention layer, added to the attention output (site "values")."""

    def __init__(self, host: PEHost, kernel_size: int = 3):
        super().__init__(host)
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"LePE kernel_size must be odd and positive (same-size output), got {kernel_size}")
        self.kernel_size = kernel_size

    layer_names = {r"convs\.(?P<i>\d+)\.(?P<name>weight|bias)": "{name}"}

    def layer(self, i):
        c, k = self.host.layers[i].num_heads * self.host.layers[i].head_dim, self.kernel_size
        return nn.Conv2d(c, c, k, padding=k // 2, groups=c)

    def context(self, i, layout, kv_layout=None, own=None):
        if kv_layout is not None and (kv_layout.grid != layout.grid or kv_layout.num_prefix != layout.num_prefix):
            raise ValueError(
                "LePE adds DWConv(V) to each query's output and needs keys on the query grid; "
                f"got query grid {layout.grid} and key grid {kv_layout.grid} (use a PE without a value term)"
            )
        h, w = layout.hw
        p = layout.num_prefix
        conv = own

        def value(v: torch.Tensor, out: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
            b, heads, _, d = v.shape  # v [B, H, P + N, d]
            # channels-last [B, h, w, H*d] seen as NCHW: the depthwise conv's fast layout, and one copy of V
            feat = v[:, :, p:].permute(0, 2, 1, 3).reshape(b, h, w, heads * d).permute(0, 3, 1, 2)
            term = conv(feat).permute(0, 2, 3, 1).reshape(b, h * w, heads, d).transpose(1, 2)  # [B, H, N, d]
            return out + (F.pad(term, (0, 0, p, 0)) if p else term)

        return PosContext(value=value)
