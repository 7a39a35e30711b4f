"""Qwen3-VL's interleaved M-RoPE against transformers' Qwen3-VL (position ids token for token, cos/sin layout) and
HoPE's layout (temporal pairs an exact identity) and dynamic temporal scaling."""

import pytest
import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.pos import AttnSpec, PEHost
from visionpe.pos.mm_positions import (
    HOPE_SCALES,
    frequency_matrix,
    position_ids,
    segment_layout,
    stream_of_pairs,
)
from visionpe.pos.rope_nd import RoPEND
from visionpe.pos.rotary import rope_frequencies

HEAD_DIM = 64  # 32 pairs: Qwen3-VL's [24, 20, 20] of 64 scales to [12, 10, 10]


def _rope(scheme, head_dim=HEAD_DIM, theta=10000.0, **kw):
    host = PEHost(dim=head_dim, grid=(4, 4), num_prefix=0, layers=(AttnSpec(head_dim, 1, head_dim),))
    return RoPEND(host, scheme=scheme, theta=theta, **kw)


@pytest.fixture(scope="module")
def qwen3():
    tf = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    rope = dict(rope_type="default", rope_theta=10000.0, mrope_section=[12, 10, 10], mrope_interleaved=True)
    text = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=HEAD_DIM,
                intermediate_size=64, vocab_size=64, rope_parameters=rope)  # fmt: skip
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=2, num_position_embeddings=16, deepstack_visual_indexes=[])  # fmt: skip
    cfg = tf.Qwen3VLConfig(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    return tf.Qwen3VLModel(cfg).eval(), Qwen3VLTextRotaryEmbedding(cfg.text_config)


# text, an image of 2 x 3 merged tokens, a 3-frame video of 2 x 2 merged tokens whose frames are separated by
# timestamp text (as Qwen3-VL's processor lays them out), then text
SEGMENTS = [("text", 3), ("image", (2, 3)), ("text", 2)]
for _frame in range(3):
    SEGMENTS += [("video", (1, 2, 2)), ("text", 2 + _frame)]


def _transformers_ids(model):
    types = []
    for kind, size in SEGMENTS:
        if kind == "text":
            types += [0] * size
        else:
            types += [1 if kind == "image" else 2] * (size[-2] * size[-1])
    types = torch.tensor([types])
    image_thw = torch.tensor([[1, 4, 6]])  # patches before the 2 x 2 spatial merge
    video_thw = torch.tensor([[3, 4, 4]])  # one video; get_rope_index splits it into frames
    pos, _ = model.get_rope_index(torch.zeros_like(types), types, image_thw, video_thw)
    return pos[:, 0].t()  # [L, 3] (t, h, w)


def test_position_ids_equal_transformers_get_rope_index_token_for_token(qwen3):
    ours = position_ids(SEGMENTS, "mrope_interleaved")
    theirs = _transformers_ids(qwen3[0])
    assert ours.shape == theirs.shape and torch.equal(ours, theirs.float())


def test_a_contiguous_video_is_its_frames_back_to_back():
    whole = position_ids("text:2 video:3x2x4 text:1", "mrope_interleaved")
    frames = position_ids("text:2 video:1x2x4 video:1x2x4 video:1x2x4 text:1", "mrope_interleaved")
    assert torch.equal(whole, frames)
    assert whole[2:10, 0].unique().tolist() == [2.0] and whole[10, 0] == 6  # frame 2 starts max(H, W) later


def test_interleave_map_matches_qwen3_vl():
    reads = stream_of_pairs("mrope_interleaved", 64)  # Qwen3-VL's head dim 128
    assert reads.bincount().tolist() == [24, 20, 20]
    assert reads[:60].tolist() == [0, 1, 2] * 20 and reads[60:].tolist() == [0] * 4
    assert stream_of_pairs("mrope_interleaved", 32).bincount().tolist() == [12, 10, 10]
    with pytest.raises(ValueError, match="3 x max"):
        stream_of_pairs("mrope_interleaved", 32, mrope_section=(2, 15, 15))


def test_cos_sin_and_rotated_scores_equal_transformers(qwen3):
    ours = _rope("mrope_interleaved")
    layout = segment_layout(SEGMENTS, "mrope_interleaved")
    cos, sin = ours._cos_sin(0, layout)  # [L, 64], each pair's value twice (adjacent pairs)
    ids = _transformers_ids(qwen3[0]).t()[:, None]  # [3, 1, L]
    cos_t, sin_t = qwen3[1](torch.zeros(1, dtype=torch.float32), ids)  # [1, L, 64], cat(f, f) (rotate-half)
    # the same angles in fp32 on both sides (position x frequency, one product), so cos/sin agree to a few ulp
    assert torch.allclose(cos[:, 0::2], cos_t[0, :, :32], atol=1e-6) and torch.equal(cos_t[0, :, :32], cos_t[0, :, 32:])
    assert torch.allclose(sin[:, 0::2], sin_t[0, :, :32], atol=1e-6)
    # pair c is channels (2c, 2c + 1) here and (c, c + 32) there: scores agree under that channel permutation
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb

    q, k = torch.randn(2, 1, 1, layout.num_pos, HEAD_DIM).unbind(0)
    qr, kr = ours.context(0, layout).rotate(q, k)
    perm = torch.cat([torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)])
    qt, kt = apply_rotary_pos_emb(q[..., perm], k[..., perm], cos_t, sin_t)
    scores, scores_t = qr @ kr.transpose(-1, -2), qt @ kt.transpose(-1, -2)
    assert torch.allclose(scores, scores_t, atol=1e-5 * float(q.norm(dim=-1).max() * k.norm(dim=-1).max()))


@pytest.mark.parametrize("scheme", ["mrope_interleaved", "hope"])
def test_text_only_is_1d_rope_with_the_scheme_frequencies(scheme):
    layout = segment_layout("text:9", scheme)
    assert torch.equal(layout.pos, torch.arange(9.0)[:, None].expand(-1, 3))
    cos, sin = _rope(scheme)._cos_sin(0, layout)
    freqs = rope_frequencies(HEAD_DIM // 2, 10000.0)
    if scheme == "hope":  # the lowest-frequency quarter reads t, whose frequency is 0
        freqs[-HEAD_DIM // 8 :] = 0
    angles = torch.arange(9.0)[:, None] * freqs
    assert torch.allclose(cos, angles.cos().repeat_interleave(2, -1), atol=1e-6)
    assert torch.allclose(sin, angles.sin().repeat_interleave(2, -1), atol=1e-6)


def test_hope_temporal_pairs_are_an_exact_identity():
    reads = stream_of_pairs("hope", HEAD_DIM // 2)
    assert reads[-8:].tolist() == [0] * 8 and reads[:24].tolist() == [1, 2] * 12  # VideoRoPE: h, w, ..., then t
    freqs = frequency_matrix("hope", HEAD_DIM)
    assert torch.equal(freqs[0], torch.zeros(HEAD_DIM // 2))
    layout = segment_layout("text:2 video:4x3x3 text:2", "hope", temporal_scale=1.5)
    rope = _rope("hope")
    cos, sin = rope._cos_sin(0, layout)
    t_channels = torch.arange(HEAD_DIM).unflatten(0, (-1, 2))[reads == 0].flatten()
    assert torch.equal(cos[:, t_channels], torch.ones_like(cos[:, t_channels]))
    assert torch.equal(sin[:, t_channels], torch.zeros_like(sin[:, t_channels]))
    q = torch.randn(1, 1, layout.num_pos, HEAD_DIM)
    qr, _ = rope.context(0, layout).rotate(q, q)
    assert torch.equal(qr[..., t_channels], q[..., t_channels])


def test_hope_positions_are_videorope_with_the_temporal_scale():
    spec = "text:3 video:3x2x3 text:2"
    assert torch.equal(
        position_ids(spec, "hope", temporal_scale=1.0), position_ids(spec, "videorope", temporal_stride=1)
    )
    pos = position_ids(spec, "hope", temporal_scale=0.75)
    assert pos[3:21:6, 0].tolist() == [3.0, 3.75, 4.5] and pos[21, 0] == 5.5  # next text: last t + 1
    assert torch.equal(position_ids(spec, "hope"), pos)  # the default is HoPE's evaluation scale, 0.75


def test_hope_draws_a_scale_per_visual_segment_in_training_and_is_fixed_in_eval():
    g = torch.Generator().manual_seed(0)
    steps = set()
    for _ in range(40):
        pos = position_ids("text:1 video:2x1x1 text:1 video:2x1x1", "hope", training=True, generator=g)
        steps |= {round(float(pos[2, 0] - pos[1, 0]), 4), round(float(pos[5, 0] - pos[4, 0]), 4)}
    assert steps == set(HOPE_SCALES)
    model = timm.create_model("vivit_n_hope", pe_kwargs={"temporal_scale": 1.25})
    assert model.pe.layout_options(True)["training"] is True
    layout = model.eval().layout((3, 2, 2))
    assert layout.pos[4, 0] - layout.pos[0, 0] == 1.25  # frame 1 at t = 1.25


@pytest.mark.parametrize("name", ["vivit_n_mrope_interleaved", "mm_n_mrope_interleaved", "vivit_n_hope", "mm_n_hope"])
def test_models_run_and_read_their_scheme(name):
    model = timm.create_model(name).eval()
    assert model.pe.layout_scheme == name.split("_n_")[1]
    inp = visionpe.zoo.registry.family_of(name).example_input(32, 1)
    out = model(**inp) if isinstance(inp, dict) else model(inp)
    assert out.isfinite().all()
