"""p-RoPE (Barbero et al., ICLR 2025) as the `p` option of every rotary PE, and RIFLEx (Zhao et al., ICML 2025) as
the `riflex` test-time position mode of the RoPE-ND schemes with a time stream.

Fidelity: p-RoPE against transformers' `proportional` RoPE (the same operation; no author code) and its formula
re-derived here; RIFLEx against the official thu-ml/RIFLEx `get_1d_rotary_pos_embed_riflex` / `identify_k`, re-derived
here from that code. Properties: p-RoPE's dropped pairs are exactly position-free and its kept pairs equal plain
RoPE's; RIFLEx's intrinsic frequency turns less than once over the test length and nothing else changes."""

from __future__ import annotations

import math

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.layout.tokens import image_layout
from visionpe.pos import AttnSpec, PEHost, RoPE2D
from visionpe.pos.mm_positions import segment_layout, stream_of_pairs
from visionpe.pos.presets import PE_PRESETS, build_pos_encoding
from visionpe.pos.rope2d_dinov3 import RoPE2DDinoV3
from visionpe.pos.rope_nd import TIME_SCHEMES, RoPEND
from visionpe.pos.rope_scaling import identify_k, intrinsic_index, riflex_frequency, rope_period
from visionpe.pos.rotary import p_rope_keep
from visionpe.position_modes import ALL_MODES
from visionpe.zoo.multimodal_family import example_input as mm_input

D = 24  # head dim: 12 rotary pairs, 6 per 2D axis, 4 per rope3d stream


def _host(head_dim=D, heads=2, grid=(4, 4), prefix=1, frames=1, reference=None):
    dim = heads * head_dim
    layers = (AttnSpec(dim, heads, head_dim),) * 2
    return PEHost(dim, grid, prefix, layers, frames=frames, reference_segments=reference)


# ----------------------------------------------------------------------------------------------------- p-RoPE


def proportional_inv_freq(head_dim: int, theta: float, p: float) -> torch.Tensor:
    """transformers' proportional RoPE in our words: the first int(p * head_dim // 2) pairs keep the full-head-dim
    ladder theta^(-2i / head_dim), the remaining pairs up to head_dim / 2 get frequency 0."""
    kept = int(p * head_dim // 2)
    ladder = 1.0 / theta ** (torch.arange(0, 2 * kept, 2, dtype=torch.float32) / head_dim)
    return torch.cat([ladder, torch.zeros(head_dim // 2 - kept)])


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.75, 0.9, 1.0])
@pytest.mark.parametrize("head_dim", [24, 64])
def test_p_rope_1d_frequencies_are_transformers_proportional_rope(p, head_dim):
    pe = RoPEND(_host(head_dim), scheme="rope1d", theta=10000.0, p=p)
    ours = pe.layer_frequencies(0)[0]
    assert (ours - proportional_inv_freq(head_dim, 10000.0, p)).abs().max() < 1e-7  # the fp32 ladder
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_proportional_rope_parameters

    cfg = transformers.PretrainedConfig(
        hidden_size=2 * head_dim, num_attention_heads=2,
        rope_parameters=dict(rope_type="proportional", rope_theta=10000.0, partial_rotary_factor=p),
    )  # fmt: skip
    official, _ = _compute_proportional_rope_parameters(cfg)
    assert (ours - official).abs().max() < 1e-7


def test_p_rope_1d_rotation_is_the_proportional_formula_on_q():
    # the whole rotation of q: our kernel against cos / sin of pos * inv_freq on interleaved pairs, re-derived
    pe = RoPEND(_host(), scheme="rope1d", theta=10000.0, p=0.75).eval()
    layout = segment_layout([("text", 40)], "rope1d", 1)
    q = torch.randn(1, 2, layout.num_tokens, D)
    angle = layout.pos[:, :1] * proportional_inv_freq(D, 10000.0, 0.75)[None]  # [N, d/2]
    a, b = q[..., 1:, 0::2], q[..., 1:, 1::2]
    expect = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1).flatten(-2)
    got = pe.context(0, layout).rotate(q, q)[0]
    assert (got[..., 1:, :] - expect).abs().max() < 1e-5  # fp32 angles up to 40 rad
    assert torch.equal(got[..., :1, :], q[..., :1, :])  # the prefix token is not rotated


def test_p_rope_keeps_the_top_fraction_of_each_ladder():
    ladders = [0, 0, 0, 0, 1, 1, 1, 1, 2, 0, 2, 2]  # interleaved ladders keep their own order
    keep = p_rope_keep(ladders, 0.5)  # int(0.5 n) of each ladder's n = 5, 4, 3 pairs
    assert keep.tolist() == [True, True, False, False, True, True, False, False, True, False, False, False]
    assert not p_rope_keep(ladders, 0.0).any() and p_rope_keep(ladders, 1.0).all()


def _pair_channels(pairs, head_dim, half):
    """The channels of rotary pairs: (2c, 2c + 1) interleaved, (c, c + d/2) rotate-half."""
    pairs = torch.as_tensor(pairs)
    return torch.cat([pairs, pairs + head_dim // 2]) if half else torch.cat([2 * pairs, 2 * pairs + 1])


ROTARY = [  # (constructor, its layout, rotate-half layout, the ladder of each pair)
    ("rope2d_axial", lambda **kw: RoPE2D(_host(), mode="axial", **kw), False, torch.arange(D // 2) // (D // 4)),
    ("rope2d_mixed", lambda **kw: RoPE2D(_host(), mode="mixed", **kw), False, torch.arange(D // 2) // (D // 4)),
    ("dinov3", lambda **kw: RoPE2DDinoV3(_host(), **kw), True, torch.arange(D // 2) // (D // 4)),
    ("rope3d", lambda **kw: RoPEND(_host(frames=2), scheme="rope3d", **kw), False, stream_of_pairs("rope3d", D // 2)),
    ("mrope", lambda **kw: RoPEND(_host(frames=2), scheme="mrope", **kw), False, stream_of_pairs("mrope", D // 2)),
    ("videorope", lambda **kw: RoPEND(_host(frames=2), scheme="videorope", **kw), False,
     stream_of_pairs("videorope", D // 2)),
]  # fmt: skip


def _layout(name):
    if name in ("rope2d_axial", "rope2d_mixed", "dinov3"):
        return image_layout(5, 7, 1)
    return segment_layout([("video", (3, 4, 5))], name, 1)


@pytest.mark.parametrize("name, build, half, ladders", ROTARY, ids=[r[0] for r in ROTARY])
@pytest.mark.parametrize("p", [0.75, 0.5])
def test_p_rope_dropped_pairs_are_position_free_and_kept_pairs_are_plain_ropes(name, build, half, ladders, p):
    torch.manual_seed(0)
    plain = build().eval()
    torch.manual_seed(0)  # RoPE-Mixed: the same drawn frequencies
    ours = build(p=p).eval()
    layout = _layout(name)
    q = torch.randn(1, 2, layout.num_tokens, D)
    own = plain.layer(0)  # layer 0's own state (RoPE-Mixed: its drawn frequencies), the same for both
    got, ref = ours.context(0, layout, None, own).rotate(q, q)[0], plain.context(0, layout, None, own).rotate(q, q)[0]
    keep = p_rope_keep(ladders.tolist(), p)
    dropped, kept = _pair_channels(torch.where(~keep)[0], D, half), _pair_channels(torch.where(keep)[0], D, half)
    per_ladder = [int((ladders == a).sum()) for a in ladders.unique()]
    assert int((~keep).sum()) == sum(n - int(p * n) for n in per_ladder)
    assert torch.equal(got[..., dropped], q[..., dropped])  # identity at every position: no position information
    assert torch.equal(got[..., kept], ref[..., kept])  # bit for bit the plain RoPE's rotation


def test_p_rope_mixed_frequencies_of_dropped_pairs_get_no_gradient():
    torch.manual_seed(0)
    rope = RoPE2D(_host(), mode="mixed", p=0.5)
    layout = image_layout(4, 4, 1)
    q = torch.randn(1, 2, layout.num_tokens, D)
    own = rope.layer(0)
    rope.context(0, layout, None, own).rotate(q, q)[0].square().sum().backward()
    keep = p_rope_keep([c // (D // 4) for c in range(D // 2)], 0.5)
    grad = own.freqs.grad  # [2, heads, d/2] of layer 0
    assert (grad[..., ~keep] == 0).all() and (grad[..., keep] != 0).any()


def test_p_rope_dinov3_drops_the_longest_periods():
    pe = RoPE2DDinoV3(_host(), p=0.5)
    periods = pe.periods(D)
    assert torch.isinf(periods[3:]).all() and torch.isfinite(periods[:3]).all()
    assert (pe.frequencies(D)[:, [3, 4, 5, 9, 10, 11]] == 0).all()


@pytest.mark.parametrize("pe", ["rope2d_mixed", "rope2d_dinov3", "rope3d"])
def test_p_rope_models_built_on_meta_reload_exactly(pe):
    from timm.models._manipulate import reinit_non_persistent_buffers

    name, kw = ("vivit_n_" if pe == "rope3d" else "vit_n_") + pe, dict(pe_kwargs=dict(p=0.5))
    ref = timm.create_model(name, **kw).eval()
    with torch.device("meta"):
        model = timm.create_model(name, **kw)
    model = model.to_empty(device="cpu").eval()
    model.load_state_dict(ref.state_dict())
    reinit_non_persistent_buffers(model)
    x = torch.randn(1, 3, 8, 32, 32) if pe == "rope3d" else torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))


@pytest.mark.parametrize("preset", ["rope2d", "rope2d_mixed", "rope2d_ape", "rope2d_dinov3", "rope3d", "mrope", "hope"])
def test_p_is_a_pe_kwargs_option_of_every_rotary_preset(preset):
    host = _host(frames=2) if preset in ("rope3d", "mrope", "hope") else _host()  # the layout each PE is built for
    stack = build_pos_encoding(preset, host, dict(p=0.5))
    rotary = [pe for pe in stack.encodings.values() if hasattr(pe, "p")]
    assert rotary and all(pe.p == 0.5 for pe in rotary)


@pytest.mark.parametrize("p", [1.5, -0.1, "half", True])
def test_p_outside_zero_one_is_a_one_line_error(p):
    with pytest.raises(ValueError, match=r"p \(p-RoPE|must be a finite number") as e:
        build_pos_encoding("rope2d", _host(), dict(p=p))
    assert "\n" not in str(e.value)


def test_p_on_a_preset_without_rotary_frequencies_is_refused():
    with pytest.raises(ValueError, match="not taken by any PE"):
        build_pos_encoding("ape", _host(), dict(p=0.5))
    with pytest.raises(ValueError, match="not taken by any PE"):
        build_pos_encoding("liere", _host(), dict(p=0.5))  # learned generators: no frequency ladder to cut


@pytest.mark.parametrize("name", ["vit_n_rope2d_p", "swin_n_rope2d_p", "cvt_n_rope2d_p", "vivit_n_rope3d_p",
                                  "mm_n_rope1d_p"])  # fmt: skip
def test_p_rope_presets_hold_p_three_quarters(name):
    model = timm.create_model(name)
    rotary = [pe for pe in model.modules() if isinstance(pe, (RoPE2D, RoPEND))]
    assert rotary and all(pe.p == 0.75 for pe in rotary)
    preset = name.split("_", 2)[2]
    assert PE_PRESETS[preset][0][1]["p"] == 0.75 and model.pretrained_cfg["paper_ids"] == "arXiv:2410.06205"


# ----------------------------------------------------------------------------------------------------- RIFLEx


def official_riflex_angles(freqs: torch.Tensor, pos: torch.Tensor, k: int, test_length: int) -> torch.Tensor:
    """thu-ml/RIFLEx's 1D RoPE in our words: component k (1-based) of the ladder becomes 0.9 * 2 pi / L_test, then
    angle = outer(pos, freqs)."""
    freqs = freqs.clone()
    freqs[k - 1] = 0.9 * 2 * torch.pi / test_length
    return torch.outer(pos, freqs)


def official_identify_k(base: float, dim: int, repeat: int) -> tuple[int, int]:
    """thu-ml/RIFLEx's identify_k in our words: periods round(2 pi / base^(-2(j - 1) / dim)), k = 1 + the index of
    the period nearest the repetition frame (the first on ties), and that period."""
    periods = [round(2 * math.pi * base ** (2 * (j - 1) / dim)) for j in range(1, dim // 2 + 1)]
    diffs = [abs(n - repeat) for n in periods]
    k = diffs.index(min(diffs)) + 1
    return k, periods[k - 1]


def _ladder_periods(base, dim):
    return [rope_period(f) for f in (base ** (-torch.arange(0, dim, 2).double() / dim)).tolist()]


@pytest.mark.parametrize("base, dim, repeat, k, period", [(256, 16, 48, 4, 50), (10000, 16, 20, 2, 20)])
def test_riflex_identify_k_matches_the_official_examples(base, dim, repeat, k, period):
    assert official_identify_k(base, dim, repeat) == (k, period)  # HunyuanVideo, CogVideoX-5B (the official code)
    periods = _ladder_periods(base, dim)
    assert identify_k(periods, repeat) == k and periods[k - 1] == period
    for n in range(1, 300):
        assert identify_k(periods, n) == official_identify_k(base, dim, n)[0]


@pytest.mark.parametrize("base, dim, train, k", [(256, 16, 33, 4), (10000, 16, 13, 2)])
def test_riflex_default_intrinsic_frequency_is_the_officially_chosen_one(base, dim, train, k):
    # HunyuanVideo trains on 33 latent frames (the official k = 4), CogVideoX-5B on 13 (k = 2): the fastest
    # component whose period exceeds the training length is the one the official scripts pass
    assert intrinsic_index(_ladder_periods(base, dim), train) == k - 1
    assert intrinsic_index(_ladder_periods(base, dim), train, k=3) == 2
    assert intrinsic_index(_ladder_periods(base, dim), 10**6) is None  # every component turned in training


def test_riflex_official_numbers():
    # HunyuanVideo 33 -> 66 latent frames: theta_4 = 0.125 -> 0.0857; CogVideoX 13 -> 25: theta_2 0.3162 -> 0.2262
    assert abs(riflex_frequency(66) - 0.0857) < 1e-4 and abs(riflex_frequency(25) - 0.2262) < 1e-4


def _video_pe(scheme="rope3d", frames=4, mode="riflex", **kw):
    pe = RoPEND(_host(frames=frames), scheme=scheme, theta=100.0, **kw).eval()
    pe.position_mode = mode  # what the model's set_position_mode sets on its PEs
    return pe


def test_riflex_time_angles_are_the_official_function_side_by_side():
    pe = _video_pe(frames=4)  # rope3d: time pairs 0, 3, 6, 9 with periods 6, 20, 63, 199; trained on 4 frames
    cols, periods = pe._time_periods[D]
    assert periods == [6.0, 20.0, 63.0, 199.0]
    layout = segment_layout([("video", (12, 3, 3))], "rope3d", 1)  # 12 frames > period 6: k = 1 changes
    q = torch.randn(1, 2, layout.num_tokens, D)
    got = pe.context(0, layout).rotate(q, q)[0][..., 1:, :]
    pos_t = layout.pos[:, 0]
    angle = official_riflex_angles(pe.layer_frequencies(0)[0, cols].double(), pos_t.double(), 1, 12)
    ch = _pair_channels(torch.tensor(cols), D, False)
    a, b = q[..., 1:, ch[: len(cols)]].double(), q[..., 1:, ch[len(cols) :]].double()
    expect = torch.stack([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)
    got_t = torch.stack([got[..., ch[: len(cols)]], got[..., ch[len(cols) :]]], -1).double()
    assert (got_t - expect).abs().max() < 1e-5  # fp32 against float64: angles up to 11 rad


def test_riflex_intrinsic_period_covers_the_test_length_and_nothing_else_changes():
    pe, plain = _video_pe(frames=4), _video_pe(frames=4, mode="extrapolate")
    layout = segment_layout([("video", (12, 3, 3))], "rope3d", 1)
    col, freq = pe.riflex_change(0, layout)
    assert col == 0 and 12 * freq == pytest.approx(0.9 * 2 * math.pi) and 12 * freq < 2 * math.pi
    q = torch.randn(1, 2, layout.num_tokens, D)
    got, ref = pe.context(0, layout).rotate(q, q)[0], plain.context(0, layout).rotate(q, q)[0]
    others = torch.tensor([c for c in range(D) if c // 2 != col])
    assert torch.equal(got[..., others], ref[..., others])  # other time pairs and the spatial streams bit for bit
    assert not torch.equal(got, ref)


@pytest.mark.parametrize("frames", [4, 6])  # the training length; 6 = the intrinsic period (the official rule: >)
def test_riflex_changes_nothing_within_the_intrinsic_period(frames):
    pe, plain = _video_pe(frames=4), _video_pe(frames=4, mode="extrapolate")
    layout = segment_layout([("video", (frames, 3, 3))], "rope3d", 1)
    assert pe.riflex_change(0, layout) is None
    q = torch.randn(1, 2, layout.num_tokens, D)
    assert torch.equal(pe.context(0, layout).rotate(q, q)[0], plain.context(0, layout).rotate(q, q)[0])


def test_riflex_k_and_repeat_pick_the_component():
    layout = segment_layout([("video", (70, 2, 2))], "rope3d", 1)
    assert _video_pe(riflex_k=3).riflex_change(0, layout)[0] == 6  # the third time pair
    assert _video_pe(riflex_repeat=50).riflex_change(0, layout)[0] == 6  # nearest period to 50: 63
    assert _video_pe(riflex_k=3).riflex_change(0, segment_layout([("video", (63, 2, 2))], "rope3d", 1)) is None


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(riflex_k=5), "not among the 4 time pairs"),
        (dict(riflex_k=2.0), "1-based index"),
        (dict(riflex_k=1, riflex_repeat=6), "not both"),
        (dict(riflex_k=4, p=0.75), "p-RoPE dropped"),
        (dict(riflex_k=1, scheme="vrope"), "has none"),
        (dict(riflex_k=1, scheme="hope"), "has none"),
    ],
)
def test_riflex_options_refuse_bad_input_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        _video_pe(**kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("scheme", ["rope1d", "v2pe", "vrope", "hope"])
def test_riflex_leaves_schemes_without_a_rotating_time_stream_alone(scheme):
    pe, plain = _video_pe(scheme), _video_pe(scheme, mode="extrapolate")
    layout = segment_layout([("video", (12, 3, 3))], scheme, 1)
    q = torch.randn(1, 2, layout.num_tokens, D)
    assert torch.equal(pe.context(0, layout).rotate(q, q)[0], plain.context(0, layout).rotate(q, q)[0])


def test_riflex_with_p_rope_never_revives_a_dropped_pair():
    pe = _video_pe(frames=4, p=0.5)  # time pairs 0, 3 kept (periods 6, 20), 6 and 9 dropped
    assert pe._time_periods[D][1] == [6.0, 20.0, math.inf, math.inf]
    assert pe.riflex_change(0, segment_layout([("video", (30, 2, 2))], "rope3d", 1))[0] == 0  # 4 frames < 6
    trained_long = _video_pe(frames=40, p=0.5)  # every kept period within the training length: no change
    assert trained_long.riflex_change(0, segment_layout([("video", (80, 2, 2))], "rope3d", 1)) is None


def test_riflex_is_a_mode_of_the_video_and_multimodal_models_only():
    assert set(TIME_SCHEMES) >= {"rope3d", "mrope", "videorope", "mrope_interleaved"}
    assert "riflex" in ALL_MODES
    torch.manual_seed(0)
    video = timm.create_model("vivit_n_rope3d").eval()  # trained on 8 frames = 4 tubelet frames
    clip = torch.randn(1, 3, 16, 32, 32)
    with torch.no_grad():
        base, trained = video(clip), video(clip[:, :, :8])
        video.position_mode = "riflex"
        assert not torch.equal(video(clip), base)  # 8 tubelet frames > the intrinsic period 6
        assert torch.equal(video(clip[:, :, :8]), trained)  # the training length: unchanged
    mm = timm.create_model("mm_n_mrope", position_mode="riflex").eval()
    assert mm(**mm_input(32, batch=1, frames=12)).shape == (1, 1000)
    vit = timm.create_model("vit_n_rope2d")
    with pytest.raises(ValueError, match="position_mode must be one of"):
        vit.position_mode = "riflex"
