"""LieRE and ComRoPE (visionpe.pos.lie_rope): rotations equal to an independent reference written from the official
definitions, the group properties, the relative property of the commuting variants (and LieRE's lack of it), the
prefix rules, the block-axis assignment, the b = 2 reduction to axial RoPE, the eval cache and the meta build."""

import pytest
import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.tokens import cell_centre_layout, image_layout, video_layout, window_layout
from visionpe.pos import AttnSpec, PEHost
from visionpe.pos.lie_rope import LieRoPE, apply_block_rotation, commuting_exp
from visionpe.pos.rotary import apply_rotary, rotary_angles, rotary_cos_sin

EPS32 = torch.finfo(torch.float32).eps
VARIANTS = ("liere", "comrope_ap", "comrope_ld")


def _pe(variant, heads=2, head_dim=16, depth=2, grid=(4, 5), num_prefix=1, frames=1, **kw):
    host = PEHost(
        dim=heads * head_dim,
        grid=grid,
        num_prefix=num_prefix,
        layers=(AttnSpec(heads * head_dim, heads, head_dim),) * depth,
        frames=frames,
    )
    return LieRoPE(host, variant=variant, **kw)


def _own(pe):
    """Each layer's own module (`pe.layer(i)`, as a backbone keeps it in `blocks[i].attn.pos`)."""
    return [pe.layer(i) for i in range(pe.host.depth)]


def _exp_tol(gen: torch.Tensor) -> float:
    """fp32 matrix_exp (scaling and squaring) loses about b eps per unit of the generator's norm; entries of a
    rotation are at most 1, so this bounds the absolute error of one rotation (and of a product of two)."""
    b = gen.shape[-1]
    return 2 * b * EPS32 * (1.0 + float(torch.linalg.matrix_norm(gen.detach().double(), ord=2).max()))


def _reference(pe, own, coords64):
    """R [H, N, nb, b, b] in float64 from the official definitions (StanfordMIMI/LieRE rope_vit.py, Longin-Yu/ComRoPE
    model.py), given positions [N, A] (official axis order); own: the layer's module (`pe.layer(i)`)."""
    own = pe.shared if pe.layer0_generators else own
    p = own.generators.detach().double()
    if pe.variant == "liere":
        upper = torch.triu(p, 1)
        gens = upper - upper.transpose(-1, -2)  # [A, H, nb, b, b]
    else:
        skew = p - p.transpose(-1, -2)  # [H, nb, b, b]
        nb = p.shape[1]
        if pe.variant == "comrope_ap":
            w = torch.stack([torch.arange(nb) % pe.num_axes == a for a in range(pe.num_axes)]).double()
        else:
            w = own.multipliers.detach().double()  # [A, nb]
        gens = w[:, None, :, None, None] * skew[None]
    g = (coords64[None, :, None, :, None, None] * gens.permute(1, 2, 0, 3, 4)[:, None]).sum(3)  # [H, N, nb, b, b]
    return torch.matrix_exp(g), g


def _official_positions(variant, h, w, ref_h, ref_w):
    """(row, col) positions of an h x w grid, row-major: LieRE linspace(0, n / n_ref, n), ComRoPE (i + 0.5) / n_ref."""
    if variant == "liere":
        rows, cols = torch.linspace(0, h / ref_h, h, dtype=torch.float64), torch.linspace(0, w / ref_w, w).double()
    else:
        rows = (torch.arange(h, dtype=torch.float64) + 0.5) / ref_h
        cols = (torch.arange(w, dtype=torch.float64) + 0.5) / ref_w
    return torch.cartesian_prod(rows, cols)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("grid", [(4, 5), (8, 10), (3, 7)])
def test_rotations_equal_the_official_definition(variant, grid):
    pe = _pe(variant, grid=(4, 5), num_prefix=0)
    own = _own(pe)
    lay = image_layout(*grid)
    coords = _official_positions(variant, *grid, 4, 5)
    # positions: fp32 arithmetic on exact small integers vs float64, a few eps
    assert torch.allclose(pe.coordinates(1, lay).double(), coords, atol=8 * EPS32 * 3)
    expect, gen = _reference(pe, own[1], coords)
    assert torch.allclose(pe.rotations(1, own[1], lay).double(), expect, atol=_exp_tol(gen), rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rotations_are_orthogonal_with_determinant_one(variant):
    pe = _pe(variant)
    own = _own(pe)
    rot = pe.rotations(0, own[0], image_layout(6, 6, num_prefix=1)).double()
    _, gen = _reference(pe, own[0], pe.coordinates(0, image_layout(6, 6)).double())
    eye = torch.eye(rot.shape[-1], dtype=torch.float64)
    assert torch.allclose(rot.transpose(-1, -2) @ rot, eye, atol=2 * _exp_tol(gen), rtol=0)
    one = torch.ones((), dtype=torch.float64)
    assert torch.allclose(torch.linalg.det(rot), one, atol=rot.shape[-1] * 2 * _exp_tol(gen), rtol=0)  # b factors


def _relative_error(pe, x, y):
    """max |R(x)^T R(y) - R(y - x)| over heads and blocks, for positions x, y [N, A] in the PE's coordinates."""
    gens = pe.layer_generators(pe.layer(0)).detach()

    def rot(c):
        return torch.matrix_exp(torch.einsum("na,ahjkl->hnjkl", c, gens).contiguous())

    err = (rot(x).transpose(-1, -2) @ rot(y) - rot(y - x)).abs().max()
    g = torch.einsum("na,ahjkl->hnjkl", torch.cat([x, y]).abs(), gens.abs())
    return float(err), _exp_tol(g)


@pytest.mark.parametrize("variant", ["comrope_ap", "comrope_ld"])
def test_commuting_variants_are_relative(variant):
    pe = _pe(variant)
    x, y = torch.rand(64, 2), torch.rand(64, 2)
    err, tol = _relative_error(pe, x, y)
    assert err <= 3 * tol, (err, tol)  # three fp32 exponentials and a product


def test_liere_is_not_relative():
    err, tol = _relative_error(_pe("liere"), torch.rand(64, 2), torch.rand(64, 2))
    assert err > 0.1 and err > 1000 * tol  # non-commuting generators: an O(1) violation


@pytest.mark.parametrize("variant", VARIANTS)
def test_scores_are_shift_invariant_only_for_the_commuting_variants(variant):
    pe = _pe(variant, num_prefix=0)
    own = pe.layer(0)
    lay = image_layout(4, 5)
    moved = lay.with_pos(lay.pos + torch.tensor([3.0, 2.0]))  # every patch 3 right, 2 down
    q, k = torch.randn(2, 1, 2, lay.num_tokens, 16).unbind(0)

    def scores(layout):
        qr, kr = pe.context(0, layout, None, own).rotate(q, k)
        return qr @ kr.transpose(-1, -2)

    s0, s1 = scores(lay), scores(moved)
    scale = float(q.norm(dim=-1).max() * k.norm(dim=-1).max())
    gen = torch.einsum("na,ahjkl->hnjkl", pe.coordinates(0, moved).abs(), pe.layer_generators(own).abs())
    tol = 3 * _exp_tol(gen) * scale  # the rotations' error times |q| |k|
    if variant == "liere":
        assert (s0 - s1).abs().max() > 0.1 * scale
    else:
        assert (s0 - s1).abs().max() <= tol


def test_prefix_rules_identity_for_liere_and_the_centre_for_comrope():
    lay = image_layout(4, 5, num_prefix=2)
    liere = _pe("liere", num_prefix=2)
    own = liere.layer(0)
    assert torch.equal(liere.rotations(0, own, lay)[:, :2], torch.eye(8).expand(2, 2, 2, 8, 8))  # exp(0) is exact
    q = torch.randn(1, 2, lay.num_tokens, 16)
    out, _ = liere.context(0, lay, None, own).rotate(q, q)
    assert torch.equal(out[:, :, :2], q[:, :, :2])
    for variant in ("comrope_ap", "comrope_ld"):
        pe = _pe(variant, num_prefix=2)
        own = pe.layer(0)
        centre = torch.full((1, 2), 0.5, dtype=torch.float64)
        expect, gen = _reference(pe, own, centre)
        got = pe.rotations(0, own, lay)[:, :2].double()
        assert torch.allclose(got, expect.expand_as(got), atol=_exp_tol(gen), rtol=0)
        assert not torch.allclose(got, torch.eye(8, dtype=torch.float64).expand_as(got), atol=1e-2)


def test_comrope_ap_assigns_block_j_to_axis_j_mod_axes():
    pe = _pe("comrope_ap", head_dim=32, num_prefix=0)  # 4 blocks: y, x, y, x
    own = pe.layer(0)
    gens = pe.layer_generators(own)
    nonzero = gens.abs().flatten(-2).amax(-1).amax(1) > 0  # [A, nb]
    assert nonzero.tolist() == [[True, False, True, False], [False, True, False, True]]
    lay = image_layout(4, 5)
    rot = pe.rotations(0, own, lay).unflatten(1, (4, 5))  # [H, rows, cols, nb, b, b]
    assert torch.equal(rot[:, :, :, 0], rot[:, :, :1, 0].expand_as(rot[:, :, :, 0]))  # block 0 ignores x
    assert torch.equal(rot[:, :, :, 1], rot[:, :1, :, 1].expand_as(rot[:, :, :, 1]))  # block 1 ignores y


def test_comrope_ap_with_2x2_blocks_is_axial_rope_with_learned_frequencies():
    pe = _pe("comrope_ap", block_size=2, num_prefix=1)
    lay = image_layout(4, 5, num_prefix=1)
    own = pe.layer(0)
    p = own.generators.detach()  # [H, nb, 2, 2]
    s = p[..., 0, 1] - p[..., 1, 0]  # exp(x [[0, s], [-s, 0]]) turns a pair by -x s
    pairs = torch.arange(s.shape[-1])
    freqs = torch.zeros(2, *s.shape)  # [A (y, x), H, d/2]: pair j reads axis j % 2
    freqs[pairs % 2, :, pairs] = -s.t()
    coords = torch.cat([torch.full((1, 2), 0.5), pe.coordinates(0, lay)])  # the prefix token at the centre
    cos, sin = rotary_cos_sin(rotary_angles(coords, freqs))  # [H, P + N, d]
    q = torch.randn(3, 2, lay.num_tokens, 16)
    got = apply_block_rotation(q, pe.rotations(0, own, lay))
    assert torch.allclose(got, apply_rotary(q, cos, sin), atol=1e-5)  # fp32 exp vs fp32 cos/sin of the same angle


def test_eval_computes_rotations_once_per_layout_and_training_every_forward(monkeypatch):
    calls = []
    real = LieRoPE.rotations
    monkeypatch.setattr(LieRoPE, "rotations", lambda *a: calls.append(1) or real(*a))
    model = timm.create_model("vit_n_comrope_ld", depth=3).eval()
    calls.clear()  # the build's finite-numbers probe (visionpe.pos.probe) computed some
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        y0 = model(x)
        first = len(calls)
        y1 = model(x)
    assert first == 3 and len(calls) == first and torch.equal(y0, y1)
    with torch.no_grad():  # an optimizer step (an in-place update) invalidates the kept rotations
        model.blocks[1].attn.pos["lie_rope"].multipliers.mul_(2.0)
        y2 = model(x)
    assert len(calls) == first + 1 and not torch.allclose(y1, y2)
    with torch.no_grad():  # a write the version counter misses (`.data`, FSDP's all-gather into a reused buffer)...
        model.blocks[1].attn.pos["lie_rope"].multipliers.data.div_(2.0)
        model.train().eval()  # ...is seen after the training that made it
        torch.testing.assert_close(model(x), y1, rtol=1e-5, atol=1e-6)
    first = len(calls)
    model.train()
    model(x).sum().backward()
    model(x)
    assert len(calls) == first + 6
    assert model.blocks[2].attn.pos["lie_rope"].generators.grad.abs().sum() > 0


def test_the_commuting_exponential_and_its_gradient_equal_matrix_exp():
    p = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)  # ComRoPE's parameter, S = P - P^T
    coef = torch.rand(5, 3, dtype=torch.float64)
    weight = torch.randn(2, 5, 3, 8, 8, dtype=torch.float64)
    gen = coef[None, :, :, None, None] * (p - p.transpose(-1, -2))[:, None]
    slow = torch.matrix_exp(gen)
    p32 = p.detach().float().requires_grad_()
    fast = commuting_exp(coef.float(), p32 - p32.transpose(-1, -2))  # the fp32 (complex64) path
    assert torch.allclose(fast.double(), slow, atol=_exp_tol(gen), rtol=0)
    (g_slow,) = torch.autograd.grad((slow * weight).sum(), p)
    (g_fast,) = torch.autograd.grad((fast * weight.float()).sum(), p32)
    # through the eigenvectors a gradient loses ~eps / (eigenvalue gap) relative; gaps of random 8 x 8 skews: ~0.1 - 1
    assert torch.allclose(g_fast.double(), g_slow, atol=1e-5 * float(g_slow.abs().max()), rtol=0)


def test_liere_layer0_generators_reproduce_the_official_reuse():
    x = torch.randn(1, 3, 32, 32)
    official = timm.create_model("vit_n_liere", pe_kwargs={"layer0_generators": True})
    pe = official.pe.encodings["lie_rope"]
    lay = image_layout(8, 8, num_prefix=1)
    assert torch.equal(pe.rotations(0, None, lay), pe.rotations(3, None, lay))
    official(x).sum().backward()
    # layer 0's generators, held once at the model level, are the only LieRE parameters, and they learn
    names = [n for n, _ in official.named_parameters() if "lie_rope" in n]
    assert names == ["pe.encodings.lie_rope.shared.generators"] and pe.shared.generators.grad.abs().sum() > 0
    ours = timm.create_model("vit_n_liere")
    ours(x).sum().backward()
    pe = ours.pe.encodings["lie_rope"]
    own = [b.attn.pos["lie_rope"] for b in ours.blocks]
    assert not torch.allclose(pe.rotations(0, own[0], lay), pe.rotations(3, own[3], lay))
    assert all(o.generators.grad.abs().sum() > 0 for o in own)


def test_liere_positions_extend_past_one_beyond_the_reference_grid_and_interpolate_mode_keeps_them_in_range():
    model = timm.create_model("vit_n_liere")  # reference grid 8 x 8
    pe = model.pe.encodings["lie_rope"]
    big = model.layout((16, 16))
    assert torch.allclose(pe.coordinates(0, big).amax(0), torch.tensor([2.0, 2.0]))  # linspace(0, 16 / 8, 16)
    model.set_position_mode("interpolate")
    assert torch.allclose(pe.coordinates(0, model.layout((16, 16))).amax(0), torch.ones(2))


def test_window_video_and_strided_key_layouts():
    swin = _pe("comrope_ap", grid=(4, 4), num_prefix=0)  # a 4 x 4 window: (i + 0.5) / 4
    assert torch.allclose(swin.coordinates(0, window_layout(4, 4))[:5, 1], torch.tensor([1, 3, 5, 7, 1]) / 8)
    video = _pe("liere", grid=(4, 4), frames=3, num_axes=3, num_prefix=0)
    coords = video.coordinates(0, video_layout(3, 4, 4))  # (t, y, x), each linspace(0, 1, n) at the reference
    assert torch.allclose(coords[-1], torch.ones(3)) and torch.allclose(coords[16], torch.tensor([0.5, 0, 0]))
    q_lay, kv_lay = image_layout(8, 8, 1), cell_centre_layout(4, 4, 2, 1)  # keys at cell centres 0.5, 2.5, ...
    pe = _pe("liere", grid=(8, 8))
    kv = pe.coordinates(0, kv_lay, q_lay)
    assert torch.allclose(kv[:4, 1], torch.tensor([0.5, 2.5, 4.5, 6.5]) / 7)  # the query grid's linspace step


@pytest.mark.parametrize("variant", ["comrope_ap", "comrope_ld"])
def test_comrope_video_frames_follow_the_official_spatial_unit(variant):
    # the official get_positions: (t, y, x) integer indices, (p + 0.5) / n on every axis, n the spatial patch count
    pe = _pe(variant, grid=(4, 4), frames=2, num_axes=3, num_prefix=0)
    t, y, x = torch.meshgrid(torch.arange(2.0), torch.arange(4.0), torch.arange(4.0), indexing="ij")
    official = (torch.stack([t, y, x], -1).view(-1, 3) + 0.5) / 4
    torch.testing.assert_close(pe.coordinates(0, video_layout(2, 4, 4)), official, rtol=0, atol=0)
    clip = _pe(variant, grid=(4, 4), frames=2, num_axes=3, num_prefix=0, frame_norm="frames")  # the option
    assert torch.allclose(clip.coordinates(0, video_layout(2, 4, 4))[::16, 0], torch.tensor([0.25, 0.75]))
    with pytest.raises(ValueError, match="frame_norm must be one of spatial, frames"):
        _pe(variant, num_axes=3, frame_norm="clip")


@pytest.mark.parametrize("name", ["vit_n_liere", "vit_n_comrope_ap", "swin_n_comrope_ld", "vivit_n_comrope_ap"])
def test_builds_on_the_meta_device_and_rebuilds_its_buffers(name):
    fresh = timm.create_model(name).pe.encodings["lie_rope"]
    opts = dict(variant=fresh.variant, num_axes=fresh.num_axes)
    with torch.device("meta"):  # no value is read at construction
        pe = LieRoPE(fresh.host, **opts)
    pe.to_empty(device="cpu")
    pe.init_non_persistent_buffers()
    for key, buf in fresh.named_buffers():
        assert torch.equal(dict(pe.named_buffers())[key], buf)
    pe.init_weights()
    layout = image_layout(2, 2, 0) if opts["num_axes"] == 2 else video_layout(2, 2, 2)
    assert pe.rotations(0, pe.layer(0), layout).isfinite().all()


def test_bad_options_say_what_to_change():
    with pytest.raises(ValueError, match="choose one of liere"):
        _pe("comrope")
    with pytest.raises(ValueError, match="block_size"):
        _pe("liere", block_size=32)
    with pytest.raises(ValueError, match="num_axes to match"):
        _pe("liere").context(0, video_layout(2, 4, 5), None, None)
    with pytest.raises(ValueError, match="applies to variant 'liere'"):
        _pe("comrope_ap", layer0_generators=True)


def test_an_old_layer0_generators_state_dict_loads_with_unchanged_logits():
    # before each layer owned its state the official reuse kept every layer's generators (`generators.{i}`) and
    # read layer 0's; now layer 0's are the model-level `shared.generators` and the others are dropped
    from visionpe.zoo.checkpoint_filters import checked_filter
    from visionpe.zoo.family import FAMILIES

    kw = dict(pe_kwargs={"layer0_generators": True})
    model = timm.create_model("vit_n_liere", **kw).eval()
    old = {k: v for k, v in model.state_dict().items() if "lie_rope" not in k}
    shared = model.pe.encodings["lie_rope"].shared.generators.detach()
    for i in range(len(model.blocks)):  # unused copies of another value: they must not land anywhere
        old[f"pe.encodings.lie_rope.generators.{i}"] = shared if i == 0 else torch.randn_like(shared)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        expect = model(x)
    fresh = timm.create_model("vit_n_liere", **kw).eval()
    fresh.load_state_dict(checked_filter(FAMILIES["vit"].filter_fn)(old, fresh), strict=True)
    with torch.no_grad():
        assert torch.equal(fresh(x), expect)
