"""Test-time RoPE scaling: the `ntk` and `yarn` position modes against their definitions, equal to plain RoPE at the
training size, reaching every rotary PE through the model's `position_mode`."""

import math

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.engine.bench_settings import ACCEPTED_POSITION_MODES
from visionpe.models.vit import POSITION_MODES
from visionpe.pos.rope_scaling import RopeScaling, rope_scaling, scale_frequencies, yarn_temperature
from visionpe.pos.rotary import axial_frequencies

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


def test_yarn_interpolates_slow_keeps_fast_and_ramps_between():
    length, s = 10.0, 4.0
    turns = torch.tensor([0.5, 16.5, 40.0])  # below alpha = 1, half-way between alpha and beta = 32, above beta
    freqs = (2 * math.pi * turns / length)[None]  # [1 stream, 3 pairs]
    out = scale_frequencies(freqs, RopeScaling("yarn", (s,)), 4, (length,))
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
            assert model.pe.encodings[name.split("vit_n_")[1].replace("_mixed", "")].host.position_mode == mode
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
    assert set(POSITION_MODES) == set(ACCEPTED_POSITION_MODES) == {"extrapolate", "interpolate", "ntk", "yarn"}
    with pytest.raises(ValueError, match="position_mode must be one of"):
        timm.create_model("vit_n_rope2d", position_mode="stretch")
