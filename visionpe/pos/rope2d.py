"""2D RoPE for images (Heo et al., ECCV 2024): axial (fixed frequencies) and mixed (learnable per layer and head).

Both drive the shared rotary kernel with a frequency matrix F over the layout's (x, y) streams:
- axial: the first d/4 pairs rotate by x * f_j, the last d/4 by y * f_j, f_j = theta^(-4j/d) (theta 100 for ViT);
- mixed: per layer and head, fx = [m cos a, m cos(a + pi/2)], fy = [m sin a, m sin(a + pi/2)], m_j = theta^(-4j/d)
  (theta 10), a ~ U[0, 2 pi); each layer holds its own `freqs` [2, heads, d/2] (`blocks.{i}.attn.pos.rope2d.freqs`;
  timm's and rope-vit's checkpoints stack them as [2, depth, heads, d/2]), excluded from weight decay.
Options of both: coordinate augmentation in training (shift/jitter/rescale_coords, in patch units; see
visionpe.pos.coord_aug; a fresh draw per layer, as DINOv3 draws per block) and the host's test-time `ntk` / `yarn`
position modes (visionpe.pos.rope_scaling; the training extent is the reference grid; `yarn_ramp` 'reference', the
reference code's ramp, or 'paper'), and p-RoPE (`p`, Barbero et al., ICLR 2025): only the fraction p of each axis'
ladder, its highest frequencies, rotates; the lowest pairs get frequency 0 (RoPE-Mixed: those learned frequencies
stay in the parameter, as in a rope2d_mixed checkpoint, and are multiplied by 0).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..layout.tokens import TokenLayout
from .base import AttnSpec, CheckpointMismatch, PEHost, PosContext, PosEncoding, assign
from .coord_aug import CoordAugment
from .rope_scaling import base_ladder, check_yarn_ramp, rope_scaling, scale_frequencies, yarn_temperature
from .rotary import FixedCosSinCache, apply_rotary, axial_frequencies, check_p_rope, p_rope_keep, scaled_cos_sin

torch.fx.wrap("scaled_cos_sin")  # FX: a graph leaf when called from here too (visionpe.fx)

__all__ = ["RoPE2D", "mixed_frequencies"]


def mixed_frequencies(head_dim: int, depth: int, num_heads: int, theta: float = 10.0, rotate: bool = True):
    """Initial RoPE-Mixed frequencies [2 (x, y), depth, heads, d/2]; rotate=False gives the axial pattern."""
    if head_dim % 4:
        raise ValueError(f"RoPE-Mixed needs a head dim divisible by 4, got {head_dim}")
    mag = theta ** (-torch.arange(0, head_dim, 4, dtype=torch.float32) / head_dim)  # [d/4]
    a = torch.rand(depth, num_heads, 1) * 2 * math.pi if rotate else torch.zeros(depth, num_heads, 1)
    fx = torch.cat([mag * torch.cos(a), mag * torch.cos(a + math.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(a), mag * torch.sin(a + math.pi / 2)], dim=-1)
    return torch.stack([fx, fy], dim=0)


class MixedFrequencies(nn.Module):
    """One layer's RoPE-Mixed frequencies `freqs` [2, heads, d/2], learned and excluded from weight decay."""

    def __init__(self, spec: AttnSpec, theta: float):
        super().__init__()
        self.head_dim, self.num_heads, self.theta = spec.head_dim, spec.num_heads, theta
        self.freqs = nn.Parameter(self._draw())

    def _draw(self) -> torch.Tensor:
        return mixed_frequencies(self.head_dim, 1, self.num_heads, self.theta)[:, 0]

    def reset_parameters(self) -> None:
        with torch.no_grad():
            assign(self.freqs, self._draw())

    def no_weight_decay(self) -> set[str]:
        return {"freqs"}


class RoPE2D(PosEncoding):
    """Rotates q and k of every attention layer by their (x, y) positions; prefix tokens are not rotated.

    Published RoPE-Mixed ViTs store the frequencies as `rope.freqs` (timm's eva port, [2, depth, H, d/2]) or `freqs`
    (naver's rope-vit, [2, depth, H * d/2]); naver's patch positions `freqs_t_x/y` and eva's other `rope.*` tensors
    are buffers, rebuilt from the layout."""

    positive_options = ("theta",)
    checkpoint_keys = {"vit": r"^(rope\.)?freqs$"}
    checkpoint_buffers = {"vit": r"^freqs_t_[xy]$|^rope\.(?!freqs$)"}

    def __init__(
        self,
        host: PEHost,
        mode: str = "axial",
        theta: float | None = None,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        yarn_ramp: str = "reference",
        p: float = 1.0,
    ):
        super().__init__(host)
        self.yarn_ramp = check_yarn_ramp(yarn_ramp)
        self.p = check_p_rope(p)
        if mode not in ("axial", "mixed"):
            raise ValueError(f"RoPE2D mode must be 'axial' or 'mixed', got {mode!r}")
        self.mode = mode
        self.coord_aug = CoordAugment(shift_coords, jitter_coords, rescale_coords)
        self.theta = float(theta if theta is not None else (100.0 if mode == "axial" else 10.0))
        head_dims = {spec.head_dim for spec in host.layers}
        for d in head_dims:
            if d % 4:
                raise ValueError(f"2D RoPE needs head dims divisible by 4, got {d}")
        self._head_dims = sorted(head_dims)
        for d in self._head_dims if mode == "mixed" and self.p < 1.0 else ():  # p-RoPE's mask of the learned pairs
            self.register_buffer(f"keep_{d}", self._keep(d), persistent=False)
        if mode == "axial":
            for d in head_dims:
                self.register_buffer(f"axial_{d}", self._axial(d), persistent=False)
        self._cos_sin_cache = FixedCosSinCache()  # axial only (mixed frequencies are trained)

    def keep(self, head_dim: int) -> torch.Tensor | None:
        """p-RoPE's mask [d/2] (1: the pair rotates, 0: dropped), None at p = 1."""
        return getattr(self, f"keep_{head_dim}", None)

    def _keep(self, d: int) -> torch.Tensor:
        return p_rope_keep([c // (d // 4) for c in range(d // 2)], self.p).float()  # a ladder per d/4-pair half

    def _axial(self, d: int) -> torch.Tensor:
        freqs = axial_frequencies(d, self.theta)
        return freqs if self.p == 1.0 else freqs * self._keep(d)

    def layer(self, i):
        return MixedFrequencies(self.host.layers[i], self.theta) if self.mode == "mixed" else None

    def init_non_persistent_buffers(self):
        for d in self._head_dims if self.mode == "mixed" and self.p < 1.0 else ():
            buf = self.keep(d)
            self.register_buffer(f"keep_{d}", self._keep(d).to(buf.device, buf.dtype), persistent=False)
        for d in self._head_dims if self.mode == "axial" else ():
            buf = getattr(self, f"axial_{d}")
            freqs = self._axial(d).to(buf.device, buf.dtype)  # where and how the model keeps it
            self.register_buffer(f"axial_{d}", freqs, persistent=False)

    def layer_frequencies(self, i: int, own: MixedFrequencies | None = None) -> torch.Tensor:
        """Frequency matrix of layer i: [2, d/2] (axial, shared) or [2, heads, d/2] (mixed, the layer's own `own`;
        p-RoPE's dropped pairs multiplied by 0)."""
        d = self.host.layers[i].head_dim
        if self.mode == "axial":
            return getattr(self, f"axial_{d}")
        freqs = own.freqs
        keep = self.keep(d)
        return freqs if keep is None else freqs * keep.to(freqs.device, freqs.dtype)

    def _scaling(self, layout: TokenLayout):
        """The ntk / yarn scaling of the queries' grid over the reference (x, y) extent (None: no scaling)."""
        if layout.grid is None or layout.grid[0] != 1:
            return None
        (h, w), (ref_h, ref_w) = layout.hw, self.host.grid
        return rope_scaling(self.position_mode, (w, h), (ref_w, ref_h), self.yarn_ramp)

    def _cos_sin(self, i: int, layout: TokenLayout, scaling=None, drawn=None, own=None):
        """drawn: the layout's positions under this layer's coordinate augmentation (training), else None."""
        ref_h, ref_w = self.host.grid
        d = self.host.layers[i].head_dim
        ladder = base_ladder(self.theta, d // 4)  # axial f_j = theta^(-4j/d); RoPE-Mixed's initial magnitudes
        freqs = scale_frequencies(self.layer_frequencies(i, own), scaling, d, (ref_w, ref_h), ladder=ladder)
        gain = yarn_temperature(scaling)
        if drawn is not None:
            return scaled_cos_sin(drawn, freqs, layout.num_prefix, gain=gain)
        if self.mode == "axial":  # fixed: once per layout, head dim and scaling
            return self._cos_sin_cache(layout, freqs, tag=scaling, gain=gain)
        return scaled_cos_sin(layout.pos, freqs, layout.num_prefix, gain=gain)

    def context(self, i, layout, kv_layout=None, own=None):
        if layout.streams != 2:
            raise ValueError(f"2D RoPE needs (x, y) positions, got a layout with {layout.streams} streams")
        scaling = self._scaling(layout)  # the same for the keys (CvT's stride-2 keys share the queries' frame)
        layouts = [layout] if kv_layout is None else [layout, kv_layout]
        drawn = [None] * len(layouts)
        if self.coord_aug.active and self.training:  # a fresh draw for this layer, the same for queries and keys
            drawn = self.coord_aug.jointly([lay.pos for lay in layouts], True)
        cos_q, sin_q = self._cos_sin(i, layout, scaling, drawn[0], own)
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout, scaling, drawn[1], own)

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)

    layer_names = {r"freqs\.(?P<i>\d+)": "freqs"}  # hierarchical backbones' per-layer frequencies

    def _stacked(self) -> bool:
        """Mixed with one head count and head dim in every layer: checkpoints stack the frequencies [2, depth, ...]."""
        return self.mode == "mixed" and len({(s.num_heads, s.head_dim) for s in self.host.layers}) == 1

    def layer_entries(self, flat):
        """`freqs` [2, depth, H, d/2] (timm / rope-vit, and ViTs before each layer held its own) -> layer i's [2, H,
        d/2]."""
        flat = dict(flat)
        stacked = flat.pop("freqs", None)
        own, layers = super().layer_entries(flat)
        for i, f in enumerate(stacked.unbind(1) if stacked is not None else ()):
            layers.setdefault(i, {})["freqs"] = f
        return own, layers

    def convert_checkpoint(self, entries, source):
        """RoPE-Mixed frequencies in timm's layout [2, depth, H, d/2] (naver's [2, depth, H * d/2] reshaped)."""
        single = self._stacked()
        if entries and not single:
            raise CheckpointMismatch(self.absent_message(next(iter(entries)), source))
        if not entries:
            if single:
                raise CheckpointMismatch(
                    f"the model's PE {source.pe_name!r} has learned RoPE-Mixed frequencies the checkpoint lacks; "
                    "use the matching preset (rope2d for an axial RoPE checkpoint)"
                )
            return {}
        spec = self.host.layers[0]
        v, target = next(iter(entries.values())), torch.Size((2, self.host.depth, spec.num_heads, spec.head_dim // 2))
        if v.shape == target:
            return {"freqs": v}
        if v.dim() == 3 and v.numel() == target.numel() and tuple(v.shape[:2]) == tuple(target[:2]):
            return {"freqs": v.reshape(target)}
        raise CheckpointMismatch(
            f"the checkpoint's RoPE-Mixed frequencies have shape {tuple(v.shape)}, the model's {tuple(target)} "
            f"[2, depth, heads, head_dim/2]; it is {source.describe()}"
        )

    @classmethod
    def absent_message(cls, key, source):
        return (
            f"the checkpoint has RoPE-Mixed frequencies ({key}) but the model's PE is {source.pe_name!r}; "
            "use a rope2d_mixed preset (e.g. vit_s_rope2d_mixed)"
        )
