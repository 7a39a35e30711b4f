import math

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat, get_mixed_freqs

from visionpe.layout.tokens import image_layout
from visionpe.pos import AttnSpec, PEHost, RoPE2D
from visionpe.pos.rope2d import mixed_frequencies
from visionpe.pos.rotary import FixedCosSinCache, apply_rotary, axial_frequencies, rotary_angles, rotary_cos_sin


def _rope(mode, heads=2, head_dim=16, depth=2, **kw):
    host = PEHost(
        dim=heads * head_dim, grid=(4, 4), num_prefix=1, layers=(AttnSpec(heads * head_dim, heads, head_dim),) * depth
    )
    return RoPE2D(host, mode=mode, **kw)


def _rotated(rope, layout, q, k, i=0, own=None):
    """q, k rotated at layer i; own: its module (default: a fresh `rope.layer(i)`, RoPE-Mixed's drawn frequencies)."""
    return rope.context(i, layout, None, rope.layer(i) if own is None else own).rotate(q, k)


def test_axial_frequencies_follow_the_paper():
    d, theta = 16, 100.0
    f = axial_frequencies(d, theta)
    expect = torch.tensor([theta ** (-4 * j / d) for j in range(d // 4)])
    # fp32 powers vs float64: a few eps relative, inside allclose's rtol 1e-5; a wrong exponent is off by > 10 %
    assert torch.allclose(f[0, : d // 4], expect) and torch.allclose(f[1, d // 4 :], expect)
    assert f[0, d // 4 :].abs().sum() == 0 and f[1, : d // 4].abs().sum() == 0


@pytest.mark.parametrize("mode", ["axial", "mixed"])
def test_logit_depends_only_on_relative_offset(mode):
    rope = _rope(mode)
    lay = image_layout(5, 6, num_prefix=1)
    n = lay.num_tokens
    q = torch.randn(1, 2, 1, 16).expand(1, 2, n, 16)  # the same vector at every token
    k = torch.randn(1, 2, 1, 16).expand(1, 2, n, 16)
    qr, kr = _rotated(rope, lay, q, k)
    logits = (qr @ kr.transpose(-1, -2))[0, :, 1:, 1:]  # drop the prefix row/col
    pos = lay.pos
    by_offset = {}
    for i in range(pos.shape[0]):
        for j in range(pos.shape[0]):
            key = tuple((pos[i] - pos[j]).tolist())
            by_offset.setdefault(key, []).append(logits[:, i, j])
    spread = max((torch.stack(v) - v[0]).abs().max().item() for v in by_offset.values())
    # fp32 cos/sin of angles |pos * f| <= ~6 carry ~6 eps ~ 4e-7 each, times logits' scale |q||k| ~ 16: ~1e-5;
    # an absolute-position dependence is O(1), like the offset dependence checked below (> 1e-3)
    assert spread < 1e-4
    assert len(by_offset) == (2 * 5 - 1) * (2 * 6 - 1)
    # ...and it does depend on the offset
    assert (logits[:, 0, 1] - logits[:, 0, 2]).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["axial", "mixed"])
def test_rotation_preserves_norms_and_leaves_prefix_untouched(mode):
    rope = _rope(mode)
    lay = image_layout(3, 4, num_prefix=1)
    q, k = torch.randn(2, 2, 13, 16), torch.randn(2, 2, 13, 16)
    qr, kr = _rotated(rope, lay, q, k, i=1)
    # 16-element norms |q| ~ 4 of fp32 rotations (cos^2 + sin^2 = 1 to ~2 eps): error ~ 10 eps * 4 ~ 2e-6
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
    # exact: prefix tokens are copied through, not rotated
    assert torch.equal(qr[:, :, :1], q[:, :, :1]) and torch.equal(kr[:, :, :1], k[:, :, :1])
    assert (qr[:, :, 2:] - q[:, :, 2:]).abs().max() > 1e-3


def test_axial_equals_mixed_with_zero_angles():
    axial = _rope("axial", theta=100.0)
    mixed = _rope("mixed", theta=100.0)
    own = mixed.layer(0)
    with torch.no_grad():
        own.freqs.copy_(mixed_frequencies(16, 1, 2, theta=100.0, rotate=False)[:, 0])
    lay = image_layout(4, 5, num_prefix=1)
    q, k = torch.randn(1, 2, 21, 16), torch.randn(1, 2, 21, 16)
    a = _rotated(axial, lay, q, k)
    m = _rotated(mixed, lay, q, k, own=own)
    # x * fx + y * fy with fy = 0 vs x * fx alone: angles <= ~5 agree to ~eps * 5 ~ 3e-7, times |q| entries <= ~4
    assert max((x - y).abs().max().item() for x, y in zip(a, m)) < 1e-5


def test_mixed_initialisation_follows_the_paper():
    f = mixed_frequencies(16, depth=3, num_heads=4, theta=10.0)
    assert f.shape == (2, 3, 4, 8)
    mag = torch.tensor([10.0 ** (-4 * j / 16) for j in range(4)])
    # |(fx, fy)| of every pair is m_j, and the two halves are a quarter turn apart
    norm = torch.sqrt(f[0] ** 2 + f[1] ** 2)
    # sqrt((m cos a)^2 + (m sin a)^2) in fp32 with m <= 1: a few eps ~ 3e-7
    assert torch.allclose(norm[..., :4], mag.expand(3, 4, 4), atol=1e-6)
    assert torch.allclose(norm[..., 4:], mag.expand(3, 4, 4), atol=1e-6)
    dot = f[0, ..., :4] * f[0, ..., 4:] + f[1, ..., :4] * f[1, ..., 4:]
    # m^2 sin(rounding of a + pi/2): fp32 a + pi/2 <= 8 rounds by <= 4.8e-7, plus ~1 ulp from cos/sin
    # (kernels differ per CPU) and the products: |dot| <= ~1e-6; a wrong quarter turn gives O(0.1)
    assert dot.abs().max() < 2e-6


def test_matches_timm_axial_rope_xy_grid():
    rope = _rope("axial", heads=1, head_dim=32)
    lay = image_layout(3, 5, num_prefix=0)
    x = torch.randn(1, 1, 15, 32)
    ours, _ = _rotated(rope, lay, x, x)
    ref_embed = RotaryEmbeddingCat(32, temperature=100, in_pixels=False, grid_indexing="xy").get_embed((3, 5))
    ref = apply_rot_embed_cat(x, ref_embed)
    # timm builds frequencies and angles by other fp32 ops: angles <= ~4 agree to ~10 eps ~ 6e-7, times |x| <= ~4
    assert (ours - ref).abs().max() < 1e-5


def test_matches_timm_mixed_rope():
    rope = _rope("mixed", heads=2, head_dim=16, depth=2)
    own = [rope.layer(i) for i in range(2)]
    lay = image_layout(3, 5, num_prefix=0)
    x = torch.randn(1, 2, 15, 16)
    ours, _ = _rotated(rope, lay, x, x, i=1, own=own[1])
    t_x, t_y = lay.pos[:, 0], lay.pos[:, 1]
    stacked = torch.stack([o.freqs.detach() for o in own], dim=1)  # timm's [2, depth, heads, d/2]
    ref_embed = get_mixed_freqs(stacked, t_x, t_y)[1]  # layer 1: [heads, N, 2 d]
    ref = apply_rot_embed_cat(x, ref_embed)
    # as above: angles x * fx + y * fy <= ~8 by other fp32 ops agree to ~1e-6, times |x| <= ~4
    assert (ours - ref).abs().max() < 1e-5


def test_angles_stay_fp32_under_autocast():
    pos = torch.tensor([[1000.0, 3.0]])
    f = axial_frequencies(16, 100.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = rotary_angles(pos, f)
    assert a.dtype == torch.float32
    # 1000 * 1.0 is exact in fp32 (the dtype check above is what catches a bf16 angle)
    assert math.isclose(a[0, 0].item(), 1000.0, rel_tol=1e-6)


def test_mixed_frequencies_are_excluded_from_weight_decay():
    mixed = _rope("mixed")
    assert mixed.layer(0).no_weight_decay() == {"freqs"} and not list(mixed.parameters()), "each layer its own"
    assert _rope("axial").no_weight_decay() == set() and _rope("axial").layer(0) is None
    assert sum(p.numel() for p in _rope("axial").parameters()) == 0


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="axial' or 'mixed"):
        _rope("spiral")
    with pytest.raises(ValueError, match="divisible by 4"):
        RoPE2D(PEHost(dim=18, grid=(2, 2), num_prefix=0, layers=(AttnSpec(18, 3, 6),)))


def test_fixed_cos_sin_cache_hits_the_same_layout_and_keeps_the_last_few():
    cache, freqs = FixedCosSinCache(size=2), axial_frequencies(16, 100.0)
    layouts = [image_layout(h, 4, 1) for h in (2, 3, 4)]
    first = cache(layouts[0], freqs)
    expected = rotary_cos_sin(rotary_angles(layouts[0].pos, freqs, 1))
    assert all(torch.equal(a, b) for a, b in zip(first, expected))
    assert cache(layouts[0], freqs) is first  # the same positions tensor: a hit
    assert cache(layouts[0], axial_frequencies(8, 100.0)) is not first  # another head dim: its own entry
    cache(layouts[1], freqs)
    assert cache(layouts[0], freqs) is not first  # pushed out by two newer entries (size 2)
    with torch.inference_mode():  # built outside inference mode: usable in training afterwards
        inner = cache(layouts[2], freqs)
    assert not inner[0].is_inference()


def _elementwise_rotation(x, cos, sin):  # the textbook form: x * cos + rotate_half_pairs(x) * sin
    pairs = x.float().unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return x.float() * cos + rotated * sin


@pytest.mark.parametrize("per_head", [False, True])
def test_eager_complex_rotation_equals_the_elementwise_form(per_head):
    torch.manual_seed(0)
    angles = (torch.rand(*((3,) if per_head else ()), 10, 8) * 20).requires_grad_(per_head)  # mixed RoPE trains them
    big = torch.randn(2, 3, 10, 17, requires_grad=True)
    x = big[..., 1:]  # odd storage offset: no complex view of x exists, the rotation copies it
    ours = apply_rotary(x, *rotary_cos_sin(angles))
    ref = _elementwise_rotation(x, *rotary_cos_sin(angles))
    # both compute the same two products and one sum per channel, in fp32: a few ulps of |x| apart at most
    assert (ours - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * x.abs().max()
    g = torch.randn_like(ref)
    wrt = (big, angles) if per_head else (big,)
    for a, b in zip(torch.autograd.grad(ours, wrt, g), torch.autograd.grad(ref, wrt, g)):
        # angle gradients sum 2 x 10 products per angle in another order: fp32 accumulation error of that sum
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    assert apply_rotary(x.bfloat16(), *rotary_cos_sin(angles)).dtype == torch.bfloat16
    shifted = torch.randn(1 + x.numel())[1:].view(x.shape)  # contiguous, but at an odd offset in its storage
    assert (
        apply_rotary(shifted, *rotary_cos_sin(angles)) - _elementwise_rotation(shifted, *rotary_cos_sin(angles))
    ).abs().max() <= 4 * torch.finfo(torch.float32).eps * shifted.abs().max()
