"""MRoPE-I (interleaved M-RoPE with spatial reset) and MHRoPE (one stream per head), Huang et al. (arXiv
2510.23095): the frequency-to-stream maps of the official rules, spatial reset's ids, text as exact 1D RoPE, the
per-head rotation and bad input. Expected values are written from the rules (JJJYmmm/Multimodal-RoPEs @ cd413b9e:
freq_allocation/mrope_i.py, freq_allocation/mhrope.py, pos_design/mrope_i.py), not computed by the code under test."""

from __future__ import annotations

import pytest
import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.tokens import TokenLayout
from visionpe.pos.base import AttnSpec, PEHost
from visionpe.pos.mhrope import MHRoPE, head_axes, head_frequencies, head_section
from visionpe.pos.mm_positions import frequency_matrix, position_ids, segment_layout, stream_of_pairs
from visionpe.pos.presets import PE_PRESETS
from visionpe.pos.rope_nd import RoPEND
from visionpe.pos.rotary import rotary_angles, rotary_cos_sin
from visionpe.zoo.multimodal_family import MM
from visionpe.zoo.video_family import VIDEO

RESET = dict(spatial_reset=True)


def _host(heads=4, head_dim=24, frames=2, grid=(4, 4)):
    return PEHost(heads * head_dim, grid, 0, (AttnSpec(heads * head_dim, heads, head_dim),) * 2, frames=frames)


# ---------------------------------------------------------------------------------------------- frequency maps


def test_mrope_i_map_at_head_dim_128_is_thw_twenty_times_then_tttt():
    # official: start all-t, pairs 1, 4, ... < 3 * 20 read h, pairs 2, 5, ... < 3 * 20 read w
    want = [0, 1, 2] * 20 + [0] * 4
    reads = stream_of_pairs("mrope_interleaved", 64, (24, 20, 20)).tolist()
    assert reads == want and stream_of_pairs("mrope_interleaved", 64).tolist() == want  # the default sections
    assert [reads.count(a) for a in range(3)] == [24, 20, 20]
    f = frequency_matrix("mrope_interleaved", 128, 10000.0)
    for c in (0, 1, 2, 59, 60, 63):  # each pair keeps the 1D ladder's frequency 10000^(-2c/128) on its stream
        assert f[want[c], c].item() == pytest.approx(10000.0 ** (-2 * c / 128), rel=1e-6)
        assert (f[:, c] != 0).sum() == 1


@pytest.mark.parametrize(
    "heads, want",
    [(8, (2, 3, 3)), (16, (4, 6, 6)), (12, (4, 4, 4)), (6, (2, 2, 2)), (4, (2, 1, 1)), (3, (1, 1, 1)), (2, (0, 1, 1))],
)
def test_mhrope_default_heads_per_axis_follow_the_official_two_three_three(heads, want):
    # the rule: n_h = n_w = max(1, floor(3 H / 8)), n_t = the rest; 8 heads give the official (2, 3, 3)
    assert head_section(heads) == want
    assert head_axes(heads) == [0] * want[0] + [1] * want[1] + [2] * want[2]


def test_mhrope_heads_use_every_frequency_on_their_axis_and_the_rest_none():
    f = head_frequencies(128, 8, 10000.0, (1, 2, 2))  # official order: t heads, h heads, w heads, then NoPE
    ladder = 10000.0 ** (-torch.arange(64, dtype=torch.float64) * 2 / 128)
    for h, axis in enumerate([0, 1, 1, 2, 2, -1, -1, -1]):
        for a in range(3):
            want = ladder if a == axis else torch.zeros(64, dtype=torch.float64)
            torch.testing.assert_close(f[a, h].double(), want, rtol=1e-6, atol=0)
    # p-RoPE: every head keeps its int(0.75 * 64) = 48 fastest pairs
    assert (head_frequencies(128, 8, 10000.0, None, p=0.75)[:, :, 48:] == 0).all()
    assert (head_frequencies(128, 8, 10000.0, None, p=0.75)[:, :, :48].sum(0) > 0).all()


@pytest.mark.parametrize(
    "heads, section, match",
    [
        (4, (2, 2, 2), "assigns 6 heads, a layer has 4"),
        (4, (0, 0, 0), "assigns 0 heads"),
        (4, (1, 1), "3 head counts"),
        (4, (1, -1, 1), "3 head counts"),
        (4, (1.5, 1, 1), "3 head counts"),
        (1, None, "a layer with 1 head cannot"),
    ],
)
def test_mhrope_refuses_impossible_head_sections(heads, section, match):
    with pytest.raises(ValueError, match=match):
        head_section(heads, section)


def test_mhrope_model_names_the_bad_head_section():
    with pytest.raises(ValueError, match="head_section"):
        timm.create_model("mm_n_mhrope", pe_kwargs={"mhrope": {"head_section": (3, 3, 3)}})


# ------------------------------------------------------------------------------------------------ spatial reset


def test_spatial_reset_ids_by_hand():
    # text 0 1 | a 2 x 3 image at s = 2: t = 2, h = row, w = col | the next text at s + max(H, W) = 5, as without reset
    got = position_ids("text:2 image:2x3 text:2", "mrope_interleaved", **RESET).t().tolist()
    assert got == [[0, 1, 2, 2, 2, 2, 2, 2, 5, 6], [0, 1, 0, 0, 0, 1, 1, 1, 5, 6], [0, 1, 0, 1, 2, 0, 1, 2, 5, 6]]
    plain = position_ids("text:2 image:2x3 text:2", "mrope_interleaved").t().tolist()
    assert plain[1] == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6] and plain[0] == got[0]  # only h, w move


def test_two_images_at_different_text_offsets_get_the_same_hw_ids_under_reset():
    spec = [("text", 3), ("image", (3, 4)), ("text", 7), ("image", (3, 4)), ("text", 2)]
    n = 3 * 4
    for reset, same in ((True, True), (False, False)):
        pos = position_ids(spec, "mrope_interleaved", spatial_reset=reset)
        first, second = pos[3 : 3 + n], pos[3 + n + 7 : 3 + 2 * n + 7]
        assert torch.equal(first[:, 1:], second[:, 1:]) is same
        # t carries the offset either way: 3, then 3 + max(3, 4) + 7 = 14
        assert first[:, 0].unique().tolist() == [3.0] and second[:, 0].unique().tolist() == [14.0]
    pos = position_ids(spec, "mrope_interleaved", **RESET)
    assert pos[3 : 3 + n, 1].tolist() == [float(r) for r in range(3) for _ in range(4)]  # rows from 0
    assert pos[3 : 3 + n, 2].tolist() == [float(c) for _ in range(3) for c in range(4)]  # columns from 0


@pytest.mark.parametrize("spec", ["text:3 image:3x4 text:2", "text:1 image:5x2 text:4 image:2x2 text:1",
                                  "text:2 video:3x2x3 text:3", "image:4x4 text:2"])  # fmt: skip
def test_the_token_after_a_visual_block_gets_the_same_ids_with_and_without_reset(spec):
    reset, plain = (position_ids(spec, "mrope_interleaved", spatial_reset=r) for r in (True, False))
    text = (plain[:, 0] == plain[:, 1]) & (plain[:, 1] == plain[:, 2]) & (reset[:, 1] == reset[:, 0])
    assert torch.equal(reset[text], plain[text]) and torch.equal(reset[:, 0], plain[:, 0])
    assert reset[-1].tolist() == plain[-1].tolist() == [plain[-1, 0].item()] * 3


def test_a_video_alone_resets_every_frame():
    # the video ViT's layout: frame k at t = k max(H, W) (as without reset), h / w from 0 in every frame
    pos = position_ids("video:3x2x4", "mrope_interleaved", **RESET)
    frames = pos.view(3, 8, 3)
    assert [frames[k, :, 0].unique().tolist() for k in range(3)] == [[0.0], [4.0], [8.0]]
    assert all(torch.equal(frames[k, :, 1:], frames[0, :, 1:]) for k in range(3))
    assert frames[0, :, 1].tolist() == [0.0] * 4 + [1.0] * 4 and frames[0, :, 2].tolist() == [0.0, 1, 2, 3] * 2


def test_spatial_reset_must_be_a_bool_and_only_for_the_interleaved_layout():
    with pytest.raises(ValueError, match="spatial_reset must be True or False"):
        position_ids("text:1 image:2x2", "mrope_interleaved", spatial_reset="yes")
    with pytest.raises(ValueError, match="does not take options"):
        position_ids("text:1 image:2x2", "mrope", spatial_reset=True)


# -------------------------------------------------------------------------------------------- the rotation


def _angles(pe, spec):
    layout = segment_layout(spec, pe.layout_scheme, 0, None, **pe.layout_options(False))
    return rotary_angles(layout.pos, pe.layer_frequencies(0)), layout


@pytest.mark.parametrize("preset", ["mrope_interleaved", "mrope_i", "mhrope"])
def test_text_alone_is_exact_1d_rope(preset):
    ((kind, options),) = PE_PRESETS[preset]
    pe = {"rope_nd": RoPEND, "mhrope": MHRoPE}[kind](_host(), theta=10000.0, **options)
    angles, _ = _angles(pe, "text:50")
    n = torch.arange(50, dtype=torch.float64)[:, None]
    want = n * 10000.0 ** (-torch.arange(12, dtype=torch.float64) * 2 / 24)  # [N, d/2]
    # float32 angles up to 49 rad: a few ulp (49 * 2^-24 ~ 3e-6)
    torch.testing.assert_close(angles.double(), want.expand_as(angles), rtol=0, atol=1e-5)


def test_an_mhrope_head_on_h_depends_on_h_only_and_nope_heads_do_not_rotate():
    pe = MHRoPE(_host(heads=6), head_section=(1, 2, 1), scheme_options=RESET)  # heads: t, h, h, w, NoPE, NoPE
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 50, (40, 3), generator=g).float()
    other = pos.clone()
    other[:, [0, 2]] = torch.randint(0, 50, (40, 2), generator=g).float()  # new t and w, the same h
    f = pe.layer_frequencies(0)
    a, b = rotary_angles(pos, f), rotary_angles(other, f)  # [H, N, d/2]
    assert torch.equal(a[1:3], b[1:3]) and not torch.equal(a[0], b[0]) and not torch.equal(a[3], b[3])
    ladder = 100.0 ** (-torch.arange(12) * 2 / 24)
    torch.testing.assert_close(a[1], pos[:, 1:2] * ladder, rtol=1e-6, atol=1e-5)  # h times every frequency
    # NoPE heads: cos 1, sin 0 exactly, so the rotation leaves them unchanged
    layout = TokenLayout(1, None, pos)  # a prefix token too
    q = torch.randn(2, 6, 41, 24)
    rq, _ = pe.context(0, layout).rotate(q, q)
    assert torch.equal(rq[:, 4:], q[:, 4:]) and torch.equal(rq[:, :, 0], q[:, :, 0])
    assert (rq[:, :4, 1:] - q[:, :4, 1:]).abs().max() > 0.1


def test_mhrope_rotation_preserves_norms_and_is_relative_per_head():
    pe = MHRoPE(_host(), scheme_options=RESET)
    pos = torch.tensor([[3.0, 1.0, 2.0], [7.0, 4.0, 0.0]])
    shifted = pos + torch.tensor([5.0, 2.0, 3.0])  # every stream shifted: q . k unchanged on every head
    q, k = torch.randn(1, 4, 2, 24), torch.randn(1, 4, 2, 24)
    dots = []
    for p in (pos, shifted):
        rq, rk = pe.context(0, TokenLayout(0, None, p)).rotate(q, k)
        torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=1e-5)
        dots.append((rq[..., 0, :] * rk[..., 1, :]).sum(-1))  # [1, H]: each head's q_0 . k_1
    torch.testing.assert_close(dots[0], dots[1], rtol=1e-4, atol=1e-4)


def test_riflex_lowers_one_frequency_of_the_t_heads_only():
    pe = MHRoPE(_host(frames=2), scheme_options=RESET)  # heads (2, 1, 1)
    pe.position_mode = "riflex"  # what the model's set_position_mode sets on its PEs
    layout = segment_layout("video:40x4x4", "mrope_interleaved", 0, None, **RESET)  # t spread 157 vs 5 in training
    col, freq = pe.riflex_change(0, layout)
    f = pe.layer_frequencies(0)
    cos, _ = pe._riflex_cos_sin(0, layout)  # [H, N, d]
    want = f.clone()
    want[0, :2, col] = freq
    torch.testing.assert_close(cos, rotary_cos_sin(rotary_angles(layout.pos, want))[0], rtol=0, atol=1e-6)
    assert freq == pytest.approx(0.9 * 2 * torch.pi / 157)


# ---------------------------------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", ["mm_n_mrope_i", "mm_n_mhrope", "vivit_n_mrope_i", "vivit_n_mhrope"])
def test_the_presets_on_their_models(name):
    model = timm.create_model(name)
    (pe,) = model.pe.encodings.values()
    assert pe.scheme == "mrope_interleaved" and pe.scheme_options == RESET
    assert pe.theta == (10000.0 if name.startswith("mm") else 100.0)  # the family's ladder base
    if "mhrope" in name:  # nano: 4 heads of 24 channels -> (2, 1, 1)
        assert pe.layer_frequencies(0).shape == (3, 4, 12)
        assert head_section(model.blocks[0].attn.num_heads) == (2, 1, 1)


def test_mm_image_hw_ids_do_not_depend_on_the_text_before_it_under_reset():
    for name, same in (("mm_n_mrope_i", True), ("mm_n_mrope_interleaved", False)):
        model = timm.create_model(name, **MM.tiny).eval()
        ids = []
        for split in (1, 4):  # 1 or 4 of the 5 text ids before the image
            _, layout, (start, grid) = model.embed_sequence(torch.randn(1, 3, 32, 32), torch.randint(0, 32, (1, 5)),
                                                            split)  # fmt: skip
            image = layout.pos[start : start + grid[0] * grid[1] * grid[2]]
            assert image[:, 0].unique().tolist() == [float(split + 1)]  # t: after the text and the <img> marker
            ids.append(image[:, 1:])
        assert torch.equal(ids[0], ids[1]) is same, name


def test_two_heads_give_mhrope_no_t_head_so_frames_differ_only_by_content():
    # the tiny test config (2 heads): (0, 1, 1); under reset every frame then has the same rotation
    model = timm.create_model("vivit_n_mhrope", **VIDEO.tiny).eval()
    (pe,) = model.pe.encodings.values()
    assert head_section(2) == (0, 1, 1) and (pe.layer_frequencies(0)[0] == 0).all()
    clip = torch.randn(1, 3, 4, 32, 32)
    swapped = clip[:, :, [2, 3, 0, 1]]  # the two tubelets swapped
    with torch.no_grad():
        out, out_swapped = model(clip), model(swapped)
    # no position tells the tubelets apart: the class token sees the same set of tokens (fp32 sums in another order)
    torch.testing.assert_close(out, out_swapped, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()
