"""Test-time RoPE scaling (`ntk` / `yarn`) of the RoPE-ND schemes on video: each stream's base scaled by its ratio
to the power d / (d - 2) (ntk), the YaRN ramp and temperature, nothing at the training clip, interleaved image-text
layouts left alone, and the video backbone's `position_mode`."""

import math

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.pos import AttnSpec, PEHost
from visionpe.pos.mm_positions import segment_layout, stream_of_pairs
from visionpe.pos.rope_nd import RoPEND
from visionpe.pos.rotary import apply_rotary, scaled_cos_sin

D, THETA = 24, 100.0
VIDEO_SCHEMES = ["rope3d", "mrope", "mrope_interleaved", "videorope", "hope", "vrope", "v2pe"]  # vivit_n_* presets


def _pe(scheme, mode, frames=2, grid=(4, 4)):
    host = PEHost(
        dim=2 * D, grid=grid, num_prefix=1, layers=(AttnSpec(2 * D, 2, D),), frames=frames, position_mode=mode
    )
    return RoPEND(host, scheme=scheme, theta=THETA)


def _rotated(pe, layout, q):
    return pe.context(0, layout).rotate(q, q)[0]


def _spread(layout):
    return (layout.pos.amax(0) - layout.pos.amin(0) + 1).tolist()


@pytest.mark.parametrize("scheme", ["rope3d", "mrope", "vrope", "rope1d"])
def test_ntk_gives_each_stream_the_base_times_its_ratio_to_the_d_over_d_minus_2(scheme):
    pe = _pe(scheme, "ntk")
    layout = segment_layout([("video", (6, 4, 8))], scheme, 1)  # 3x the frames, 2x the columns
    ref = segment_layout([("video", (2, 4, 4))], scheme, 1)
    ratios = [max(a / b, 1.0) for a, b in zip(_spread(layout), _spread(ref))]
    assert max(ratios) > 1.5
    reads, c = stream_of_pairs(scheme, D // 2), torch.arange(D // 2, dtype=torch.float32)
    freqs = torch.zeros(len(ratios), D // 2)
    for s, r in enumerate(ratios):  # base theta * r^(d / (d - 2)) for the pairs of stream s, from the definition
        base = THETA * r ** (D / (D - 2))
        freqs[s, reads == s] = base ** (-2 * c[reads == s] / D)
    q = torch.randn(1, 2, layout.num_tokens, D)
    expect = apply_rotary(q, *scaled_cos_sin(layout.pos, freqs, 1))
    # the two fp32 routes to a frequency differ by a few eps, an angle by that times the position (up to 192)
    atol = 16 * torch.finfo(torch.float32).eps * float(layout.pos.abs().max()) * float(q.abs().max())
    torch.testing.assert_close(_rotated(pe, layout, q), expect, rtol=0, atol=atol)


def test_yarn_ramps_each_frequency_by_its_turns_and_scales_q_and_k():
    pe = _pe("rope3d", "yarn")
    layout = segment_layout([("video", (8, 4, 4))], "rope3d", 1)  # 4x the frames: s_t = 4 (spread 8 over 2)
    base = pe.layer_frequencies(0)
    ref_spread = torch.tensor([2.0, 4.0, 4.0])[:, None]
    ratio = torch.tensor([4.0, 1.0, 1.0])[:, None]
    gamma = ((ref_spread * base / (2 * math.pi) - 1) / 31).clamp(0, 1)  # turns over the training spread
    freqs = base * (gamma + (1 - gamma) / ratio)
    gain = 0.1 * math.log(4.0 ** (1 / 3)) + 1  # the geometric mean of the three streams' ratios
    q = torch.randn(1, 2, layout.num_tokens, D)
    expect = apply_rotary(q, *scaled_cos_sin(layout.pos, freqs, 1, gain=gain))
    torch.testing.assert_close(_rotated(pe, layout, q), expect, rtol=1e-5, atol=1e-5)
    assert (freqs[0] < base[0]).any() and torch.equal(freqs[1:], base[1:])  # only the temporal stream moved


@pytest.mark.parametrize("scheme", ["mrope", "v2pe"])
def test_interleaved_image_text_layouts_are_not_scaled(scheme):
    layout = segment_layout([("text", 3), ("video", (2, 8, 8)), ("text", 4)], scheme, 1)
    q = torch.randn(1, 2, layout.num_tokens, D)
    for mode in ("ntk", "yarn"):
        assert torch.equal(_rotated(_pe(scheme, mode), layout, q), _rotated(_pe(scheme, "extrapolate"), layout, q))


@pytest.mark.parametrize("scheme", VIDEO_SCHEMES)
def test_video_models_equal_plain_rope_at_the_training_clip_and_change_beyond(scheme):
    torch.manual_seed(0)
    model = timm.create_model(f"vivit_n_{scheme}", img_size=32, num_frames=4, patch_size=8, num_classes=4).eval()
    for block in model.blocks:  # sharp attention, so that positions show
        block.attn.qkv.weight.data.mul_(20)
    at_train, longer = torch.randn(1, 3, 4, 32, 32), torch.randn(1, 3, 12, 32, 48)
    with torch.no_grad():
        plain = [model(at_train), model(longer)]
        for mode in ("ntk", "yarn"):
            model.position_mode = mode
            assert torch.equal(model(at_train), plain[0]), mode
            assert (model(longer) - plain[1]).abs().max() > 1e-4, mode
        model.position_mode = "extrapolate"
        assert torch.equal(model(longer), plain[1])
    assert timm.create_model("vivit_n_rope3d", position_mode="yarn").position_mode == "yarn"
    with pytest.raises(ValueError, match="position_mode must be one of"):
        model.position_mode = "interpolate"
