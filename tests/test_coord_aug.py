"""Coordinate augmentation (DINOv3's shift / jitter / rescale) as drawn by the official code (timm's port draws the
same numbers in the same order), its statistics, and its place in every rotary PE: fresh in training, off in eval."""

import math

import pytest
import torch
from timm.layers.pos_embed_sincos import _apply_coord_augs

from visionpe.layout.tokens import cell_centre_layout, image_layout
from visionpe.pos import AttnSpec, PEHost, RoPE2D
from visionpe.pos.coord_aug import CoordAugment, augment_coords
from visionpe.pos.lie_rope import COMROPE_CENTRE, LieRoPE, apply_block_rotation
from visionpe.pos.rope2d_dinov3 import RoPE2DDinoV3, dinov3_coords


@pytest.mark.parametrize(
    "opts", [dict(shift=0.3), dict(jitter=1.5), dict(rescale=2.0), dict(shift=0.2, jitter=1.3, rescale=2.0)]
)
def test_draws_equal_the_official_order(opts):
    coords = dinov3_coords(5, 7)
    torch.manual_seed(3)
    ours = augment_coords(coords, **opts)
    torch.manual_seed(3)
    ref = _apply_coord_augs(coords, opts.get("shift"), opts.get("jitter"), opts.get("rescale"))
    assert torch.equal(ours, ref)  # the same draws and the same operations: bit-identical


def test_shift_is_one_constant_per_axis_and_rescale_one_factor_in_range():
    pos = image_layout(4, 6).pos
    g = torch.Generator().manual_seed(0)
    shifts, factors = [], []
    for _ in range(400):
        d = augment_coords(pos, shift=0.5, generator=g) - pos
        assert torch.allclose(d, d[:1].expand_as(d), rtol=0, atol=1e-6)  # the same shift for every token
        shifts.append(d[0])
        r = augment_coords(pos + 1, rescale=2.0, generator=g) / (pos + 1)
        assert torch.allclose(r, r[:1, :1].expand_as(r), rtol=1e-6, atol=0)  # one factor, both axes
        factors.append(r[0, 0].item())
    shifts = torch.stack(shifts)
    assert shifts.abs().max() <= 0.5 and shifts.abs().max() > 0.45 and shifts.std(0).min() > 0.2  # U(-.5, .5)
    logs = torch.tensor(factors).log()  # log-uniform in [-ln 2, ln 2]: mean 0, std ln2 / sqrt 3 = 0.40
    assert logs.abs().max() <= math.log(2) + 1e-6 and logs.abs().max() > 0.9 * math.log(2)
    assert abs(logs.mean().item()) < 0.08 and abs(logs.std().item() - math.log(2) / math.sqrt(3)) < 0.05
    j = augment_coords(pos + 1, jitter=3.0, generator=g) / (pos + 1)
    assert (j[:, 0] - j[0, 0]).abs().max() < 1e-6 and (j[0, 0] - j[0, 1]).abs() > 1e-3  # per axis, not shared


def _host(head_dim=16):
    return PEHost(dim=2 * head_dim, grid=(4, 4), num_prefix=1, layers=(AttnSpec(2 * head_dim, 2, head_dim),) * 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: RoPE2D(_host(), mode="axial", **kw),
        lambda **kw: RoPE2D(_host(), mode="mixed", **kw),
        lambda **kw: RoPE2DDinoV3(_host(), **kw),
    ],
    ids=["rope2d", "rope2d_mixed", "rope2d_dinov3"],
)
def test_every_rotary_pe_draws_in_training_and_is_deterministic_in_eval(make):
    plain, aug = make(), make(rescale_coords=2.0, shift_coords=0.1)
    aug.load_state_dict(plain.state_dict())
    own = plain.layer(0)  # layer 0's own state (RoPE-Mixed's frequencies), the same for both
    lay = image_layout(4, 5, 1)
    q = torch.randn(1, 2, lay.num_tokens, 16)

    def rotated(pe):
        return pe.context(0, lay, None, own).rotate(q, q)[0]

    aug.train()
    a, b = rotated(aug), rotated(aug)
    assert (a - b).abs().max() > 1e-3  # a fresh draw per call
    assert torch.equal(a[:, :, :1], q[:, :, :1])  # the prefix is never rotated
    aug.eval(), plain.eval()
    assert torch.equal(rotated(aug), rotated(aug)) and torch.equal(rotated(aug), rotated(plain))  # off in eval


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: RoPE2D(_host(), mode="axial", **kw),
        lambda **kw: RoPE2D(_host(), mode="mixed", **kw),
        lambda **kw: RoPE2DDinoV3(_host(), **kw),
    ],
    ids=["rope2d", "rope2d_mixed", "rope2d_dinov3"],
)
def test_queries_and_strided_keys_share_one_draw(make):
    """CvT's keys sit on a stride-2 grid in the queries' frame. A shift moves both sides alike, so the attention
    scores of a relative RoPE stay those of eval; separate draws for queries and keys would move them."""
    plain, aug = make(), make(shift_coords=3.0)
    aug.load_state_dict(plain.state_dict())
    own = plain.layer(0)  # layer 0's own state (RoPE-Mixed's frequencies), the same for both
    q_lay, kv_lay = image_layout(4, 4, 1), cell_centre_layout(2, 2, 2, 1)
    q, k = torch.randn(1, 2, q_lay.num_tokens, 16), torch.randn(1, 2, kv_lay.num_tokens, 16)

    def scores(pe):
        rq, rk = pe.context(0, q_lay, kv_lay, own).rotate(q, k)
        return (rq @ rk.transpose(-1, -2))[..., 1:, 1:]  # patches to patches (the unrotated CLS sees the shift)

    plain.eval(), aug.train()
    torch.manual_seed(0)
    ref, got = scores(plain), scores(aug)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()  # fp32 rotations: ~3e-7 relative measured
    moved = aug.context(0, q_lay, None, own).rotate(q, q)[0] - plain.context(0, q_lay, None, own).rotate(q, q)[0]
    assert moved.abs().max() > 1e-2


@pytest.mark.parametrize("variant", ["liere", "comrope_ap", "comrope_ld"])
def test_lie_rope_rotates_at_the_augmented_coordinates_in_training_only(variant):
    opts = dict(shift_coords=0.2, jitter_coords=1.3, rescale_coords=2.0)
    plain, aug = LieRoPE(_host(), variant=variant), LieRoPE(_host(), variant=variant, **opts)
    aug.load_state_dict(plain.state_dict())
    own = plain.layer(0)  # layer 0's generators, the same for both
    lay = image_layout(4, 5, 1)
    aug.train()
    torch.manual_seed(5)
    rot = aug.context(0, lay, None, own).rotate  # one draw for this layer
    q = torch.randn(1, 2, lay.num_tokens, 16)
    torch.manual_seed(5)  # the same draws by hand: patches (and ComRoPE's centre) augmented together, (y, x) order
    coords = torch.cat([plain.coordinates(0, lay), torch.full((1, 2), COMROPE_CENTRE)])
    drawn = augment_coords(coords, 0.2, 1.3, 2.0)
    prefix = drawn[-1:] if variant != "liere" else torch.zeros(1, 2)  # LieRE's prefix: the identity
    expect = plain.rotations(0, own, lay, coords=torch.cat([prefix, drawn[:-1]]))
    got_q, got_k = rot(q, q)
    assert torch.allclose(got_q, apply_block_rotation(q, expect), atol=1e-5) and torch.equal(got_q, got_k)
    assert (got_q - plain.context(0, lay, None, own).rotate(q, q)[0]).abs().max() > 1e-2  # the draw moved the rotations
    if variant == "liere":
        assert torch.equal(got_q[:, :, :1], q[:, :, :1])
    kv = image_layout(4, 5, 1)  # keys on their own layout (as CvT's): the same draw as the queries
    a_q, a_k = aug.context(0, lay, kv, own).rotate(q, q)
    assert torch.equal(a_q, a_k)
    aug.eval(), plain.eval()
    with torch.no_grad():
        off = aug.context(0, lay, None, own).rotate(q, q)[0], plain.context(0, lay, None, own).rotate(q, q)[0]
        assert torch.equal(*off)  # off in eval


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="jitter_coords must be a finite number >= 1"):
        CoordAugment(jitter=0.9)
    with pytest.raises(ValueError, match="shift_coords"):
        RoPE2D(_host(), shift_coords=-1.0)
    with pytest.raises(ValueError, match="rescale_coords"):
        LieRoPE(_host(), variant="comrope_ap", rescale_coords=0.5)
    assert not CoordAugment().active and CoordAugment(rescale=2).active
