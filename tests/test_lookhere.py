"""LookHere: equality with an independent reference written from the official `create_lh_bias_tensor`
(GreenCUBIC/lookhere: numpy, per-patch triangles from np.tri, float64 then bfloat16), and the masks' properties."""

from __future__ import annotations

from itertools import groupby

import numpy as np
import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.layout.tokens import TokenLayout, image_layout
from visionpe.pos import AttnSpec, PEHost, build_pos_encoding
from visionpe.pos.lookhere import LookHere
from visionpe.zoo.vit_family import VIT_SIZES

BF16_MAX = torch.finfo(torch.bfloat16).max

# ------------------------------------------------------------------------------------ the reference (official rules)

_PARTS = {
    "none": [[]] * 4,
    "halves": [["up"], ["down"], ["left"], ["right"]],
    "corners": [["up", "left"], ["up", "right"], ["down", "left"], ["down", "right"]],
    "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
    "diagonals": [["diag_up_right"], ["diag_up_left"], ["diag_down_right"], ["diag_down_left"]],
    "eighths1": [["tri_up", "left"], ["tri_down", "left"], ["tri_left", "up"], ["tri_right", "up"]],
    "eighths2": [["tri_up", "right"], ["tri_down", "right"], ["tri_left", "down"], ["tri_right", "down"]],
}


def _official_heads(config: str, heads: int):
    sh = config.split("-")
    d = [_PARTS[s] for s in sh]
    if heads == 6:  # the official if / elif chain on (parts, heads)
        names, dirs = [sh[0]] * 4 + [sh[1]] * 2, d[0] + d[1][:2]
    elif len(sh) == 2 and heads == 12:
        names, dirs = [sh[0]] * 8 + [sh[1]] * 4, d[0] * 2 + d[1]
    elif len(sh) == 2 and heads == 16:
        names, dirs = [sh[0]] * 8 + [sh[1]] * 8, d[0] * 2 + d[1] * 2
    elif len(sh) == 3 and heads == 12:
        names, dirs = [sh[0]] * 4 + [sh[1]] * 4 + [sh[2]] * 4, d[0] + d[1] + d[2]
    else:
        assert len(sh) == 3 and heads == 16
        names, dirs = [sh[0]] * 8 + [sh[1]] * 4 + [sh[2]] * 4, d[0] * 2 + d[1] + d[2]
    slopes = []
    for name, run in groupby(names):
        n = len(list(run))
        if name == "none":
            base = [0.25, 0.0625, 0.015625, 0.00390625]
            slopes.append(base[:2] if n == 2 else base if n == 4 else np.repeat(base, n // 4))
        else:
            slopes.append(np.repeat(np.exp2(-np.arange(1, n / 4 + 1)), 4))
    return dirs, np.concatenate(slopes)


def _official_masks(gy: int, gx: int) -> tuple[np.ndarray, dict]:
    """coords [N, 2] as (x, y) and the official hidden-key masks [N, N] of every direction."""
    locs = np.meshgrid(range(gx), range(gy))
    coords = np.stack(locs, axis=-1).reshape(-1, 2)
    n = len(coords)
    masks = {
        "right": np.array([[k[0] < q[0] for k in coords] for q in coords]),
        "left": np.array([[k[0] > q[0] for k in coords] for q in coords]),
        "up": np.array([[k[1] > q[1] for k in coords] for q in coords]),
        "down": np.array([[k[1] < q[1] for k in coords] for q in coords]),
    }
    # the diagonal labels, read off np.diag of the grid and of its mirror image, as the official code does
    label_ud, label_lr = {}, {}
    for i in range(-max(gx, gy) + 1, max(gx, gy)):
        for x, y in zip(np.diag(locs[0], i), np.diag(locs[1], i)):
            label_ud[(x, y)] = i
        for x, y in zip(np.diag(np.fliplr(locs[0]), i), np.diag(np.fliplr(locs[1]), i)):
            label_lr[(x, y)] = i
    tri = {k: np.ones((n, n), dtype=bool) for k in ("up", "down", "left", "right")}
    for i, (x, y) in enumerate(coords):
        dp, dn = label_ud[(x, y)], label_lr[(x, y)]
        trid = np.tri(gy, gx, k=dp, dtype=bool)
        triu = ~np.tri(gy, gx, k=dp - 1, dtype=bool)
        trir = np.fliplr(np.tri(gy, gx, k=dn, dtype=bool))
        tril = ~np.fliplr(np.tri(gy, gx, k=dn - 1, dtype=bool))
        tri["up"][i] = ~(triu & tril).flatten()
        tri["down"][i] = ~(trid & trir).flatten()
        tri["right"][i] = ~(triu & trir).flatten()
        tri["left"][i] = ~(trid & tril).flatten()
    for k, m in tri.items():
        masks[f"tri_{k}"] = m
    for a in ("up", "down"):
        for b in ("left", "right"):
            masks[f"diag_{a}_{b}"] = tri[a] & tri[b]
    return coords, masks


def reference(config: str, grid: tuple[int, int], depth: int, heads: int, g=2.0, ls=(1.5, 0.5)) -> torch.Tensor:
    """[depth, heads, N + 1, N + 1] float32 holding bf16 values, CLS row and column zero."""
    dirs, slopes = _official_heads(config, heads)
    coords, masks = _official_masks(*grid)
    dist = np.sqrt(((coords[:, None, :] - coords[None, :, :]) ** 2).sum(-1).astype(np.float64))
    lh = np.tile(dist, (heads, 1, 1))
    for h in range(heads):
        hidden = np.zeros_like(dist, dtype=bool)
        for direction in dirs[h]:
            hidden |= masks[direction]
        lh[h, hidden] = np.inf
    lh = slopes[:, None, None] * lh
    layer = np.linspace(ls[0], ls[1], depth)[:, None, None, None]
    lh = np.nan_to_num(g * layer * lh, posinf=BF16_MAX)
    lh = torch.tensor(lh, dtype=torch.bfloat16) * -1.0
    return torch.nn.functional.pad(lh.float(), (1, 0, 1, 0))


# ------------------------------------------------------------------------------------------------------- ours


def _pe(config: str, heads: int, depth: int, grid=(14, 14)) -> LookHere:
    host = PEHost(dim=heads * 8, grid=grid, num_prefix=1, layers=(AttnSpec(heads * 8, heads, 8),) * depth)
    return LookHere(host, head_directions=config, global_slope=2.0, layer_slopes=(1.5, 0.5))


def _bias(pe: LookHere, i: int, layout: TokenLayout) -> torch.Tensor:
    q = torch.zeros(1, pe.heads(i), layout.num_tokens, 8)
    return pe.context(i, layout).bias(q, q)[0]


CASES = [
    ("halves-diagonals-none", 12),
    ("corners-triangles-none", 12),
    ("eighths1-eighths2-none", 12),
    ("eighths1-eighths2-none", 16),
    ("corners-triangles-none", 16),
    ("halves-none", 6),  # 6 heads: the official code takes 4 + 2 heads; its slopes only work with 'none' second
    ("triangles-none", 6),
    ("halves-diagonals", 12),
]


@pytest.mark.parametrize("config, heads", CASES)
@pytest.mark.parametrize("grid", [(7, 7), (4, 6), (5, 3)])
def test_equals_the_official_bias_bit_for_bit(config, heads, grid):
    depth = 3
    want = reference(config, grid, depth, heads)
    pe = _pe(config, heads, depth)
    layout = image_layout(*grid, 1)
    for i in range(depth):
        assert torch.equal(_bias(pe, i, layout), want[i]), (config, heads, grid, i)
    # the direct route (a layout without a grid: f evaluated per pair) gives the same bits
    loose = TokenLayout(1, None, layout.pos)
    assert torch.equal(_bias(pe, depth - 1, loose), want[-1])


def test_depth_12_layer_slopes_and_the_masked_value():
    want = reference("halves-diagonals-none", (4, 5), 12, 12)
    pe = _pe("halves-diagonals-none", 12, 12)
    for i in (0, 5, 11):
        b = _bias(pe, i, image_layout(4, 5, 1))
        assert torch.equal(b, want[i])
    assert b.min().item() == -BF16_MAX  # masked: -bf16 max (-3.3895e38), not -inf
    assert (b[:, 0] == 0).all() and (b[:, :, 0] == 0).all()  # CLS row and column
    assert (b.diagonal(dim1=-2, dim2=-1) == 0).all()  # every query sees itself at distance 0
    # a visible entry is -(2 * 0.5 * slope * d) rounded to bf16: the 'none' head 8 (slope 1/4) at layer 11, d = 5
    d = 5.0  # (x, y) = (0, 0) -> (4, 3)
    assert b[8, 1, 1 + 3 * 5 + 4].item() == torch.tensor(-(2 * 0.5) * (0.25 * d)).bfloat16().item()


def _grid_part(b: torch.Tensor, gy: int, gx: int) -> torch.Tensor:
    return b[:, 1:, 1:].reshape(-1, gy, gx, gy, gx)


def test_masks_are_mirror_images():
    gy, gx = 5, 6
    b = _grid_part(_bias(_pe("halves-triangles-none", 12, 1), 0, image_layout(gy, gx, 1)), gy, gx)
    up, down, left, right = b[0], b[1], b[2], b[3]  # halves: up, down, left, right (one slope)
    assert torch.equal(up, down.flip(0, 2)) and torch.equal(left, right.flip(1, 3))
    tu, td, tl, tr = b[4], b[5], b[6], b[7]  # triangles
    assert torch.equal(tu, td.flip(0, 2)) and torch.equal(tl, tr.flip(1, 3))
    assert not torch.equal(up, down)


@pytest.mark.parametrize("config", ["halves-diagonals-none", "corners-triangles-none", "eighths1-eighths2-none"])
def test_translation_equivariance(config):
    gy, gx = 5, 7
    b = _bias(_pe(config, 12, 2), 1, image_layout(gy, gx, 1))[:, 1:, 1:]
    pos = image_layout(gy, gx).pos.long()
    u = pos[None, :, 0] - pos[:, None, 0]
    v = pos[None, :, 1] - pos[:, None, 1]
    offset = ((v + gy - 1) * (2 * gx - 1) + u + gx - 1).flatten()
    for h in range(12):
        vals = b[h].flatten()
        hi = torch.full((offset.max() + 1,), -float("inf")).scatter_reduce(0, offset, vals, "amax")
        lo = torch.full((offset.max() + 1,), float("inf")).scatter_reduce(0, offset, vals, "amin")
        seen = torch.isfinite(hi)
        assert torch.equal(hi[seen], lo[seen]), f"head {h}: B[q, k] depends on k - q only"


def _visible(config: str, head: int) -> set[tuple[int, int]]:
    """The offsets (u, v) a centre query on a 5 x 5 grid sees with `head`."""
    b = _bias(_pe(config, 12, 1), 0, image_layout(5, 5, 1))[head, 1 + 12, 1:]
    return {(j % 5 - 2, j // 5 - 2) for j in range(25) if b[j] > -BF16_MAX}


def test_fields_of_view_of_a_centre_query():
    cells = [(u, v) for v in range(-2, 3) for u in range(-2, 3)]
    assert _visible("halves-diagonals-none", 0) == {(u, v) for u, v in cells if v <= 0}  # up: a half-plane
    assert _visible("halves-diagonals-none", 3) == {(u, v) for u, v in cells if u >= 0}  # right
    assert _visible("halves-diagonals-none", 4) == {(u, v) for u, v in cells if u >= v}  # up-right half-plane
    assert _visible("corners-triangles-none", 1) == {(u, v) for u, v in cells if v <= 0 and u >= 0}  # up-right
    assert _visible("corners-triangles-none", 4) == {(u, v) for u, v in cells if abs(u) <= -v}  # 90-degree cone
    assert _visible("corners-triangles-none", 7) == {(u, v) for u, v in cells if abs(v) <= u}
    assert _visible("eighths1-eighths2-none", 0) == {(u, v) for u, v in cells if abs(u) <= -v and u <= 0}  # 45 deg
    assert len(_visible("eighths1-eighths2-none", 0)) == 6 and len(_visible("halves-diagonals-none", 4)) == 15
    assert len(_visible("halves-diagonals-none", 8)) == 25  # 'none': distance only


@pytest.mark.parametrize("size", ["n", "t", "s", "b", "l"])
def test_every_vit_size_is_registered_builds_on_meta_and_assigns_every_head(size):
    cfg = VIT_SIZES[size]
    heads, depth, dim = cfg["num_heads"], cfg["depth"], cfg["embed_dim"]
    host = PEHost(dim=dim, grid=(14, 14), num_prefix=1, layers=(AttnSpec(dim, heads, dim // heads),) * depth)
    for preset in ("lookhere", "lookhere_90", "lookhere_45"):
        assert f"vit_{size}_{preset}" in timm.list_models(f"vit_{size}_lookhere*")
        with torch.device("meta"):  # nothing is computed at construction
            pe = build_pos_encoding(preset, host).encodings["lookhere"]
        dirs, slopes = pe._heads[heads]
        assert len(dirs) == len(slopes) == heads and not list(pe.state_dict())  # no buffers, no parameters
        pe.init_non_persistent_buffers()  # nothing to rebuild: the tables are made from the layouts on demand
        b = _bias(pe, depth - 1, image_layout(3, 4, 1))
        assert b.shape == (heads, 13, 13) and b.device.type == "cpu"


def test_a_model_runs_at_other_grids_and_caches_its_tables():
    model = timm.create_model("vit_n_lookhere_45", num_classes=10).eval()
    pe = model.pe.encodings["lookhere"]
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        y = model(x)
        tables = pe._tables.tables()
        assert torch.equal(model(x), y) and len(tables) == 8  # per layer a table and the whole bias, reused
        assert {id(t) for t in pe._tables.tables()} == {id(t) for t in tables}
        assert model(torch.randn(1, 3, 48, 40)).shape == (1, 10)  # a non-square grid, same slopes


def test_pruning_keeps_each_kept_layers_slope():
    # timm's prune contract: the kept layers compute what they did (the slopes are a linspace over the built depth)
    model = timm.create_model("vit_n_lookhere", num_classes=10, depth=4).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        slopes = [model.pe.encodings["lookhere"].layer_slope(i) for i in (0, 1)]
        model.prune_intermediate_layers([0, 1])
        after = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert [model.pe.encodings["lookhere"].layer_slope(i) for i in (0, 1)] == slopes
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
