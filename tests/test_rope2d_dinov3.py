"""DINOv3's RoPE against timm's `RotaryEmbeddingDinoV3` (itself checked bit-exact against the official module), and
its properties: relative logits within a grid, coordinates at 2x, prefix tokens, fp32 periods, the meta device.

Tolerances: cos/sin of fp32 angles |a| <= 2 pi / min period ~ 6.3 (both sides round the angle to fp32, in another
order) differ by a few 1e-7; 2e-6 absolute leaves margin, while a wrong period, axis or layout is off by O(0.1)."""

import math

import pytest
import timm
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, apply_rot_embed_cat

import visionpe  # noqa: F401
from visionpe.layout.tokens import image_layout
from visionpe.pos import AttnSpec, PEHost, RoPE2D
from visionpe.pos.rope2d_dinov3 import RoPE2DDinoV3, dinov3_coords
from visionpe.pos.rotary import axial_frequencies

ATOL = 2e-6


def _host(head_dim=64, heads=2, grid=(4, 4), prefix=5, depth=2):
    dim = heads * head_dim
    return PEHost(dim=dim, grid=grid, num_prefix=prefix, layers=(AttnSpec(dim, heads, head_dim),) * depth)


def _ours(hw, head_dim=64, prefix=5, **kw):
    pe = RoPE2DDinoV3(_host(head_dim, prefix=prefix), **kw).eval()
    return pe, pe._cos_sin(0, image_layout(*hw, prefix))


@pytest.mark.parametrize("hw", [(14, 14), (16, 16), (14, 20), (7, 3)])
@pytest.mark.parametrize(
    "kw, timm_kw",
    [
        ({}, {}),
        (dict(normalize_coords="min"), dict(normalize_coords="min")),
        (dict(normalize_coords="max", base=50.0), dict(normalize_coords="max", temperature=50.0)),
        (dict(min_period=0.5, max_period=40.0), dict(min_period=0.5, max_period=40.0, temperature=None)),
    ],
)
def test_cos_sin_equal_timms_dinov3_rope(hw, kw, timm_kw):
    pe, (cos, sin) = _ours(hw, **kw)
    ref = RotaryEmbeddingDinoV3(64, **{"temperature": 100.0, **timm_kw}).eval()
    torch.testing.assert_close(pe.periods(64), ref.periods, rtol=1e-6, atol=0)
    emb = ref.get_embed(list(hw))  # [HW, 2 * 64] = cat(sin, cos), rotate-half layout
    signed = torch.cat([-emb[:, :32], emb[:, 32:64]], dim=-1)  # our half-layout sin is signed [-sin, sin]
    torch.testing.assert_close(sin[5:], signed, rtol=0, atol=ATOL)
    torch.testing.assert_close(cos[5:], emb[:, 64:], rtol=0, atol=ATOL)
    assert torch.equal(cos[:5], torch.ones(5, 64)) and not sin[:5].any()


def test_rotation_equals_timms_rotate_half_and_leaves_the_prefix_bit_identical():
    pe = RoPE2DDinoV3(_host(32, prefix=5)).eval()
    lay = image_layout(6, 9, 5)
    q, k = torch.randn(2, 2, lay.num_tokens, 32), torch.randn(2, 2, lay.num_tokens, 32)
    qr, kr = pe.context(0, lay).rotate(q, k)
    assert torch.equal(qr[:, :, :5], q[:, :, :5]) and torch.equal(kr[:, :, :5], k[:, :, :5])
    emb = RotaryEmbeddingDinoV3(32, temperature=100.0).eval().get_embed([6, 9])
    ref = apply_rot_embed_cat(q[:, :, 5:], emb, half=True)
    torch.testing.assert_close(qr[:, :, 5:], ref, rtol=0, atol=ATOL * q.abs().max().item())
    # the number of prefix tokens changes nothing for the patches
    other = RoPE2DDinoV3(_host(32, prefix=1)).eval()
    q1 = other.context(0, image_layout(6, 9, 1)).rotate(q[:, :, 4:], k[:, :, 4:])[0]
    assert torch.equal(q1[:, :, 1:], qr[:, :, 5:])


def test_logits_depend_only_on_the_coordinate_offset_within_a_grid():
    pe = RoPE2DDinoV3(_host(16, prefix=1)).eval()
    lay = image_layout(5, 6, 1)
    n = lay.num_tokens
    q = torch.randn(1, 2, 1, 16).expand(1, 2, n, 16)  # the same vector at every token
    k = torch.randn(1, 2, 1, 16).expand(1, 2, n, 16)
    qr, kr = pe.context(0, lay).rotate(q, k)
    logits = (qr @ kr.transpose(-1, -2))[0, :, 1:, 1:]
    by_offset = {}
    for i in range(30):
        for j in range(30):
            by_offset.setdefault((i // 6 - j // 6, i % 6 - j % 6), []).append(logits[:, i, j])
    spread = max((torch.stack(v) - v[0]).abs().max().item() for v in by_offset.values())
    # cos/sin carry ~1e-7 each, times |q||k| ~ 16 summed over 8 pairs: ~1e-5; an absolute dependence is O(1)
    assert spread < 1e-4 and len(by_offset) == 9 * 11
    assert (logits[:, 0, 1] - logits[:, 0, 2]).abs().max() > 1e-3


@pytest.mark.parametrize("hw", [(3, 5), (7, 7)])
def test_coordinates_at_twice_the_grid_average_to_the_parent(hw):
    h, w = hw
    parent = dinov3_coords(h, w).view(h, w, 2)
    child = dinov3_coords(2 * h, 2 * w).view(h, 2, w, 2, 2)
    torch.testing.assert_close(child.mean(dim=(1, 3)), parent, rtol=0, atol=1e-6)  # values <= 1: fp32 rounding
    ends = [parent[..., 0].min().item(), parent[..., 1].max().item()]
    assert ends == pytest.approx([-1 + 1 / h, 1 - 1 / w], abs=1e-6)  # patch centres inside [-1, 1]
    # columns (h, w); min / max normalisation share one denominator
    assert torch.equal(dinov3_coords(2, 4, "max")[:, 0].unique(), torch.tensor([-0.75, -0.25]))


def test_periods_follow_the_base_and_stay_fp32_under_bfloat16():
    pe = RoPE2DDinoV3(_host(64))
    expect = torch.tensor([100.0 ** (k / 16) for k in range(16)])
    torch.testing.assert_close(pe.periods(64), expect, rtol=1e-6, atol=0)
    model = timm.create_model("vit_n_rope2d_dinov3", num_classes=0).to(torch.bfloat16)
    rope = model.pe.encodings["rope2d_dinov3"]
    assert rope.periods(24).dtype == torch.float32
    torch.testing.assert_close(rope.periods(24), torch.tensor([100.0 ** (k / 6) for k in range(6)]), rtol=1e-6, atol=0)
    assert model(torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert not any("period" in k for k in model.state_dict())


def test_builds_on_the_meta_device_and_refills_its_buffers():
    with torch.device("meta"):
        pe = RoPE2DDinoV3(_host(64), min_period=0.5, max_period=40.0)
    assert pe.periods(64).is_meta
    pe = pe.to_empty(device="cpu")
    pe.init_non_persistent_buffers()
    torch.testing.assert_close(pe.periods(64), RoPE2DDinoV3(_host(64), min_period=0.5, max_period=40.0).periods(64))


def test_axial_rope2d_also_refills_its_frequencies_after_the_meta_device():
    with torch.device("meta"):
        pe = RoPE2D(_host(16))
    pe = pe.to_empty(device="cpu")
    pe.init_non_persistent_buffers()
    assert torch.equal(pe.layer_frequencies(0), axial_frequencies(16, 100.0))


def test_eval_cos_sin_are_computed_once_per_grid():
    pe = RoPE2DDinoV3(_host(32)).eval()
    first = pe._cos_sin(0, image_layout(6, 9, 5))
    assert pe._cos_sin(1, image_layout(6, 9, 5))[0] is first[0]  # every layer and forward: one computation


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="exclusive"):
        RoPE2DDinoV3(_host(), base=100.0, min_period=1.0, max_period=2.0)
    with pytest.raises(ValueError, match="both min_period"):
        RoPE2DDinoV3(_host(), min_period=1.0)
    with pytest.raises(ValueError, match="normalize_coords"):
        RoPE2DDinoV3(_host(), normalize_coords="mean")
    with pytest.raises(ValueError, match="divisible by 4"):
        RoPE2DDinoV3(_host(head_dim=6))
    with pytest.raises(ValueError, match="rescale_coords"):
        RoPE2DDinoV3(_host(), rescale_coords=0.5)
    assert math.isclose(RoPE2DDinoV3(_host(), base=10.0).periods(64)[-1].item(), 10 ** (15 / 16), rel_tol=1e-6)
