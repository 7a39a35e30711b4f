"""2D RoPE for images (Heo et al., ECCV 2024): axial (fixed frequencies) and mixed (learnable per layer and head).

Both drive the shared rotary kernel with a frequency matrix F over the layout's (x, y) streams:
- axial: the first d/4 pairs rotate by x * f_j, the last d/4 by y * f_j, f_j = theta^(-4j/d) (theta 100 for ViT);
- mixed: per layer and head, fx = [m cos a, m cos(a + pi/2)], fy = [m sin a, m sin(a + pi/2)], m_j = theta^(-4j/d)
  (theta 10), a ~ U[0, 2 pi); stored as `freqs` [2, depth, heads, d/2] (timm's layout), excluded from weight decay.
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

from ..layout import TokenLayout
from .base import EVERY_LAYER, CheckpointMismatch, PEHost, PosContext, PosEncoding
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
        if mode == "mixed":
            heads = {spec.num_heads for spec in host.layers}
            if len(heads) == 1 and len(head_dims) == 1:  # one tensor, as in timm / rope-vit checkpoints
                self.freqs = nn.Parameter(
                    mixed_frequencies(head_dims.pop(), host.depth, heads.pop(), self.theta)
                )  # [2, depth, H, d/2]
            else:  # hierarchical backbones: one tensor per layer
                self.freqs = nn.ParameterList(
                    [nn.Parameter(mixed_frequencies(s.head_dim, 1, s.num_heads, self.theta)[:, 0]) for s in host.layers]
                )
        else:
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

    def reset_parameters(self):
        """Mixed: frequencies drawn afresh (random angles) as at construction."""
        if self.mode != "mixed":
            return
        with torch.no_grad():
            if isinstance(self.freqs, nn.ParameterList):
                for p, s in zip(self.freqs, self.host.layers):
                    p.copy_(mixed_frequencies(s.head_dim, 1, s.num_heads, self.theta)[:, 0])
            else:
                _, depth, heads, _ = self.freqs.shape
                head_dim = self.host.layers[0].head_dim
                self.freqs.copy_(mixed_frequencies(head_dim, depth, heads, self.theta))

    def init_non_persistent_buffers(self):
        for d in self._head_dims if self.mode == "mixed" and self.p < 1.0 else ():
            buf = self.keep(d)
            self.register_buffer(f"keep_{d}", self._keep(d).to(buf.device, buf.dtype), persistent=False)
        for d in self._head_dims if self.mode == "axial" else ():
            buf = getattr(self, f"axial_{d}")
            freqs = self._axial(d).to(buf.device, buf.dtype)  # where and how the model keeps it
            self.register_buffer(f"axial_{d}", freqs, persistent=False)
        self._cos_sin_cache.clear()

    def keep_layers(self, depth):
        super().keep_layers(depth)
        if self.mode != "mixed":
            return
        if isinstance(self.freqs, nn.ParameterList):
            self.freqs = nn.ParameterList(list(self.freqs)[:depth])
        else:
            kept = self.freqs[:, :depth].detach().clone()
            self.freqs = nn.Parameter(kept, requires_grad=self.freqs.requires_grad)

    def layer_parameters(self, i):
        per_layer = self.mode == "mixed" and isinstance(self.freqs, nn.ParameterList)  # vit's [2, depth, ...]: all
        return [self.freqs[i]] if per_layer and i < len(self.freqs) else []

    def layer_frequencies(self, i: int) -> torch.Tensor:
        """Frequency matrix of layer i: [2, d/2] (axial, shared) or [2, heads, d/2] (mixed; p-RoPE's dropped pairs
        multiplied by 0)."""
        d = self.host.layers[i].head_dim
        if self.mode == "axial":
            return getattr(self, f"axial_{d}")
        freqs = self.freqs[i] if isinstance(self.freqs, nn.ParameterList) else self.freqs[:, i]
        keep = self.keep(d)
        return freqs if keep is None else freqs * keep.to(freqs.device, freqs.dtype)

    def _scaling(self, layout: TokenLayout):
        """The ntk / yarn scaling of the queries' grid over the reference (x, y) extent (None: no scaling)."""
        if layout.grid is None or layout.grid[0] != 1:
            return None
        (h, w), (ref_h, ref_w) = layout.hw, self.host.grid
        return rope_scaling(self.host.position_mode, (w, h), (ref_w, ref_h), self.yarn_ramp)

    def _cos_sin(self, i: int, layout: TokenLayout, scaling=None, drawn=None):
        """drawn: the layout's positions under this layer's coordinate augmentation (training), else None."""
        ref_h, ref_w = self.host.grid
        d = self.host.layers[i].head_dim
        ladder = base_ladder(self.theta, d // 4)  # axial f_j = theta^(-4j/d); RoPE-Mixed's initial magnitudes
        freqs = scale_frequencies(self.layer_frequencies(i), scaling, d, (ref_w, ref_h), ladder=ladder)
        gain = yarn_temperature(scaling)
        if drawn is not None:
            return scaled_cos_sin(drawn, freqs, layout.num_prefix, gain=gain)
        if self.mode == "axial":  # fixed: once per layout, head dim and scaling
            return self._cos_sin_cache(layout, freqs, tag=scaling, gain=gain)
        return scaled_cos_sin(layout.pos, freqs, layout.num_prefix, gain=gain)

    def context(self, i, layout, kv_layout=None):
        if layout.streams != 2:
            raise ValueError(f"2D RoPE needs (x, y) positions, got a layout with {layout.streams} streams")
        scaling = self._scaling(layout)  # the same for the keys (CvT's stride-2 keys share the queries' frame)
        layouts = [layout] if kv_layout is None else [layout, kv_layout]
        drawn = [None] * len(layouts)
        if self.coord_aug.active and self.training:  # a fresh draw for this layer, the same for queries and keys
            drawn = self.coord_aug.jointly([lay.pos for lay in layouts], True)
        cos_q, sin_q = self._cos_sin(i, layout, scaling, drawn[0])
        cos_k, sin_k = (cos_q, sin_q) if kv_layout is None else self._cos_sin(i, kv_layout, scaling, drawn[1])

        def rotate(q, k):
            return apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos_k, sin_k)

        return PosContext(rotate=rotate)

    def no_weight_decay(self):
        if self.mode != "mixed":
            return set()
        if isinstance(self.freqs, nn.ParameterList):
            return {f"freqs.{i}" for i in range(len(self.freqs))}
        return {"freqs"}

    def layer_of(self, name):
        return EVERY_LAYER if name == "freqs" else super().layer_of(name)  # [2, depth, ...] or freqs.{i}

    def convert_checkpoint(self, entries, source):
        """RoPE-Mixed frequencies in timm's layout [2, depth, H, d/2] (naver's [2, depth, H * d/2] reshaped)."""
        single = self.mode == "mixed" and isinstance(self.freqs, nn.Parameter)
        if entries and not single:
            raise CheckpointMismatch(self.absent_message(next(iter(entries)), source))
        if not entries:
            if single:
                raise CheckpointMismatch(
                    f"the model's PE {source.pe_name!r} has learned RoPE-Mixed frequencies the checkpoint lacks; "
                    "use the matching preset (rope2d for an axial RoPE checkpoint)"
                )
            return {}
        v, target = next(iter(entries.values())), self.freqs.shape
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
