"""SeqPE's position encoder (Li et al., arXiv 2506.13277): a position written as a sequence of decimal digits, read
by a small causal transformer whose last token, a learned CLS, gives the position's embedding.

A 2D position (row, col) is each coordinate in base 10, left-padded with the digit 0 to `digits` places, row digits
first: with 2 digits per axis, (2, 3) -> [0, 2, 0, 3]. Every digit token is the sum of a token embedding (10 digits),
an embedding of its place in the sequence and one of its axis; the CLS comes last, so under the causal mask it is the
one token that reads every digit. Blocks are pre-LN (LayerNorm, causal attention, residual; LayerNorm, 4x GELU-tanh
MLP, residual); a final LayerNorm and a Linear on the CLS give the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

__all__ = ["DigitEncoder", "digit_tokens", "digits_for"]


def digits_for(max_position: int) -> int:
    """Decimal places that write every position 0 .. max_position - 1 (100 -> 2)."""
    return len(str(int(max_position) - 1))


def digit_tokens(coords: torch.Tensor, digits: int) -> torch.Tensor:
    """Integer coordinates [N, A] (official axis order: row, then column) -> digit tokens [N, A * digits], each
    coordinate most significant digit first, left-padded with 0."""
    powers = 10 ** torch.arange(digits - 1, -1, -1, device=coords.device)
    return (coords.long()[..., None] // powers % 10).flatten(1)


class CausalBlock(nn.Module):
    """A pre-LN transformer block with causal self-attention over [N, L, D] sequences."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh")))


class DigitEncoder(nn.Module):
    """Digit tokens [N, A * digits] -> embeddings [N, out_dim] (width `dim`, `depth` blocks of `heads` heads)."""

    def __init__(self, axes: int, digits: int, dim: int, heads: int, depth: int, out_dim: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ValueError(f"SeqPE width {dim} is not divisible by its {heads} heads; set width / heads to match")
        self.axes, self.digits = axes, digits
        self.token_embed = nn.Embedding(10, dim)
        self.place_embed = nn.Parameter(torch.zeros(axes * digits, dim))  # the digit's place in the sequence
        self.axis_embed = nn.Parameter(torch.zeros(axes, dim))
        self.cls_embed = nn.Parameter(torch.zeros(dim))
        self.blocks = nn.ModuleList(CausalBlock(dim, heads, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, out_dim)
        self.register_buffer("axis_of", torch.arange(axes * digits) // digits, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The learned embeddings' constructor values (zero; `init` draws them)."""
        for p in (self.place_embed, self.axis_embed, self.cls_embed):
            nn.init.zeros_(p)

    def init(self, std: float = 0.02) -> None:
        """Every weight ~ truncated normal (std), biases zero, LayerNorms at identity."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                trunc_normal_(m.weight, std=std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for p in (self.place_embed, self.axis_embed, self.cls_embed):
            trunc_normal_(p, std=std)

    def init_non_persistent_buffers(self) -> None:
        n = self.axes * self.digits
        self.register_buffer("axis_of", torch.arange(n, device=self.axis_of.device) // self.digits, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_embed(tokens) + self.place_embed + self.axis_embed[self.axis_of]
        x = torch.cat([x, self.cls_embed.expand(x.shape[0], 1, -1)], dim=1)  # the CLS last: it reads every digit
        for block in self.blocks:
            x = block(x)
        return self.out_proj(self.norm(x[:, -1]))
