"""Position builders of interleaved text / visual sequences: the checks of REFERENCES.md, "Video and multimodal
position ids" (VRoPE worked example, V2PE steps and markers, M-RoPE's next-text rule, VideoRoPE's spacing and
centring, pure text == 1D RoPE, shift invariance of fractional positions)."""

from __future__ import annotations

import math

import pytest
import torch

from visionpe.layout.tokens import video_layout
from visionpe.pos.mm_positions import (
    SCHEMES,
    V2PE_DELTAS,
    frequency_matrix,
    parse_segments,
    position_ids,
    segment_layout,
    stream_of_pairs,
)
from visionpe.pos.rotary import apply_rotary, rope_frequencies, rotary_angles, rotary_cos_sin

EXAMPLE = [("text", 3), ("video", (2, 2, 3)), ("text", 2)]


# --------------------------------------------------------------------------------------------------------- VRoPE


def test_vrope_worked_example_stream_a0():
    pos = position_ids(EXAMPLE, "vrope")
    assert pos.dtype == torch.float32 and pos.shape == (17, 4)
    assert pos[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11, 12]


def test_vrope_all_four_variants_follow_the_definition():
    pos = position_ids(EXAMPLE, "vrope")
    T, H, W, s = 2, 2, 3, 3
    rows = []
    for t in range(T):
        for h in range(H):
            for w in range(W):
                base = t * (H + W - 1) + s
                hr, wr = H - 1 - h, W - 1 - w
                rows.append([h + w + base, h + wr + base, hr + w + base, hr + wr + base])
    assert pos[3:15].tolist() == rows


def test_text_rows_are_equal_across_streams():
    for scheme in ("rope3d", "mrope", "videorope", "vrope"):
        pos = position_ids(EXAMPLE, scheme)
        text = torch.cat([pos[:3], pos[15:]])
        assert (text == text[:, :1]).all(), scheme


def test_vrope_diagonals_are_symmetric_per_frame():
    pos = position_ids([("text", 2), ("video", (3, 4, 5)), ("text", 1)], "vrope")
    vis = pos[2:-1].view(3, 20, 4)  # [T, H*W, 4]
    a0, a1, a2, a3 = vis.unbind(-1)
    # exact: integer (or half-integer) positions far below 2^24 make every fp32 sum here exact
    assert torch.equal(a0 + a3, a1 + a2)
    sums = a0 + a3  # one value per frame: each frame is centred on one index
    assert (sums == sums[:, :1]).all()
    assert torch.equal(sums[:, 0], 2 * (2 + torch.arange(3.0) * (4 + 5 - 1)) + (4 - 1) + (5 - 1))


def test_vrope_first_text_after_video_continues_the_running_index():
    pos = position_ids(EXAMPLE, "vrope")
    assert pos[15].tolist() == [11.0] * 4  # s + T (H + W - 1) = 3 + 2 * 4
    assert pos[16].tolist() == [12.0] * 4
    assert pos[15, 0] == pos[:15].max() + 1


# ---------------------------------------------------------------------------------------------------------- V2PE


@pytest.mark.parametrize(
    "spec",
    [
        EXAMPLE,
        [("video", (2, 3, 3)), ("text", 4)],
        "text:2 image:3x4 text:1 video:2x2x2 text:3",
        "image:2x2 video:1x2x2",
    ],
)
def test_v2pe_with_delta_one_is_arange(spec):
    pos = position_ids(spec, "v2pe", delta=1.0)
    assert pos.shape[1] == 1
    assert torch.equal(pos[:, 0], torch.arange(pos.shape[0], dtype=torch.float32))  # exact: small integers in fp32


def _kinds(spec) -> list[str]:
    return [k for k, size in parse_segments(spec) for _ in range(size if k == "text" else math.prod(size))]


@pytest.mark.parametrize("delta", [0.5, 0.25, 1 / 16, 1 / 256])
def test_v2pe_steps_and_marker_rule(delta):
    spec = "text:3 video:2x3x5 text:4 image:3x3 text:2"
    pos = position_ids(spec, "v2pe", delta=delta)[:, 0].double()
    kinds = _kinds(spec)
    steps = pos[1:] - pos[:-1]
    assert (steps > 0).all()  # strictly increasing
    for i in range(1, len(kinds)):
        if kinds[i] == "video":  # visual steps (from the opening marker too) equal delta
            # deltas are powers of 2 and positions < 2^7: fp32 holds every position exactly, so steps are exact
            assert steps[i - 1].item() == pytest.approx(delta, abs=1e-6)
        elif kinds[i - 1] == "text":  # text steps equal 1
            assert steps[i - 1].item() == 1.0
    # closing marker: ceil(p + N * delta) + 1, p = the opening marker's position
    p, n = pos[2].item(), 30
    assert pos[3 + n].item() == math.ceil(p + n * delta) + 1
    p2, n2 = pos[3 + n + 3].item(), 9
    assert pos[3 + n + 4 + n2].item() == math.ceil(p2 + n2 * delta) + 1


def test_v2pe_inference_uses_a_fixed_delta_and_training_draws_per_image():
    spec = "text:2 image:4x4 text:1 image:4x4 text:1"
    eval_pos = [position_ids(spec, "v2pe") for _ in range(3)]
    assert all(torch.equal(eval_pos[0], p) for p in eval_pos)
    assert (eval_pos[0][3:18, 0] - eval_pos[0][2:17, 0]).unique().tolist() == [0.25]  # default inference delta
    g = torch.Generator().manual_seed(0)
    drawn = []
    for _ in range(40):
        pos = position_ids(spec, "v2pe", training=True, generator=g)[:, 0]
        d1, d2 = (pos[3] - pos[2]).item(), (pos[3 + 16 + 1 + 1] - pos[3 + 16 + 1]).item()
        drawn.append((d1, d2))
    values = {d for pair in drawn for d in pair}
    assert values <= set(V2PE_DELTAS) and len(values) >= 5
    assert any(d1 != d2 for d1, d2 in drawn)  # drawn per image, not per sequence


def test_rope_score_is_unchanged_by_a_common_shift_of_fractional_positions():
    torch.manual_seed(0)
    d = 32
    for scheme in ("v2pe", "vrope", "mrope"):
        pos = position_ids("text:3 video:2x3x3 text:2", scheme, **({"delta": 0.25} if scheme == "v2pe" else {}))
        freqs = frequency_matrix(scheme, d, theta=100.0)
        q, k = torch.randn(2, 1, 1, pos.shape[0], d).unbind(0)

        def scores(p, freqs=freqs, q=q, k=k):
            cos, sin = rotary_cos_sin(rotary_angles(p, freqs))
            return apply_rotary(q, cos, sin) @ apply_rotary(k, cos, sin).transpose(-1, -2)

        base = scores(pos)
        for shift in (0.375, 7.125):
            # the shifted angles (<= ~40 rad) round differently, by ~40 eps ~ 2.4e-6 each; summed over 32 dims
            # with |q||k| ~ 32 the scores differ by ~32 * 2.4e-6 ~ 8e-5
            torch.testing.assert_close(scores(pos + shift), base, atol=2e-4, rtol=1e-4)
        # scaling positions changes scores by O(1), far above 1e-2
        assert not torch.allclose(scores(pos * 1.5), base, atol=1e-2)  # but positions do matter


# -------------------------------------------------------------------------------------------- M-RoPE / VideoRoPE


def test_mrope_text_streams_and_next_text_rule():
    pos = position_ids([("text", 2), ("video", (2, 3, 4)), ("text", 2)], "mrope")
    assert pos[:2].tolist() == [[0, 0, 0], [1, 1, 1]]
    vis = pos[2:26]
    assert vis.min(0).values.tolist() == [2, 2, 2]  # the block starts at previous max + 1
    assert vis.max(0).values.tolist() == [2 + 1, 2 + 2, 2 + 3]  # t, h, w ranges
    assert pos[26].tolist() == [6, 6, 6] and pos[27].tolist() == [7, 7, 7]  # max over all streams (5) + 1
    # the rule in the VRoPE example too: w reaches 5 so the text after starts at 6
    assert position_ids(EXAMPLE, "mrope")[15].tolist() == [6, 6, 6]


def test_mrope_sections_read_t_then_h_then_w():
    reads = stream_of_pairs("mrope", 64)
    assert reads.tolist() == [0] * 16 + [1] * 24 + [2] * 24
    assert stream_of_pairs("mrope", 32).tolist() == [0] * 8 + [1] * 12 + [2] * 12


def test_videorope_spacing_centring_and_frequencies():
    T, H, W = 3, 4, 5
    pos = position_ids([("text", 3), ("video", (T, H, W)), ("text", 1)], "videorope", temporal_stride=2)
    vis = pos[3:-1].view(T, H, W, 3)
    for t in range(T):
        for h in range(H):
            for w in range(W):
                ti = 3 + 2 * t
                assert vis[t, h, w].tolist() == [ti, ti + h - (H - 1) // 2, ti + w - (W - 1) // 2]
    assert pos[-1].tolist() == [vis[..., 0].max().item() + 1] * 3  # the last temporal index + 1 (official code)
    reads = stream_of_pairs("videorope", 64)
    assert reads[48:].tolist() == [0] * 16  # the lowest-frequency quarter reads t
    assert reads[:48].tolist() == [1, 2] * 24  # the rest alternate h, w
    f = frequency_matrix("videorope", 128)
    assert f[0].max() < f[1:].max(0).values[f[1:].max(0).values > 0].min()  # t gets the lowest frequencies


# ----------------------------------------------------------------------------------------------- all schemes


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "hope"])  # HoPE zeroes its temporal pairs (its test)
def test_pure_text_reduces_to_1d_rope(scheme):
    n, d = 11, 24
    pos = position_ids([("text", n)], scheme)
    assert (pos == torch.arange(n, dtype=torch.float32)[:, None]).all()
    angles = rotary_angles(pos, frequency_matrix(scheme, d, theta=10000.0))
    expected = torch.arange(n, dtype=torch.float32)[:, None] * rope_frequencies(d // 2, 10000.0)[None]
    # one fp32 product per entry either way (the other streams' terms are exact zeros): within 1 ulp, inside
    # assert_close's fp32 defaults (rtol 1.3e-6)
    torch.testing.assert_close(angles, expected)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "hope"])  # HoPE's t pairs: frequency 0 (its test)
def test_each_rotary_pair_reads_one_stream_with_the_1d_ladder(scheme):
    f = frequency_matrix(scheme, 64, theta=100.0)
    assert f.shape == (position_ids("text:1", scheme).shape[1], 32)
    assert ((f != 0).sum(0) == 1).all()
    # a sum of one non-zero and zeros is exact; both sides use the fp32 1D ladder: within 1 ulp (fp32 defaults)
    torch.testing.assert_close(f.sum(0), rope_frequencies(32, 100.0))
    assert ((f != 0).sum(1) > 0).all()  # every stream is read by some pair


def test_rope3d_of_one_video_is_the_video_layout():
    assert torch.equal(position_ids("video:3x4x5", "rope3d"), video_layout(3, 4, 5).pos)
    layout = segment_layout([("video", (3, 4, 5))], "vrope", num_prefix=1)
    assert layout.grid == (3, 4, 5) and layout.num_prefix == 1 and layout.streams == 4
    assert segment_layout(EXAMPLE, "mrope").grid is None


def test_string_and_tuple_specs_agree():
    assert parse_segments("text:3 video:2x2x3 text:2") == parse_segments(EXAMPLE)
    assert parse_segments("text(3), image(4x5)") == (("text", 3), ("video", (1, 4, 5)))
    assert parse_segments([("image", (4, 5))]) == (("video", (1, 4, 5)),)
    for scheme in SCHEMES:
        assert torch.equal(position_ids("text:3 video:2x2x3 text:2", scheme), position_ids(EXAMPLE, scheme))


def test_positions_returned_to_users_are_copies():
    a = position_ids(EXAMPLE, "mrope")
    a.zero_()
    assert position_ids(EXAMPLE, "mrope").max() > 0


# --------------------------------------------------------------------------------------------------- bad input


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown position scheme 'vrop'.*did you mean 'vrope'"):
        position_ids(EXAMPLE, "vrop")
    with pytest.raises(ValueError, match="unknown position scheme"):
        frequency_matrix("rope2d", 64)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("text:3 vid", "cannot parse 'vid'"),
        ("text:3 audio:4", "unknown segment kind 'audio'"),
        ("video:2x2", r"takes \(T, H, W\)"),
        ("image:2x2x2", r"takes \(H, W\)"),
        ("text:0", "at least 1"),
        ([("text", 2.5)], "expected an integer"),
        ([("text", (1, 2))], "takes a token count"),
        ([("video", (2, -1, 3))], "at least 1"),
        ([("text",)], "expected a \\(kind, size\\) pair"),
        ([], "empty segment spec"),
        (42, "cannot parse a segment spec of type int"),
    ],
)
def test_unparsable_segment_specs_are_clear_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        position_ids(spec, "mrope")


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="does not take options \\['delta'\\]"):
        position_ids(EXAMPLE, "vrope", delta=0.5)
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\]"):
        position_ids(EXAMPLE, "v2pe", delta=2.0)
    with pytest.raises(ValueError, match="3 streams but head dim 4"):
        frequency_matrix("mrope", 4)
