"""2D ALiBi (CROMA) and 2D FIRE, and the route every offset bias takes through attention (row blocks, caches)."""

from __future__ import annotations

import itertools
import math

import pytest
import timm
import torch

import visionpe  # noqa: F401
import visionpe.attention.backends as attention
from visionpe.attention.backends import attn_backend
from visionpe.attention.rows import RowBias
from visionpe.layout.tokens import TokenLayout, cell_centre_layout, image_layout, window_layout
from visionpe.pos import AttnSpec, PEHost, build_pos_encoding
from visionpe.pos.alibi2d import ALiBi2D, alibi_slopes
from visionpe.pos.fire2d import FIRE2D
from visionpe.pos.table_cache import invalidate_tables


def _host(heads=4, grid=(4, 4), prefix=1, depth=1, windows=None):
    return PEHost(dim=8 * heads, grid=grid, num_prefix=prefix, layers=(AttnSpec(8 * heads, heads, 8, windows),) * depth)


def _bias(pe, layout, kv=None, i=0):
    q = torch.zeros(1, pe.heads(i), layout.num_tokens, 8)
    return pe.context(i, layout, kv).bias(q, q)[0]


# ------------------------------------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_are_alibis_with_the_interleave():
    # start * start^i as ALiBi computes them: within an ulp or two of the powers of two
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-0.5 * (h + 1)) for h in range(16)], rel=1e-15)  # 2^-.5 .. 2^-8
    assert alibi_slopes(8) == pytest.approx([2.0 ** -(h + 1) for h in range(8)], rel=1e-15)
    twelve = [2.0 ** -(h + 1) for h in range(8)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx(twelve, rel=1e-15)
    assert alibi_slopes(6) == pytest.approx([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3], rel=1e-15)


def _croma(heads: int, gy: int, gx: int) -> torch.Tensor:
    """CROMA's get_2dalibi, written from its definition (fp32 slopes times a Python-float distance), extended from
    its square grid to gy x gx: [H, N, N]."""
    slopes = torch.tensor(alibi_slopes(heads), dtype=torch.float32)[:, None]
    points = list(itertools.product(range(gy), range(gx)))  # (row, col), row-major
    cols = [math.sqrt((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) * slopes * -1 for a in points for b in points]
    return torch.cat(cols, dim=1).view(heads, len(points), len(points))


@pytest.mark.parametrize("heads, grid", [(16, (5, 5)), (12, (4, 4)), (6, (3, 5)), (3, (6, 2))])
def test_alibi_equals_cromas_bias(heads, grid):
    pe = ALiBi2D(_host(heads))
    b = _bias(pe, image_layout(*grid, 1))
    assert torch.equal(b[:, 1:, 1:], _croma(heads, *grid))
    assert (b[:, 0] == 0).all() and (b[:, :, 0] == 0).all()  # prefix tokens unbiased


def test_alibi_properties():
    pe = ALiBi2D(_host(4))
    b = _bias(pe, image_layout(5, 6, 0))
    assert torch.equal(b, b.transpose(-1, -2))  # symmetric
    s = alibi_slopes(4)
    # neighbours: along an axis -s, along a diagonal -s sqrt(2) (fp32)
    assert b[0, 0, 1].item() == pytest.approx(-s[0], rel=1e-7) and b[0, 0, 7].item() == pytest.approx(-s[0] * 2**0.5)
    row = _bias(pe, image_layout(1, 7, 0))  # a one-row grid is 1D ALiBi
    i = torch.arange(7.0)
    want = -torch.tensor(s)[:, None, None] * (i[:, None] - i[None, :]).abs()
    torch.testing.assert_close(row, want, rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------------------- FIRE


def _fire(heads=4, grid=(6, 6)):
    pe = FIRE2D(_host(heads, grid))
    torch.manual_seed(0)
    pe.init_weights()
    return pe


def test_fire_definition_and_symmetry():
    pe = _fire()
    stage = pe.stages[0]
    assert stage.init_L.item() == pytest.approx(5 * 2**0.5) and stage.c.item() == pytest.approx(0.1)
    layout = image_layout(4, 5, 1)
    b = _bias(pe, layout)
    assert torch.equal(b[:, 1:, 1:], b[:, 1:, 1:].transpose(-1, -2)) and (b[:, 0] == 0).all()
    # one pair by hand: (0, 0) -> (x, y) = (4, 3), d = 5; the grid's diagonal 5 < L = 5 sqrt(2)
    c, big_l = 0.1, 5 * 2**0.5
    x = math.log(c * 5 + 1) / (math.log(c * big_l + 1) + 1e-6)
    want = stage.mlp(torch.tensor([[x]], dtype=torch.float32))[0]
    torch.testing.assert_close(b[:, 1, 1 + 3 * 5 + 4], want, rtol=1e-6, atol=1e-7)


def test_fire_inputs_stay_in_0_1_at_any_grid():
    pe = _fire()
    seen = []
    pe.stages[0].mlp[0].register_forward_hook(lambda m, args, out: seen.append(args[0]))
    for grid in ((3, 3), (6, 6), (20, 13)):  # smaller than, equal to and larger than the reference grid
        seen.clear()
        _bias(pe, image_layout(*grid, 1))
        x = torch.cat([s.flatten() for s in seen])
        assert x.min() >= 0 and x.max() <= 1
        if grid != (3, 3):  # the normaliser is the grid's diagonal: the farthest pair reaches 1 (up to eps)
            assert x.max().item() == pytest.approx(1.0, abs=1e-5)


def test_fire_c_changes_the_bias_and_gradients_reach_c_l_and_the_mlp():
    pe = _fire().train()
    layout = image_layout(3, 4, 1)  # its diagonal (3.6) is under L (7.1): L is the normaliser
    b = _bias(pe, layout)
    b.square().sum().backward()
    stage = pe.stages[0]
    for p in (stage.c, stage.L_multiplier, stage.mlp[0].weight, stage.mlp[2].weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    with torch.no_grad():
        stage.c.fill_(0.5)
        assert (_bias(pe, layout) - b).abs().max() > 1e-4


def test_fire_eval_cache_follows_parameter_updates():
    pe = _fire().eval()
    layout = image_layout(5, 5, 1)
    with torch.no_grad():
        b0 = _bias(pe, layout)
        cached = pe._tables.tables()  # the table, its layout and (a small grid) the whole bias
        assert torch.equal(_bias(pe, layout), b0) and {id(t) for t in pe._tables.tables()} == {id(t) for t in cached}
        assert len(pe._tables) == len(cached) == 3
        pe.stages[0].mlp[2].bias.add_(1.0)  # an optimiser step or load_state_dict changes the version
        torch.testing.assert_close(_bias(pe, layout)[:, 1:, 1:], b0[:, 1:, 1:] + 1.0)
        pe.stages[0].mlp[2].bias.data.sub_(1.0)  # a write the version counter misses (FSDP's all-gather)...
        invalidate_tables(pe, learned_only=True)  # ...is seen after the training that made it (the model's switch)
        torch.testing.assert_close(_bias(pe, layout), b0)


def test_fire_is_one_mlp_per_stage_and_builds_on_meta():
    with torch.device("meta"):
        pe = build_pos_encoding("fire2d", _host(4, depth=3)).encodings["fire2d"]
    assert sorted(pe.state_dict()) == [
        "stages.0.L_multiplier",
        "stages.0.c",
        "stages.0.init_L",
        "stages.0.mlp.0.bias",
        "stages.0.mlp.0.weight",
        "stages.0.mlp.2.bias",
        "stages.0.mlp.2.weight",
    ]
    pe = pe.to_empty(device="cpu")
    pe.init_non_persistent_buffers()
    pe.init_weights()
    assert (
        pe.stages[0].init_L.item() == pytest.approx(3 * 2**0.5)
        and torch.isfinite(_bias(pe, image_layout(2, 3, 1))).all()
    )
    swin = timm.create_model("swin_n_fire2d")
    assert len(swin.pe.encodings["fire2d"].stages) == len(swin.stage_starts)


# -------------------------------------------------------------------------------------------- the common route


def _kinds():
    return [
        ALiBi2D(_host(3)),
        _fire(3),
        build_pos_encoding("lookhere_90", _host(6, depth=2)).encodings["lookhere"],
    ]


LAYOUTS = {
    "vit": (image_layout(5, 7, 1), None),
    "swin-window": (window_layout(4, 4), None),
    "cvt-strided-keys": (image_layout(6, 8, 1), cell_centre_layout(3, 4, 2, 1)),
    "interpolated": (image_layout(6, 4, 1).with_pos(image_layout(6, 4).pos * 0.75), None),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_row_blocks_equal_the_whole_bias_and_the_direct_route(name):
    layout, kv = LAYOUTS[name]
    kv_ = layout if kv is None else kv
    for pe in _kinds():
        whole = _bias(pe, layout, kv)
        ctx_bias = pe.context(0, layout, kv).bias
        assert isinstance(ctx_bias, RowBias) and ctx_bias.plan is not None, "the grid route applies"
        q = torch.zeros(1, pe.heads(0), layout.num_tokens, 8)
        state = ctx_bias.prepare(q, q)
        for step in (1, 3, 7):
            rows = [
                ctx_bias.rows(state, s, min(s + step, layout.num_tokens)) for s in range(0, layout.num_tokens, step)
            ]
            assert torch.equal(torch.cat(rows, dim=2)[0], whole)
        direct = _bias(pe, TokenLayout(layout.num_prefix, None, layout.pos), TokenLayout(kv_.num_prefix, None, kv_.pos))
        # the same f on the same float64 offsets (interpolated lattices: offsets rebuilt from origin and step)
        torch.testing.assert_close(direct, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "model_name", ["vit_n_alibi2d", "vit_n_lookhere", "vit_n_fire2d", "swin_n_alibi2d", "cvt_n_fire2d"]
)
def test_backends_agree_and_gradients_flow(model_name, monkeypatch):
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10).eval()  # eval: no drop path (and FIRE's cached tables)
    x = torch.randn(2, 3, 40, 48)
    with attn_backend("math"), torch.no_grad():
        ref = model(x)
    monkeypatch.setattr(attention, "ROW_BLOCK_ELEMENTS", 2 * 4 * 40)  # several row blocks per layer
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)  # fp32 softmax over <= 121 keys, two kernels
    model.train()(x).square().sum().backward()
    if "fire" in model_name:
        assert model.pe.encodings["fire2d"].stages[0].c.grad.abs() > 0
