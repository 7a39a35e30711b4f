"""Test-time RoPE scaling (`ntk` / `yarn`) of the RoPE-ND schemes: each stream's base scaled by its ratio to the
power d / (d - 2) (ntk), the YaRN ramp and temperature, nothing at the training input, interleaved image-text
layouts scaled against the host's training sequence, and the `position_mode` of the video backbone and of the
multimodal encoder (per stream, per native row, text by its token-length ratio)."""

import math

import pytest
import timm
import torch
from test_rope_scaling import reference_yarn  # the reference code's YaRN, re-derived

import visionpe  # noqa: F401
from visionpe.layout.batch import pack_images
from visionpe.pos import AttnSpec, PEHost
from visionpe.pos.mm_positions import position_ids, segment_layout, stream_of_pairs
from visionpe.pos.rope_nd import RoPEND
from visionpe.pos.rope_scaling import (
    base_ladder,
    rope_scaling,
    scale_frequencies,
    single_ladder_exponents,
    yarn_temperature,
)
from visionpe.pos.rotary import apply_rotary, rope_frequencies, scaled_cos_sin
from visionpe.zoo.multimodal_family import MM

D, THETA = 24, 100.0
# the vivit_n_* / mm_n_* presets
VIDEO_SCHEMES = ["rope3d", "mrope", "mrope_interleaved", "videorope", "hope", "vrope", "v2pe", "mrope_i", "mhrope"]


def _pe(scheme, mode, frames=2, grid=(4, 4), reference=None, **options):
    layers = (AttnSpec(2 * D, 2, D),)
    ref = None if reference is None else tuple(reference)
    pe = RoPEND(
        PEHost(2 * D, grid, 1, layers, frames=frames, reference_segments=ref), scheme=scheme, theta=THETA, **options
    )
    pe.position_mode = mode  # what the model's set_position_mode sets on its PEs
    return pe


def _rotated(pe, layout, q):
    return pe.context(0, layout).rotate(q, q)[0]


def _spread(layout):
    return tuple((layout.pos.amax(0) - layout.pos.amin(0) + 1).tolist())


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


@pytest.mark.parametrize("ramp", ["reference", "paper"])
def test_yarn_ramps_each_frequency_by_its_turns_and_scales_q_and_k(ramp):
    pe = _pe("rope3d", "yarn", frames=16, yarn_ramp=ramp)
    layout = segment_layout([("video", (32, 4, 4))], "rope3d", 1)  # 2x the frames: s_t = 2 (spread 32 over 16)
    base = pe.layer_frequencies(0)
    ref_spread = torch.tensor([16.0, 4.0, 4.0])[:, None]
    ratio = torch.tensor([2.0, 1.0, 1.0])[:, None]
    if ramp == "paper":
        gamma = ((ref_spread * base / (2 * math.pi) - 1) / 31).clamp(0, 1)  # turns over the training spread
        freqs = base * (gamma + (1 - gamma) / ratio)
    else:  # the reference code on the one d/2-pair ladder, each stream over its training spread
        freqs = base.clone()  # (the spatial streams have ratio 1)
        freqs[0] = base[0] * reference_yarn(D, THETA, 16.0, 2.0) / rope_frequencies(D // 2, THETA)
    gain = 0.1 * math.log(2.0 ** (1 / 3)) + 1  # the geometric mean of the three streams' ratios
    q = torch.randn(1, 2, layout.num_tokens, D)
    expect = apply_rotary(q, *scaled_cos_sin(layout.pos, freqs, 1, gain=gain))
    torch.testing.assert_close(_rotated(pe, layout, q), expect, rtol=1e-5, atol=1e-5)
    assert (freqs[0] < base[0]).any() and torch.equal(freqs[1:], base[1:])  # only the temporal stream moved


@pytest.mark.parametrize("scheme", ["mrope", "v2pe"])
def test_an_interleaved_layout_scales_against_the_hosts_training_sequence(scheme):
    seq = [("text", 3), ("video", (2, 4, 4)), ("text", 4)]
    layout = segment_layout(seq, scheme, 1)
    longer = segment_layout([("text", 3), ("video", (2, 4, 4)), ("text", 40)], scheme, 1)  # 36 more text tokens
    q = torch.randn(1, 2, longer.num_tokens, D)
    for mode in ("ntk", "yarn"):
        pe = _pe(scheme, mode, reference=seq)
        assert pe.scaling(layout) is None  # the training sequence itself
        short = q[:, :, : layout.num_tokens]
        assert torch.equal(_rotated(pe, layout, short), _rotated(_pe(scheme, "extrapolate"), layout, short))
        got = pe.scaling(longer)
        assert got == rope_scaling(mode, _spread(longer), _spread(layout)) and min(got.ratios) > 1.5
        assert not torch.allclose(_rotated(pe, longer, q), _rotated(_pe(scheme, "extrapolate"), longer, q))
        # without a training sequence the host's clip (2 x 4 x 4) alone is the reference: a video backbone's rule
        alone = rope_scaling(mode, _spread(layout), _spread(segment_layout([("video", (2, 4, 4))], scheme)))
        assert _pe(scheme, mode).scaling(layout) == alone and alone is not None


@pytest.mark.parametrize("scheme", ["rope1d", "mrope", "videorope", "vrope", "v2pe", "hope"])
def test_text_scales_every_stream_by_the_token_length_ratio(scheme):
    pe = _pe(scheme, "ntk", reference=[("text", 10)])
    ratios = pe.scaling(segment_layout([("text", 25)], scheme, 1)).ratios
    assert ratios == (2.5,) * pe.num_streams
    assert pe.scaling(segment_layout([("text", 7)], scheme, 1)) is None  # shorter than training: no scaling


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


MM_SCHEMES = ["rope1d", "mrope", "mrope_interleaved", "videorope", "hope", "vrope", "v2pe", "mrope_i", "mhrope"]


def _mm(scheme, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(f"mm_n_{scheme}", **{**MM.tiny, "num_frames": 4, "num_classes": 4, **kwargs}).eval()
    for block in model.blocks:  # sharp attention, so that positions show
        block.attn.qkv.weight.data.mul_(20)
    return model


@pytest.mark.parametrize("scheme", MM_SCHEMES)
def test_mm_models_equal_plain_rope_at_the_training_sequence_and_change_beyond(scheme):
    model = _mm(scheme, text_length=3)
    at_train, longer = torch.randn(1, 3, 4, 32, 32), torch.randn(1, 3, 24, 32, 32)  # 12 tubelets of 4 x 4
    text, more_text = torch.randint(0, 32, (1, 3)), torch.randint(0, 32, (1, 9))
    with torch.no_grad():
        plain = [model(at_train, text), model(longer, more_text)]
        beyond = {}
        for mode in ("ntk", "yarn"):
            model.position_mode = mode
            assert torch.equal(model(at_train, text), plain[0]), mode
            beyond[mode] = model(longer, more_text)
            assert (beyond[mode] - plain[1]).abs().max() > 1e-4, mode
        assert (beyond["ntk"] - beyond["yarn"]).abs().max() > 1e-4
        model.position_mode = "extrapolate"
        assert torch.equal(model(longer, more_text), plain[1])


def _reference_positions(scheme, text_length, split, grid, **options):
    """The training sequence's positions, from mm_positions' definitions (evaluation options are its defaults)."""
    k = min(split, text_length)
    return position_ids([("text", k + 1), ("video", grid), ("text", text_length - k + 1)], scheme, **options)


@pytest.mark.parametrize("scheme", MM_SCHEMES)
@pytest.mark.parametrize("mode", ["ntk", "yarn"])
def test_mm_scale_per_stream_is_the_spread_ratio_over_the_training_sequence(scheme, mode):
    model = _mm(scheme, text_length=4, text_split=2, position_mode=mode)
    (pe,) = model.pe.encodings.values()  # RoPE-ND, or MHRoPE (a RoPE-ND with per-head frequencies)
    ref = _reference_positions(pe.scheme, 4, 2, (2, 4, 4), **pe.scheme_options)
    ref_spread = tuple((ref.amax(0) - ref.amin(0) + 1).tolist())
    assert pe.reference_spread() == ref_spread
    for clip, length in [((1, 3, 20, 32, 32), 4), ((1, 3, 4, 32, 64), 12), ((1, 3, 2, 24, 24), 2)]:
        _, layout = model.embed(torch.randn(clip), torch.randint(0, 32, (1, length)))
        assert pe.scaling(layout) == rope_scaling(mode, _spread(layout), ref_spread)
    assert min(pe.scaling(model.embed(torch.randn(1, 3, 20, 32, 64), torch.randint(0, 32, (1, 12)))[1]).ratios) > 1.5
    # the rotation is RoPE with the scaled frequencies (and YaRN's gain) at the layout's positions
    d = model.blocks[0].attn.head_dim
    _, layout = model.embed(torch.randn(1, 3, 20, 32, 32), torch.randint(0, 32, (1, 4)))
    scaling = rope_scaling(mode, _spread(layout), ref_spread)
    ladder = base_ladder(pe.theta, d // 2)
    freqs = scale_frequencies(pe.layer_frequencies(0), scaling, d, ref_spread, single_ladder_exponents(d), ladder)
    q = torch.randn(1, 2, layout.num_tokens, d)
    expect = apply_rotary(q, *scaled_cos_sin(layout.pos, freqs, 0, gain=yarn_temperature(scaling)))
    torch.testing.assert_close(_rotated(pe, layout, q), expect, rtol=0, atol=0)


def test_mm_rope1d_scales_by_the_token_length_ratio():
    model = _mm("rope1d", text_length=3, position_mode="ntk")
    _, layout = model.embed(torch.randn(1, 3, 6, 32, 48), torch.randint(0, 32, (1, 10)))
    trained = 2 + 2 * 4 * 4 + 3  # the markers, the 2 x 4 x 4 reference clip, 3 text ids
    assert model.pe.encodings["rope_nd"].scaling(layout).ratios == (layout.num_pos / trained,)
    assert layout.num_pos == 2 + 3 * 4 * 6 + 10


def test_mm_native_rows_scale_by_their_own_spread():
    model = _mm("videorope", text_length=2, position_mode="yarn")
    clips = [torch.randn(3, *shape) for shape in [(4, 32, 32), (16, 32, 32), (2, 16, 40), (10, 24, 16)]]
    text = torch.randint(0, 32, (len(clips), 5))
    with torch.no_grad():
        want = torch.cat([model(c[None], text[i : i + 1]) for i, c in enumerate(clips)])
        got = model.forward_head(model.forward_features(pack_images(clips, 8, tubelet=2), text))
        model.position_mode = "extrapolate"
        plain = torch.cat([model(c[None], text[i : i + 1]) for i, c in enumerate(clips)])
    # a row through the padded batch differs from it alone by fp32 reordering (~1e-6 of the logits' scale)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    assert (want[1] - plain[1]).abs().max() > 1e-4  # the long clip is scaled in its own row


def test_mm_position_mode_errors_and_pes_without_rotation():
    with pytest.raises(ValueError, match="position_mode must be one of"):
        timm.create_model("mm_n_mrope", **MM.tiny, position_mode="interpolate")
    with pytest.raises(ValueError, match="text_length"):
        timm.create_model("mm_n_mrope", **MM.tiny, text_length=-1)
    model = _mm("rope1d", pe="nope", pe_kwargs={})  # no rotary PE: ntk / yarn read as extrapolate
    pixels, text = torch.randn(1, 3, 16, 32, 48), torch.randint(0, 32, (1, 6))
    with torch.no_grad():
        plain = model(pixels, text)
        for mode in ("ntk", "yarn"):
            model.position_mode = mode
            assert torch.equal(model(pixels, text), plain)


def test_mm_reference_follows_set_input_size():
    model = _mm("mrope", position_mode="ntk")
    pe = model.pe.encodings["rope_nd"]
    model.set_input_size(num_frames=8, text_length=5)
    ref = _reference_positions("mrope", 5, 1, (4, 4, 4))
    assert pe.reference_spread() == tuple((ref.amax(0) - ref.amin(0) + 1).tolist())
    with torch.no_grad():
        text = torch.randint(0, 32, (1, 5))
        pixels = torch.randn(1, 3, 8, 32, 32)
        scaled = model(pixels, text)
        model.position_mode = "extrapolate"
        assert torch.equal(model(pixels, text), scaled)  # the new training sequence: nothing to scale


@pytest.mark.parametrize("key, value", [("text_split", 4), ("text_length", 6)])
def test_mm_reference_follows_text_split_and_length_set_after_construction(key, value):
    # videorope's training sequence depends on both: a model changed in place scales as one built with the value
    changed = _mm("videorope", text_length=4, text_split=0, position_mode="ntk")
    setattr(changed, key, value)
    built = _mm("videorope", **{"text_length": 4, "text_split": 0, key: value}, position_mode="ntk")
    built.load_state_dict(changed.state_dict())
    pe, want = changed.pe.encodings["rope_nd"], built.pe.encodings["rope_nd"].reference_spread()
    assert (
        pe.reference_spread()
        == want
        != _mm("videorope", text_length=4, text_split=0).pe.encodings["rope_nd"].reference_spread()
    )
    pixels, text = torch.randn(1, 3, 16, 32, 48), torch.randint(0, 32, (1, 8))
    with torch.no_grad():
        assert torch.equal(changed(pixels, text), built(pixels, text))
    with pytest.raises(ValueError, match=f"{key} .* must be an integer >= 0, got -1"):
        setattr(changed, key, -1)
