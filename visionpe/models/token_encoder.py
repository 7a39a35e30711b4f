"""A single-stream transformer over tokens with a layout: the trunk shared by the video ViT and the multimodal encoder.

A subclass owns the stem (`embed(...) -> tokens, layout`); this class owns the CLS token, the PEs (built from a preset
for a PEHost), the blocks, the norms and the head, and the timm model interface.
"""

from __future__ import annotations

from functools import partial

import torch
from timm.layers import trunc_normal_
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import Block
from ..layout import TokenLayout
from ..pos.base import AttnSpec, PEHost
from ..pos.presets import build_pos_encoding
from ..pos.rope_nd import layout_scheme

__all__ = ["TokenEncoder"]

POOLS = ("", "avg", "token")


class TokenEncoder(nn.Module):
    def __init__(
        self,
        grid: tuple[int, int],
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
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        pe: str = "rope3d",
        pe_kwargs: dict | None = None,
        default_scheme: str = "rope3d",
        host_extra: dict | None = None,
        norm_layer: type[nn.Module] | None = None,
        act_layer: type[nn.Module] | None = None,
    ):
        """grid: the reference (H, W) patch grid the PEs are built for; default_scheme: the position scheme of the
        layout when no PE asks for one (e.g. for a learned APE)."""
        super().__init__()
        if global_pool not in POOLS:
            raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without a CLS token")
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        act_layer = act_layer or nn.GELU
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = int(class_token)
        self.grad_checkpointing = False
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None

        host = PEHost(
            dim=embed_dim,
            grid=tuple(grid),
            num_prefix=self.num_prefix_tokens,
            layers=tuple(AttnSpec(embed_dim, num_heads, embed_dim // num_heads) for _ in range(depth)),
            embed_prefix=False,
            extra=dict(host_extra or {}),
        )
        self.pe = build_pos_encoding(pe, host, pe_kwargs)
        self.pe_name = pe
        self.pos_scheme = layout_scheme(self.pe, default_scheme)

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
        use_fc_norm = global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else norm_layer(embed_dim)
        self.fc_norm = norm_layer(embed_dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def init_weights(self) -> None:
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.blocks.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if isinstance(self.head, nn.Linear):
            trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    # ---------------------------------------------------------------------------------------------------- trunk

    def add_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, C] -> [B, P + N, C] with the CLS token in front."""
        return x if self.cls_token is None else torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)

    def run_block(self, i: int, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        ctx = self.pe.context(i, layout)
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            x = checkpoint(self.blocks[i], x, ctx, use_reentrant=False)
        else:
            x = self.blocks[i](x, ctx)
        return self.pe.block(i, x, layout)

    def run_blocks(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        """Token-site PEs, every block, the final norm: [B, P + N, C] -> [B, P + N, C]."""
        x = self.pe.tokens(x, layout)
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

    # --------------------------------------------------------------------------------------------- timm interface

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"cls_token"} | {f"pe.{n}" for n in self.pe.no_weight_decay()}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^cls_token|^pe|^patch_embed|^text_embed|^markers",
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
            if global_pool not in POOLS:
                raise ValueError(f"global_pool must be '', 'avg' or 'token', got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a CLS token; this model has none")
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
