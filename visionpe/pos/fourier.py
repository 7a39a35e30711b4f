"""Learnable Fourier features (Li et al., NeurIPS 2021, arXiv:2106.02795): an MLP over learned sinusoids of each
patch's continuous (x, y) coordinate, added to the tokens.

    F(p) = [cos(p W_r^T) || sin(p W_r^T)] / sqrt(|F|),   PE(p) = GELU(F(p) W_1 + b_1) W_2 + b_2

W_r [|F|/2, 2] (no bias) are learned frequencies; p are the layout's coordinates in patch units (x = column,
y = row), so the PE is a function of positions and needs no resampling at any grid: 'extrapolate' reads raw patch
indices beyond the training grid, 'interpolate' the coordinates rescaled onto it (the backbone's layout).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layout.tokens import TokenLayout
from .base import PEHost, PosEncoding

__all__ = ["LearnableFourier", "fourier_features"]


def fourier_features(pos: torch.Tensor, w_r: torch.Tensor) -> torch.Tensor:
    """[N, M] coordinates and [|F|/2, M] frequencies -> [N, |F|] features (cos first, then sin), scaled 1/sqrt(|F|)."""
    proj = pos.float() @ w_r.float().t()
    return torch.cat([proj.cos(), proj.sin()], dim=-1) / math.sqrt(2 * w_r.shape[0])


class Frequencies(nn.Module):
    """A learned [rows, M] frequency matrix drawn from N(0, std^2)."""

    def __init__(self, rows: int, m: int, std: float):
        super().__init__()
        self.std = std
        self.weight = nn.Parameter(torch.empty(rows, m))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.std)


class LearnableFourier(PosEncoding):
    """Learnable Fourier features + MLP on patch tokens (prefix tokens get nothing).

    feature_dim |F| (even; default: the token width), hidden_dim |H| (default 32, the common ports' value), gamma:
    W_r is drawn from N(0, gamma^-2), i.e. std 1/gamma (the paper's notation read as a variance) in radians per patch.
    Parameters: `w_r.weight` [|F|/2, 2], `mlp.0` (|F| -> |H|), `mlp.2` (|H| -> width), PyTorch's default Linear init.
    """

    positive_options = ("feature_dim", "hidden_dim", "gamma")

    def __init__(self, host: PEHost, feature_dim: int | None = None, hidden_dim: int = 32, gamma: float = 10.0):
        super().__init__(host)
        feature_dim = host.dim if feature_dim is None else int(feature_dim)
        if feature_dim < 2 or feature_dim % 2:
            raise ValueError(f"LearnableFourier feature_dim must be an even number >= 2, got {feature_dim}")
        self.gamma = float(gamma)
        # W_r in a submodule, as the MLP: a meta build (FSDP) moves every submodule's parameters at once
        self.w_r = Frequencies(feature_dim // 2, 2, 1.0 / self.gamma)
        self.mlp = nn.Sequential(
            nn.Linear(feature_dim, int(hidden_dim)), nn.GELU(), nn.Linear(int(hidden_dim), host.dim)
        )

    def encode(self, pos: torch.Tensor) -> torch.Tensor:
        """[N, 2] (x, y) coordinates -> [N, width] position embeddings."""
        feats = fourier_features(pos, self.w_r.weight).to(self.mlp[0].weight.dtype)
        return self.mlp(feats)

    def tokens(self, x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
        pe = self.encode(layout.pos[:, :2]).to(x.dtype)
        p = layout.num_prefix
        return torch.cat([x[:, :p], x[:, p:] + pe], dim=1) if p else x + pe

    def no_weight_decay(self) -> set[str]:
        return {"w_r.weight"}  # learned frequencies: decay would pull every one towards a constant PE
