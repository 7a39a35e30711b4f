"""STRING (Schenck et al., ICML 2025, arXiv 2502.02562): RoPE around a learned orthogonal basis change.

A STRING rotates token z at position r by R(r) = exp(sum_k r_k L_k) with learned, pairwise commuting skew
generators L_k; every such R equals P^T RoPE(r) P for an orthogonal P (the paper's Theorem 3.4), and since the left
P^T cancels in q . k, q and k here are multiplied by P and then rotated by an ordinary RoPE over the layout's (x, y):
q_i . k_j = q_i^T R(r_i)^T R(r_j) k_j = q_i^T R(r_j - r_i) k_j, a relative encoding. Per layer and head:

- cayley: P = (I - S)(I + S)^-1 (a linear solve), S = A - A^T learned, A = 0 at init (P = I); the RoPE's
  frequencies are RoPE-Mixed's learned [2, heads, d/2] (same init as `rope2d_mixed`, theta 10), so at S = 0 it is
  exactly RoPE-Mixed;
- circulant: L_k = C_k - C_k^T, C_k the circulant matrix of a learned c_k [d] per axis. All such L commute and share
  the real Fourier basis as eigenvectors: P is that fixed basis (pair m < d/2 spans sin / cos of frequency m; the
  last pair, DC and Nyquist, is never rotated: L has eigenvalue 0 there), and pair m's frequency along axis k is
  2 Im(FFT(c_k))_m = -2 sum_n c_{k,n} sin(2 pi m n / d). At init c_k is the minimal-norm c whose frequencies are
  RoPE-Mixed's initial ones (pairs 0..d/2-2).

Prefix tokens (CLS, registers) get angle 0, so R = P: the position 0 of RoPE. Learned parameters are excluded from
weight decay. Options: shift/jitter/rescale_coords (coordinate augmentation in training, visionpe.pos.coord_aug).
"""

from __future__ import annotations

import math
from functools import partial

import torch

from .base import LayerParams, PEHost, PosContext, PosEncoding
from .coord_aug import CoordAugment
from .rope2d import mixed_frequencies
from .rotary import apply_rotary, no_autocast, scaled_cos_sin

torch.fx.wrap("scaled_cos_sin")  # FX: a graph leaf when called from here too (visionpe.fx)

__all__ = ["STRING", "cayley", "circulant_basis", "circulant_sines", "VARIANTS"]

VARIANTS = ("cayley", "circulant")


def cayley(skew: torch.Tensor) -> torch.Tensor:
    """P = (I - S)(I + S)^-1 for skew-symmetric S [..., d, d] (I + S is always invertible); the two factors commute,
    so P = solve(I + S, I - S)."""
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device)
    return torch.linalg.solve(eye + skew, eye - skew)


def circulant_sines(d: int) -> torch.Tensor:
    """W [d, d/2] with c @ W = the frequencies of C - C^T (C circulant of c) on the pairs of `circulant_basis`:
    W[n, m] = -2 sin(2 pi (m + 1) n / d) for m < d/2 - 1; the last column (DC, Nyquist) is 0."""
    n = torch.arange(d, dtype=torch.float64)[:, None]
    m = torch.arange(1, d // 2, dtype=torch.float64)[None, :]
    w = -2.0 * torch.sin(2 * math.pi * m * n / d)
    return torch.cat([w, w.new_zeros(d, 1)], dim=1)


def circulant_basis(d: int) -> torch.Tensor:
    """Orthonormal rows [d, d]: pair m < d/2 - 1 is (sin, cos) of Fourier frequency m + 1, the last pair DC and
    Nyquist. exp(sum_k r_k (C_k - C_k^T)) = B^T RoPE(r) B with the frequencies of `circulant_sines`."""
    n = torch.arange(d, dtype=torch.float64)
    rows = []
    for m in range(1, d // 2):
        rows += [
            math.sqrt(2.0 / d) * torch.sin(2 * math.pi * m * n / d),
            math.sqrt(2.0 / d) * torch.cos(2 * math.pi * m * n / d),
        ]
    rows += [torch.full((d,), 1.0 / math.sqrt(d), dtype=torch.float64), (-1.0) ** n / math.sqrt(d)]
    return torch.stack(rows)


class STRING(PosEncoding):
    """STRING at the qk site. variant: 'cayley' (learned P and RoPE-Mixed frequencies) or 'circulant' (circulant
    generators); theta: RoPE-Mixed's initial frequency base (10); shift/jitter/rescale_coords: coordinate
    augmentation in training (None: off)."""

    positive_options = ("theta",)

    def __init__(
        self,
        host: PEHost,
        variant: str = "cayley",
        theta: float = 10.0,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
    ):
        super().__init__(host)
        if variant not in VARIANTS:
            raise ValueError(f"unknown STRING variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        for spec in host.layers:
            if spec.head_dim % 4:
                raise ValueError(f"STRING needs head dims divisible by 4, got {spec.head_dim}")
        self.variant, self.theta = variant, float(theta)
        self.coord_aug = CoordAugment(shift_coords, jitter_coords, rescale_coords)
        self._head_dims = sorted({spec.head_dim for spec in host.layers})
        if variant == "circulant":
            for d in self._head_dims:
                self.register_buffer(f"basis_{d}", circulant_basis(d).float(), persistent=False)
                self.register_buffer(f"sines_{d}", circulant_sines(d).float(), persistent=False)

    def _initial(self, spec) -> dict[str, torch.Tensor]:
        """Values of one layer (at construction and reset): Cayley (RoPE-Mixed's random-angle frequencies, A = 0),
        circulant (the minimal-norm c giving those frequencies on pairs 0 .. d/2 - 2)."""
        init = mixed_frequencies(spec.head_dim, 1, spec.num_heads, self.theta)[:, 0]  # [2, H, d/2]
        if self.variant == "cayley":
            return dict(freqs=init, skews=torch.zeros(spec.num_heads, spec.head_dim, spec.head_dim))
        target = torch.cat([init[..., :-1], init.new_zeros(2, spec.num_heads, 1)], dim=-1)
        return dict(circulant=(target.double() @ torch.linalg.pinv(circulant_sines(spec.head_dim))).float())

    layer_names = {r"(?P<name>freqs|skews|circulant)\.(?P<i>\d+)": "{name}"}

    def layer(self, i):
        """Layer i's freqs and skews (Cayley) or circulant c, excluded from weight decay."""
        return LayerParams(partial(self._initial, self.host.layers[i]), decay=False)

    def init_non_persistent_buffers(self) -> None:
        for d in self._head_dims if self.variant == "circulant" else ():
            for name, build in ((f"basis_{d}", circulant_basis), (f"sines_{d}", circulant_sines)):
                buf = getattr(self, name)
                self.register_buffer(name, build(d).to(buf.device, buf.dtype), persistent=False)

    def layer_parts(self, i: int, own: LayerParams) -> tuple[torch.Tensor, torch.Tensor]:
        """(P [H or 1, d, d], RoPE frequencies F [2, H, d/2]) of layer i in fp32: R(r) = P^T RoPE_F(r) P."""
        if self.variant == "cayley":
            a = own.skews.float()
            return cayley(a - a.transpose(-1, -2)), own.freqs.float()
        d = self.host.layers[i].head_dim
        freqs = own.circulant.float() @ getattr(self, f"sines_{d}").float()
        return getattr(self, f"basis_{d}").float()[None], freqs

    def context(self, i, layout, kv_layout=None, own=None):
        if layout.streams != 2:
            raise ValueError(f"STRING needs (x, y) positions, got a layout with {layout.streams} streams")
        with no_autocast(layout.pos.device):
            basis, freqs = self.layer_parts(i, own)
        layouts = [layout] if kv_layout is None else [layout, kv_layout]
        positions = [lay.pos for lay in layouts]
        if self.coord_aug.active and self.training:  # one draw per layer, shared by queries and keys
            positions = self.coord_aug.jointly(positions, True)
        cos_sin = [scaled_cos_sin(p, freqs, lay.num_prefix) for p, lay in zip(positions, layouts)]
        (cos_q, sin_q), (cos_k, sin_k) = cos_sin[0], cos_sin[-1]

        def change(x):
            with no_autocast(x.device):
                return x.float() @ basis.transpose(-1, -2)  # [B, H, N, d] @ [H or 1, d, d]

        def rotate(q, k):
            return apply_rotary(change(q), cos_q, sin_q).to(q.dtype), apply_rotary(change(k), cos_k, sin_k).to(k.dtype)

        return PosContext(rotate=rotate)
