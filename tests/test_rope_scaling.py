"""Test-time RoPE scaling: the `ntk` and `yarn` position modes against their definitions, equal to plain RoPE at the
training size, reaching every rotary PE through the model's `position_mode`."""

import math

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.models.vit import VisionTransformer
from visionpe.pos.rope_scaling import RopeScaling, base_ladder, rope_scaling, scale_frequencies, yarn_temperature
from visionpe.pos.rotary import axial_frequencies, rope_frequencies
from visionpe.position_modes import ALL_MODES

ROTARY = ["vit_n_rope2d", "vit_n_rope2d_mixed", "vit_n_rope2d_dinov3"]


def test_ntk_is_the_axial_ladder_with_a_larger_base():
    d, theta, s = 32, 100.0, 2.5
    k = d // 4
    scaled = scale_frequencies(axial_frequencies(d, theta), RopeScaling("ntk", (s, 1.0)), d, (8.0, 8.0))
    expect = axial_frequencies(d, theta * s ** (k / (k - 1)))  # NTK-aware: base * s^(K / (K - 1))
    torch.testing.assert_close(scaled[0], expect[0], rtol=1e-5, atol=0)  # x stream: scaled by its ratio
    torch.testing.assert_close(scaled[1], axial_frequencies(d, theta)[1], rtol=0, atol=0)  # y: ratio 1, unchanged
    assert scaled[0, 0] == axial_frequencies(d, theta)[0, 0]  # the fastest frequency is kept
    torch.testing.assert_close(scaled[0, k - 1], axial_frequencies(d, theta)[0, k - 1] / s)  # the slowest / s


def reference_yarn(dim: int, base: float, length: float, factor: float) -> torch.Tensor:
    """YaRN's frequencies for one 1D ladder base^(-2i/dim), i < dim/2, trained over `length` positions and stretched
    by `factor`, re-derived from the reference code's definitions (jquesnelle/yarn, transformers' YaRN)."""

    def pair_index(rotations):  # where the ladder turns `rotations` times over the training length
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(pair_index(32)), 0), min(math.ceil(pair_index(1)), dim - 1)  # beta_fast, beta_slow
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 1: interpolated
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def test_yarn_follows_the_reference_code_on_each_axis():
    d, theta = 64, 100.0  # ViT-S/B's head dim; 2D 14 x 14 -> 28 x 21 patches
    k, (sx, sy) = d // 4, (2.0, 1.5)
    base = axial_frequencies(d, theta)
    out = scale_frequencies(base, RopeScaling("yarn", (sx, sy)), d, (14.0, 14.0), ladder=base_ladder(theta, k))
    # each axis block is the reference's 1D ladder over dim = d/2 channels, trained over the 14 patches of its axis
    torch.testing.assert_close(out[0, :k], reference_yarn(d // 2, theta, 14.0, sx), rtol=1e-6, atol=0)
    torch.testing.assert_close(out[1, k:], reference_yarn(d // 2, theta, 14.0, sy), rtol=1e-6, atol=0)
    assert not out[0, k:].any() and not out[1, :k].any()
    paper = scale_frequencies(base, RopeScaling("yarn", (sx, sy), "paper"), d, (14.0, 14.0))
    assert (paper[0, :k] / base[0, :k] - out[0, :k] / base[0, :k]).abs().max() > 0.3  # the forms differ here
    # a 1D ladder of d/2 pairs (the RoPE-ND schemes) and a short training extent, where the reference's range is
    # a single pair (low == high)
    one = rope_frequencies(d // 2, theta)[None]
    for length in (7.0, 40.0):
        scaled = scale_frequencies(one, RopeScaling("yarn", (3.0,)), d, (length,), ladder=base_ladder(theta, d // 2))
        torch.testing.assert_close(scaled[0], reference_yarn(d, theta, length, 3.0), rtol=1e-6, atol=0)


def test_yarn_reference_scales_nothing_when_its_range_is_empty():
    d, theta = 32, 100.0  # the fastest pair turns less than once over 2 positions: the reference keeps them all
    base = axial_frequencies(d, theta)
    out = scale_frequencies(base, RopeScaling("yarn", (4.0, 4.0)), d, (2.0, 2.0), ladder=base_ladder(theta, d // 4))
    torch.testing.assert_close(out, base, rtol=0, atol=0)
    torch.testing.assert_close(out[0, : d // 4], reference_yarn(d // 2, theta, 2.0, 4.0), rtol=1e-6, atol=0)


def test_yarn_ramp_is_a_pe_option():
    x, larger = torch.randn(1, 3, 32, 32), torch.randn(1, 3, 64, 64)
    outs = {}
    for ramp in ("reference", "paper"):
        torch.manual_seed(0)
        model = timm.create_model("vit_n_rope2d", position_mode="yarn", pe_kwargs={"yarn_ramp": ramp}).eval()
        with torch.no_grad():
            outs[ramp] = model(x), model(larger)
    assert torch.equal(outs["reference"][0], outs["paper"][0])  # the same at the training size
    assert (outs["reference"][1] - outs["paper"][1]).abs().max() > 1e-5
    with pytest.raises(ValueError, match="yarn_ramp must be one of reference, paper"):
        timm.create_model("vit_n_rope2d", pe_kwargs={"yarn_ramp": "wavelength"})


def test_yarn_paper_form_interpolates_slow_keeps_fast_and_ramps_between():
    length, s = 10.0, 4.0
    turns = torch.tensor([0.5, 16.5, 40.0])  # below alpha = 1, half-way between alpha and beta = 32, above beta
    freqs = (2 * math.pi * turns / length)[None]  # [1 stream, 3 pairs]
    out = scale_frequencies(freqs, RopeScaling("yarn", (s,), "paper"), 4, (length,))
    expect = freqs[0] * torch.tensor([1 / s, 0.5 + 0.5 / s, 1.0])
    torch.testing.assert_close(out[0], expect, rtol=1e-6, atol=0)
    assert yarn_temperature(RopeScaling("yarn", (2.0, 8.0))) == pytest.approx(0.1 * math.log(4.0) + 1)
    assert yarn_temperature(RopeScaling("ntk", (2.0, 8.0))) == 1.0 and yarn_temperature(None) == 1.0


def test_no_scaling_at_or_below_the_training_size():
    assert rope_scaling("ntk", (14, 14), (14, 14)) is None and rope_scaling("yarn", (7, 10), (14, 14)) is None
    assert rope_scaling("extrapolate", (28, 28), (14, 14)) is None
    assert rope_scaling("yarn", (28, 7), (14, 14)).ratios == (2.0, 1.0)


@pytest.mark.parametrize("name", ROTARY)
def test_ntk_and_yarn_equal_plain_rope_at_the_training_size_and_change_it_beyond(name):
    torch.manual_seed(0)
    # built at 32 px (8 x 8 patches); LayerScale 1 so that attention (DINOv3's 1e-5) shows in the logits
    model = timm.create_model(name, num_classes=4, init_values=1.0).eval()
    for block in model.blocks:  # sharp attention, so that positions show
        block.attn.qkv.weight.data.mul_(20)
    at_train, larger = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        plain = [model(at_train), model(larger)]
        for mode in ("ntk", "yarn"):
            model.set_position_mode(mode)
            assert all(pe.position_mode == mode for pe in model.pe.encodings.values()) and model.position_mode == mode
            assert torch.equal(model(at_train), plain[0]), mode
            assert (model(larger) - plain[1]).abs().max() > 1e-4, mode
        model.set_position_mode("extrapolate")
        assert torch.equal(model(larger), plain[1])


def test_yarn_temperature_scales_q_and_k_of_every_token():
    model = timm.create_model("vit_n_rope2d", position_mode="yarn").eval()
    rope = model.pe.encodings["rope2d"]
    layout = model.layout((16, 32))  # 2 x 4 the training grid: s = sqrt(8)
    q = torch.randn(1, 4, layout.num_tokens, 24)
    qr, kr = rope.context(0, layout).rotate(q, q)
    gain = 0.1 * math.log(math.sqrt(8.0)) + 1
    norms = qr.norm(dim=-1) / q.norm(dim=-1)  # a rotation times the gain, for every token (CLS too)
    torch.testing.assert_close(norms, torch.full_like(norms, gain), rtol=1e-5, atol=0)


def test_dinov3_keeps_the_training_spacing_under_ntk():
    model = timm.create_model("vit_n_rope2d_dinov3", position_mode="ntk").eval()
    rope = model.pe.encodings["rope2d_dinov3"]
    x = torch.randn(1, 1, 16 * 16, 24)
    layout = model.layout((16, 16))
    q = rope.context(0, layout).rotate(torch.cat([x[:, :, :5], x], 2), torch.cat([x[:, :, :5], x], 2))[0]
    model.position_mode = "interpolate"  # the official behaviour: the same [-1, 1] box, denser
    q_box = rope.context(0, layout).rotate(torch.cat([x[:, :, :5], x], 2), torch.cat([x[:, :, :5], x], 2))[0]
    assert (q - q_box).abs().max() > 1e-3


def test_position_modes_are_validated_and_the_bench_accepts_them():
    assert set(VisionTransformer.position_modes) == {"extrapolate", "interpolate", "ntk", "yarn"}
    assert set(ALL_MODES) == set(VisionTransformer.position_modes) | {"riflex"}  # the video / multimodal models' too
    with pytest.raises(ValueError, match="position_mode must be one of"):
        timm.create_model("vit_n_rope2d", position_mode="stretch")
