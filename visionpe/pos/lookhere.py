"""LookHere (Fuller et al., NeurIPS 2024, arXiv:2405.13985): no position embedding; a fixed attention bias per layer
and head that limits each head's field of view to a direction and penalises distance, as in the official
`create_lh_bias_tensor` (GreenCUBIC/lookhere).

For query q and key k with offset (u, v) = (k.x - q.x, k.y - q.y), y downward, and d = ||(u, v)|| in patch units:
- masks (True = the key is hidden from the head): up v > 0, down v < 0, left u > 0, right u < 0 (half-planes that
  keep their boundary); the 90-degree cones tri_up: not (u >= v and u + v <= 0), tri_down: not (u <= v and
  u + v >= 0), tri_right: not (u >= v and u + v >= 0), tri_left: not (u <= v and u + v <= 0); diag_a_b = tri_a and
  tri_b (a 180-degree half-plane between two axes). A head hides the union of its directions' masks.
- the head names (`head_directions`, parts joined by '-'): halves (up, down, left, right), corners (the four
  quadrants), triangles (the four cones), diagonals (up-right, up-left, down-right, down-left half-planes),
  eighths1 / eighths2 (45-degree wedges: a cone and a half-plane), none (distance only), zero (no bias), and the
  zero* / noneNzeroM mixes. 'center' (a key's distance to the grid centre) is not offered: it is not a function of
  the offset.
- heads per part, as the official code assigns them: 12 heads take 4 directions of each of 3 parts (8 + 4 with 2
  parts), 16 heads 8 + 4 + 4 (8 + 8, 4 x 4), 6 heads the 4 of the first part and the first 2 of the second, and a
  one-part name repeats its 4 directions. Other head counts (ViT-T's 3, ViT-N's 4), which the official code
  rejects, take the parts' directions in order, cycling, and keep the first H.
- head slopes per run of equal part names: a directional run of n heads has 2^-(1 + k // 4) (official for n a
  multiple of 4), a none / zero run [1/4, 1/16, 1/64, 1/256] (n <= 4: the first n; else entry floor(4 k / n), which
  is the official repeat for n a multiple of 4; the official code fails for a 6-head model whose second part is
  directional, which this rule extends).
- per layer l of D: layer_slope = numpy's linspace(layer_slopes[0], layer_slopes[1], D), D the depth the model
  was built with (a pruned model's layers keep their slopes).
- bias = -bf16(nan_to_num(global_slope * layer_slope * (head_slope * d)), with d = +inf where masked and +inf
  replaced by bf16's largest value), computed in float64 and rounded to bfloat16 as the official code does; the
  masked entries are -3.3895e38. Prefix rows and columns are zero (CLS sees every patch, every patch sees CLS).
The biases are no buffers (the state dict holds nothing) and any grid gets them with the same slopes.
"""

from __future__ import annotations

from itertools import groupby

import torch

from .offset_bias import OffsetBiasPE

__all__ = ["LookHere", "head_assignment", "head_slopes", "layer_slopes", "PART_DIRECTIONS"]

_Q = [("up",), ("down",), ("left",), ("right",)]
PART_DIRECTIONS: dict[str, list[tuple[str, ...]]] = {
    "none": [()] * 4,
    "zero": [("zero",)] * 4,
    "none1zero3": [()] + [("zero",)] * 3,
    "none2zero2": [()] * 2 + [("zero",)] * 2,
    "none3zero1": [()] * 3 + [("zero",)],
    "halves": _Q,
    "corners": [("up", "left"), ("up", "right"), ("down", "left"), ("down", "right")],
    "triangles": [("tri_up",), ("tri_down",), ("tri_left",), ("tri_right",)],
    "diagonals": [("diag_up_right",), ("diag_up_left",), ("diag_down_right",), ("diag_down_left",)],
    "eighths1": [("tri_up", "left"), ("tri_down", "left"), ("tri_left", "up"), ("tri_right", "up")],
    "eighths2": [("tri_up", "right"), ("tri_down", "right"), ("tri_left", "down"), ("tri_right", "down")],
    "zerohalves": [("zero", *d) for d in _Q],
    "zerocorners": [
        ("zero", "up", "left"),
        ("zero", "up", "right"),
        ("zero", "down", "left"),
        ("zero", "down", "right"),
    ],
    "zerotriangles": [("zero", "tri_up"), ("zero", "tri_down"), ("zero", "tri_left"), ("zero", "tri_right")],
}
_NONE_SLOPES = (0.25, 0.0625, 0.015625, 0.00390625)
_OFFICIAL = {  # (parts, heads) -> repeats of each part's 4 directions, as the official code assigns them
    (2, 12): (2, 1),
    (2, 16): (2, 2),
    (3, 12): (1, 1, 1),
    (3, 16): (2, 1, 1),
    (4, 16): (1, 1, 1, 1),
}
DISTANCES = ("linear", "sqrt", "square")


def head_assignment(head_directions: str, heads: int) -> tuple[list[str], list[tuple[str, ...]]]:
    """(part name, directions) of every head for a name like 'halves-diagonals-none'."""
    parts = head_directions.split("-")
    unknown = [p for p in parts if p not in PART_DIRECTIONS]
    if unknown:
        raise ValueError(
            f"unknown LookHere parts {unknown} in {head_directions!r}; choose from {sorted(PART_DIRECTIONS)}"
        )
    if heads == 6 and len(parts) >= 2:
        repeats = None
        names, dirs = [parts[0]] * 4 + [parts[1]] * 2, PART_DIRECTIONS[parts[0]] + PART_DIRECTIONS[parts[1]][:2]
    elif len(parts) == 1 and heads % 4 == 0:
        repeats = (heads // 4,)
    else:
        repeats = _OFFICIAL.get((len(parts), heads))
    if repeats is not None:
        names = [p for p, r in zip(parts, repeats) for _ in range(4 * r)]
        dirs = [d for p, r in zip(parts, repeats) for d in PART_DIRECTIONS[p] * r]
    elif not (heads == 6 and len(parts) >= 2):  # ours: the parts' directions in order, cycling, the first H
        names = [parts[(k // 4) % len(parts)] for k in range(heads)]
        dirs = [PART_DIRECTIONS[n][k % 4] for k, n in enumerate(names)]
    return names, dirs


def head_slopes(names: list[str]) -> list[float]:
    """One slope per head from the runs of equal part names (see the module docstring)."""
    out = []
    for name, run in groupby(names):
        n = len(list(run))
        if "zero" in name or "none" in name:
            out += [_NONE_SLOPES[k] if n <= 4 else _NONE_SLOPES[4 * k // n] for k in range(n)]
        else:
            out += [2.0 ** -(1 + k // 4) for k in range(n)]
    return out


def layer_slopes(first: float, last: float, depth: int) -> list[float]:
    """numpy.linspace(first, last, depth) in float64, element for element (start + i * step, the end exact)."""
    if depth == 1:
        return [float(first)]
    step = (last - first) / (depth - 1)
    return [i * step + first for i in range(depth - 1)] + [float(last)]


def _mask(direction: str, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """True where `direction` hides the key (offset (u, v) from the query, y downward)."""
    if direction.startswith("diag_"):
        _, a, b = direction.split("_")
        return _mask(f"tri_{a}", u, v) & _mask(f"tri_{b}", u, v)
    if direction == "up":
        return v > 0
    if direction == "down":
        return v < 0
    if direction == "left":
        return u > 0
    if direction == "right":
        return u < 0
    rising, falling = u - v, u + v  # the two diagonals through the query
    cone = {
        "tri_up": (rising >= 0) & (falling <= 0),
        "tri_down": (rising <= 0) & (falling >= 0),
        "tri_right": (rising >= 0) & (falling >= 0),
        "tri_left": (rising <= 0) & (falling <= 0),
    }[direction]
    return ~cone


class LookHere(OffsetBiasPE):
    """LookHere's directional, distance-penalising attention bias (see the module docstring). Defaults: LH-180."""

    cache_layout = False  # a table per layer: only the small [H, L_y, L_x] tables are kept, P is laid out per call

    def __init__(
        self,
        host,
        head_directions: str = "halves-diagonals-none",
        global_slope: float = 2.0,
        layer_slopes: tuple[float, float] = (1.5, 0.5),
        distance: str = "linear",
    ):
        super().__init__(host)
        if distance not in DISTANCES:
            raise ValueError(f"LookHere distance must be one of {DISTANCES}, got {distance!r}")
        if len(layer_slopes) != 2:
            raise ValueError(f"layer_slopes must be (first layer, last layer), got {layer_slopes!r}")
        self.head_directions, self.distance = head_directions, distance
        self.global_slope, self.layer_range = float(global_slope), (float(layer_slopes[0]), float(layer_slopes[1]))
        self.slope_depth = host.depth  # the built depth: pruning layers (keep_layers) leaves each kept layer's slope
        self._heads = {}
        for h in sorted({spec.num_heads for spec in host.layers}):
            names, dirs = head_assignment(head_directions, h)
            self._heads[h] = (dirs, head_slopes(names))

    def layer_slope(self, i: int) -> float:
        """global_slope x layer_slope_i (float64, in the official order)."""
        return self.global_slope * layer_slopes(*self.layer_range, self.slope_depth)[i]

    def table_key(self, i):
        return (i, self.head_directions, self.global_slope, self.layer_range, self.distance, self.slope_depth)

    def offset_fn(self, i, q, kv):
        dirs, slopes = self._heads[self.heads(i)]
        scale = self.layer_slope(i)

        def fn(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            d = (u * u + v * v).sqrt()
            d = d.sqrt() if self.distance == "sqrt" else d * d if self.distance == "square" else d
            heads = []
            for directions, slope in zip(dirs, slopes):
                dh = torch.zeros_like(d) if "zero" in directions else d
                hidden = [_mask(x, u, v) for x in directions if x != "zero"]
                if hidden:
                    dh = dh.masked_fill(torch.stack(hidden).any(0), float("inf"))
                heads.append(slope * dh)
            out = scale * torch.stack(heads)  # float64, as the official (g * l) * (h * d)
            out = torch.nan_to_num(out, posinf=torch.finfo(torch.bfloat16).max)
            return -(out.to(torch.bfloat16).float())

        return fn
