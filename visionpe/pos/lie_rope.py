"""Learned rotations on b x b blocks: LieRE (Ostmeier et al., ICML 2025) and ComRoPE-AP / -LD (Yu et al., CVPR 2025).

Every token at normalised position x (A axes) rotates q and k by R(x) = blockdiag_j exp(sum_a x_a A_{a,j}): head dim
d splits into d // b contiguous blocks of b channels (left-over channels pass through), each with its own skew
generators A_{a,j} per layer and head. The variants differ in how the generators are parameterised:

| variant    | generators A_{a,j} (per layer, head)       | init                | positions         | prefix    |
|------------|--------------------------------------------|---------------------|-------------------|-----------|
| liere      | U - U^T, U = triu(P_{a,j}, 1)              | P ~ U[0, 2 pi)      | 0 .. n / n_ref    | identity  |
| comrope_ap | P_j - P_j^T if j % A == a else 0           | P ~ N(0, std^2)     | (i + 0.5) / n_ref | R(centre) |
| comrope_ld | theta_{a,j} (P_j - P_j^T), theta per layer | P ~ N(0, std^2),    | (i + 0.5) / n_ref | R(centre) |
|            | (shared by the heads)                      | theta ~ N(0, 1)     |                   |           |

AP's and LD's generators commute, so R(x)^T R(y) = R(y - x) (a relative encoding); LieRE's do not. LieRE's positions
are its official `linspace(0, n / n_ref, n)` per axis (0..1 at the reference grid); ComRoPE's its patch centres
divided by the reference extent ((0, 1) at the reference grid); prefix tokens (CLS, registers) get LieRE's zero
generator (R = I) or ComRoPE's image centre (0.5 on every axis). Axes follow the official order: (y, x) for images,
(t, y, x) for video; ComRoPE's frame centres are divided by the reference grid's height, as the official code divides
every axis by the spatial patch count (`frame_norm="frames"`: by the reference frame count). All positions pass
through `coordinates`, the one place a coordinate augmentation acts.

Coordinate augmentation in training (shift/jitter/rescale_coords, see visionpe.pos.coord_aug; off by default and in
eval) acts on these normalised coordinates, so a shift is in units of the reference extent (the official DINOv3
shift on its [-1, 1] box is twice ours): one draw per layer, shared by the queries and the keys; LieRE's prefix
tokens stay unrotated, ComRoPE's sit at the centre of the augmented image.

In eval without autograd the rotations of a layout are computed once and kept (keyed by the layout's positions and
the generators' versions: an optimizer step or load_state_dict invalidates them); in training, or whenever gradients
are recorded, every forward recomputes them in fp32 (LieRE: `torch.matrix_exp` per token; ComRoPE: `commuting_exp`,
one eigendecomposition per head and block; `torch.matrix_exp` while tracing).
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ..fx import fx_unsupported, is_fx_tracing
from ..layout.tokens import TokenLayout
from .base import LayerParams, PEHost, PosContext, PosEncoding
from .coord_aug import CoordAugment
from .rotary import no_autocast
from .table_cache import TableCache

__all__ = ["LieRoPE", "apply_block_rotation", "commuting_exp", "VARIANTS"]

VARIANTS = ("liere", "comrope_ap", "comrope_ld")
FRAME_NORMS = ("spatial", "frames")  # ComRoPE on video: frames in units of the spatial patch count, or of the clip
COMROPE_CENTRE = 0.5  # ComRoPE's `cls_position`: prefix tokens sit at the image centre of the unit square


def apply_block_rotation(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, d] times the block rotations rot [H, N, nb, b, b] on its first nb * b channels (fp32 math)."""
    nb, b = rot.shape[-3], rot.shape[-1]
    with no_autocast(x.device):
        xf = x.float()
        head = xf[..., : nb * b].unflatten(-1, (nb, b))
        out = torch.einsum("hnjab,zhnjb->zhnja", rot, head).flatten(-2)
        if nb * b < x.shape[-1]:
            out = torch.cat([out, xf[..., nb * b :]], dim=-1)
    return out.to(x.dtype)


def commuting_exp(coef: torch.Tensor, skew: torch.Tensor) -> torch.Tensor:
    """exp(coef * skew) [H, N, nb, b, b] for scalars coef [N, nb] and skew matrices [H, nb, b, b], from one
    eigendecomposition per head and block (-i S is Hermitian: S = V diag(i mu) V^H, so exp(c S) = V diag(e^(i c mu))
    V^H) instead of one exponential per token: about 12x faster forward + backward than `torch.matrix_exp` at
    ViT-S sizes, with the same fp32 accuracy. Its gradient needs distinct eigenvalues (generic random generators)."""
    mu, vec = torch.linalg.eigh(skew.to(torch.complex64) * -1j)  # [H, nb, b], [H, nb, b, b]
    angle = coef[None, :, :, None] * mu[:, None]  # [H, N, nb, b]
    phase = torch.polar(torch.ones_like(angle), angle)
    return ((vec[:, None] * phase[..., None, :]) @ vec[:, None].conj().transpose(-1, -2)).real.contiguous()


class LieRoPE(PosEncoding):
    """LieRE / ComRoPE at the qk site. variant: liere | comrope_ap | comrope_ld; block_size b (8); num_axes 2 for
    images (y, x), 3 for video (t, y, x); init_std: ComRoPE's generator std (1); layer0_generators: reproduce the
    official LieRE code, whose every layer uses layer 0's generators (default False: each layer its own, as the
    paper's `rotary_embedding_per_layer` intends); frame_norm: what ComRoPE divides video frame indices by,
    'spatial' (the reference grid's height, as the official `get_positions` divides every axis by the spatial patch
    count) or 'frames' (the reference frame count, (0, 1) over the training clip); shift/jitter/rescale_coords:
    coordinate augmentation in training (None: off)."""

    def __init__(
        self,
        host: PEHost,
        variant: str = "liere",
        block_size: int = 8,
        num_axes: int = 2,
        init_std: float = 1.0,
        layer0_generators: bool = False,
        frame_norm: str = "spatial",
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
    ):
        super().__init__(host)
        self.coord_aug = CoordAugment(shift_coords, jitter_coords, rescale_coords)
        if variant not in VARIANTS:
            raise ValueError(f"unknown LieRE/ComRoPE variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        if num_axes not in (1, 2, 3):
            raise ValueError(f"num_axes must be 1, 2 (y, x) or 3 (t, y, x), got {num_axes}")
        if block_size < 2:
            raise ValueError(f"block_size must be at least 2 (a 2 x 2 rotation), got {block_size}")
        if frame_norm not in FRAME_NORMS:
            raise ValueError(f"frame_norm must be one of {', '.join(FRAME_NORMS)}, got {frame_norm!r}")
        self.frame_norm = frame_norm
        if layer0_generators and variant != "liere":
            raise ValueError("layer0_generators reproduces the official LieRE code; it applies to variant 'liere' only")
        for spec in host.layers:
            if spec.head_dim < block_size:
                raise ValueError(
                    f"head dim {spec.head_dim} is smaller than block_size {block_size}; use block_size <= head dim"
                )
        self.variant, self.block_size, self.num_axes = variant, int(block_size), int(num_axes)
        self.init_std, self.layer0_generators = float(init_std), bool(layer0_generators)
        shapes = [(spec.num_heads, spec.head_dim // block_size) for spec in host.layers]
        self._nbs = sorted({nb for _, nb in shapes})
        if variant == "comrope_ap":
            for nb in self._nbs:
                self.register_buffer(f"axis_mask_{nb}", self._axis_mask(nb), persistent=False)
        if layer0_generators:  # the official code: layer 0's generators serve every layer (model-level)
            self.shared = LayerParams(partial(self._initial, host.layers[0]), decay=False)
        self._cache = TableCache(size=2 * max(1, host.depth), learned=True)

    layer_names = {r"(?P<name>generators|multipliers)\.(?P<i>\d+)": "{name}"}

    def _initial(self, spec) -> dict[str, torch.Tensor]:
        """One layer's generators (LieRE: U[0, 2 pi); ComRoPE: N(0, init_std)) and LD multipliers (N(0, 1))."""
        h, nb, b = spec.num_heads, spec.head_dim // self.block_size, self.block_size
        if self.variant == "liere":
            out = dict(generators=torch.empty(self.num_axes, h, nb, b, b).uniform_(0.0, 2 * math.pi))
        else:
            out = dict(generators=torch.empty(h, nb, b, b).normal_(0.0, self.init_std))
        if self.variant == "comrope_ld":
            out["multipliers"] = torch.empty(self.num_axes, nb).normal_(0.0, 1.0)
        return out

    def layer_entries(self, flat):
        """With layer0_generators the old layout held every layer's generators (`generators.{i}`) and read layer 0's:
        `generators.0` is the model-level `shared.generators`, the others (never read) are dropped."""
        if not self.layer0_generators:
            return super().layer_entries(flat)
        own = {"shared.generators" if k == "generators.0" else k: v for k, v in flat.items()}
        return super().layer_entries({k: v for k, v in own.items() if not k.startswith("generators.")})

    def layer(self, i):
        """Layer i's generators (and LD multipliers), excluded from weight decay; none with layer0_generators."""
        return None if self.layer0_generators else LayerParams(partial(self._initial, self.host.layers[i]), False)

    def _own(self, own):
        return self.shared if self.layer0_generators else own

    # ------------------------------------------------------------------------------------------------ parameters

    def _axis_mask(self, nb: int) -> torch.Tensor:
        """ComRoPE-AP's block-axis assignment [A, 1, nb, 1, 1]: block j belongs to axis j % A."""
        j = torch.arange(nb)
        return (j[None, :] % self.num_axes == torch.arange(self.num_axes)[:, None]).float()[:, None, :, None, None]

    def init_non_persistent_buffers(self) -> None:
        """Rebuild the buffers state_dict does not hold (after `to_empty` from the meta device)."""
        for nb in self._nbs if self.variant == "comrope_ap" else ():
            buf = getattr(self, f"axis_mask_{nb}")
            self.register_buffer(f"axis_mask_{nb}", self._axis_mask(nb).to(buf.device), persistent=False)

    def _commuting_parts(self, own: LayerParams) -> tuple[torch.Tensor, torch.Tensor]:
        """ComRoPE's generators A_{a,j} = w_{a,j} S_j: weights w [A, nb] (AP: the axis mask; LD: theta, shared by
        the heads) and skew matrices S [H, nb, b, b] of layer i (fp32)."""
        p = own.generators.float()
        skew = p - p.transpose(-1, -2)
        if self.variant == "comrope_ap":
            return getattr(self, f"axis_mask_{p.shape[1]}")[:, 0, :, 0, 0], skew
        return own.multipliers.float(), skew

    def layer_generators(self, own: LayerParams) -> torch.Tensor:
        """Skew generators [A, H, nb, b, b] of a layer (fp32), from its own tensors."""
        own = self._own(own)
        if self.variant == "liere":
            upper = torch.triu(own.generators.float(), diagonal=1)
            return upper - upper.transpose(-1, -2)
        weights, skew = self._commuting_parts(own)
        return weights[:, None, :, None, None] * skew[None]

    # ------------------------------------------------------------------------------------------------- positions

    def _reference(self, i: int) -> list[int]:
        """Reference extent per axis (official order) of layer i: its window / stage grid; for video, the frames
        (LieRE, ComRoPE with frame_norm 'frames') or the grid's height (ComRoPE's official unit)."""
        spec = self.host.layers[i]
        h, w = spec.grid if spec.grid is not None else self.host.grid
        frames = self.host.frames if self.variant == "liere" or self.frame_norm == "frames" else h
        return {1: [w], 2: [h, w], 3: [frames, h, w]}[self.num_axes]

    def _axes_pos(self, layout: TokenLayout) -> torch.Tensor:
        """Layout positions [N, A] in the official axis order ((x, y) image streams become (y, x))."""
        if layout.streams != max(self.num_axes, 2) and not (self.num_axes == 1 and layout.streams == 1):
            raise ValueError(
                f"{self.variant} with num_axes={self.num_axes} reads "
                f"{'(x, y)' if self.num_axes < 3 else '(t, y, x)'} positions, the layout has {layout.streams} "
                f"streams; set num_axes to match the backbone (2 for images, 3 for video)"
            )
        pos = layout.pos
        if self.num_axes == 2:
            return pos.flip(-1)
        return pos[:, :1] if self.num_axes == 1 else pos

    def coordinates(self, i: int, layout: TokenLayout, query_layout: TokenLayout | None = None) -> torch.Tensor:
        """Normalised positions [N, A] of the layout's positioned tokens under this variant's paper rule.
        query_layout: the layout whose grid sets LieRE's extent (the queries'; keys on a coarser grid share it)."""
        query_layout = layout if query_layout is None else query_layout
        ref = self._reference(i)
        pos = self._axes_pos(layout)
        if self.variant == "liere":  # linspace(0, n / n_ref, n) on each axis of the query grid
            grid = query_layout.grid
            counts = ref if grid is None else list(grid[3 - self.num_axes :])
            scale = [n / (r * (n - 1)) if n > 1 else 1.0 / max(r - 1, 1) for n, r in zip(counts, ref)]
            return pos * pos.new_tensor(scale)
        return (pos + 0.5) / pos.new_tensor([float(r) for r in ref])

    def _token_coords(
        self, i: int, layout: TokenLayout, query_layout: TokenLayout, coords=None, centre=None
    ) -> torch.Tensor:
        """Coordinates [P + N, A] with the prefix rows: LieRE's zero (identity), ComRoPE's centre (`centre` [1, A]
        where augmented). coords: the positioned tokens' (default: `coordinates`)."""
        coords = self.coordinates(i, layout, query_layout).float() if coords is None else coords
        if layout.num_prefix:
            if self.variant == "liere":
                fill = coords.new_zeros(layout.num_prefix, self.num_axes)
            elif centre is None:
                fill = coords.new_full((layout.num_prefix, self.num_axes), COMROPE_CENTRE)
            else:
                fill = centre.expand(layout.num_prefix, -1)
            coords = torch.cat([fill, coords])
        return coords

    def _augmented_coords(self, i: int, layout: TokenLayout, kv_layout: TokenLayout | None) -> list[torch.Tensor]:
        """Training with coordinate augmentation: [P + N, A] coordinates of the queries (and keys) under one draw."""
        layouts = [layout] if kv_layout is None else [layout, kv_layout]
        plain = [self.coordinates(i, lay, layout).float() for lay in layouts]
        centre = plain[0].new_full((1, self.num_axes), COMROPE_CENTRE)
        *drawn, centre = self.coord_aug(torch.cat([*plain, centre]), True).split([len(c) for c in plain] + [1])
        return [self._token_coords(i, lay, layout, c, centre) for lay, c in zip(layouts, drawn)]

    # ------------------------------------------------------------------------------------------------- rotations

    def rotations(
        self, i: int, own: LayerParams, layout: TokenLayout, query_layout: TokenLayout | None = None, coords=None
    ) -> torch.Tensor:
        """R [H, P + N, nb, b, b] (fp32) of layer i for the tokens of `layout` (at `coords` [P + N, A] if given)."""
        query_layout = layout if query_layout is None else query_layout
        with no_autocast(layout.pos.device):
            coords = self._token_coords(i, layout, query_layout) if coords is None else coords
            if self.variant != "liere" and not torch.compiler.is_compiling():  # (traced graphs: no complex eigh)
                weights, skew = self._commuting_parts(self._own(own))
                return commuting_exp(coords @ weights, skew)
            gens = self.layer_generators(own)
            return torch.matrix_exp(torch.einsum("na,ahjkl->hnjkl", coords, gens).contiguous())

    def _cached_rotations(self, i: int, own, layout: TokenLayout, query_layout: TokenLayout) -> torch.Tensor:
        """`rotations`, kept in eval without autograd (found again while the layer's parameters are unchanged)."""
        if self.training or torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self.rotations(i, own, layout, query_layout)
        key = (i, layout.num_prefix, query_layout.grid, self._reference(i))
        sources = (*self._own(own).parameters(), *self.buffers(recurse=False))  # generators, ComRoPE-AP's masks
        return self._cache.lookup(key, lambda: self.rotations(i, own, layout, query_layout), (layout.pos,), sources)

    def context(self, i, layout, kv_layout=None, own=None):
        if is_fx_tracing():
            fx_unsupported("LieRE / ComRoPE (their rotations are cached per input size)")
        if self.training and self.coord_aug.active:
            coords = self._augmented_coords(i, layout, kv_layout)
            rot_q = self.rotations(i, own, layout, layout, coords[0])
            rot_k = rot_q if kv_layout is None else self.rotations(i, own, kv_layout, layout, coords[1])
        else:
            rot_q = self._cached_rotations(i, own, layout, layout)
            rot_k = rot_q if kv_layout is None else self._cached_rotations(i, own, kv_layout, layout)

        def rotate(q, k):
            return apply_block_rotation(q, rot_q), apply_block_rotation(k, rot_k)

        return PosContext(rotate=rotate)
