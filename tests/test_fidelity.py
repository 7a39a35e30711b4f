"""Agreement of the multimodal position schemes with the official code: VideoRoPE's next-text rule and
Qwen2-VL / Qwen2.5-VL M-RoPE against the installed transformers' `get_rope_index`."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from visionpe.pos.mm_positions import frequency_matrix, parse_segments, position_ids, stream_of_pairs

# ------------------------------------------------------------------------------------------------- VideoRoPE


def test_videorope_text_after_video_continues_from_last_temporal_index():
    # text 0..2; video t = 3 + 2k -> 3, 5, 7; its y / x streams reach 7 + 4 - 2 = 9 and 7 + 3 - 1 = 9
    pos = position_ids("text:3 video:3x5x4 text:2", "videorope")
    assert pos[3:63].max(0).values.tolist() == [7, 9, 9]
    assert pos[63:].tolist() == [[8, 8, 8], [9, 9, 9]]  # last t + 1 (the max over all streams would give 10)


def test_videorope_leading_video_then_image():
    # video at 0: t = 0, 2, y = t + h - 1 (max 3); text continues at 2 + 1; the image starts after that text
    pos = position_ids("video:2x3x3 text:2 image:4x4 text:1", "videorope")
    assert pos[:18, 1].max() == 3
    assert pos[18:20].tolist() == [[3, 3, 3], [4, 4, 4]]
    img = pos[20:36]
    assert (img[:, 0] == 5).all()  # one frame at the next running index
    assert img[:, 1].tolist() == [5 + h - 1 for h in range(4) for _ in range(4)]  # centred on t: (4 - 1) // 2 = 1
    assert pos[36].tolist() == [6, 6, 6]  # the image's t + 1, though its y / x reach 7


def test_videorope_back_to_back_visuals():
    # a visual right after another starts at the previous block's last t + 1, as text would
    pos = position_ids("text:1 image:2x2 video:2x2x2 text:1", "videorope")
    assert (pos[1:5, 0] == 1).all()
    assert pos[5:13, 0].tolist() == [2] * 4 + [4] * 4
    assert pos[13].tolist() == [5, 5, 5]


# ----------------------------------------------------------------------------- M-RoPE vs transformers' Qwen code

qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
qwen2_5_vl = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")

MERGE = 2  # spatial merge of the Qwen vision tower: grid_thw counts patches, the LLM sees (H / 2, W / 2) tokens


def _hf_rope_index(model_cls, spec: str, seconds_per_grid=None, tokens_per_second: int = 2) -> torch.Tensor:
    """transformers' get_rope_index on a bare object holding only the config fields it reads -> [N, 3]."""
    vision = types.SimpleNamespace(spatial_merge_size=MERGE, tokens_per_second=tokens_per_second)
    host = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    host.get_vision_position_ids = functools.partial(model_cls.get_vision_position_ids, host)
    types_, images, videos = [], [], []
    for part in spec.split():
        kind, size = part.split(":")
        dims = [int(s) for s in size.split("x")]
        if kind == "text":
            types_ += [0] * dims[0]
            continue
        t, h, w = dims if kind == "video" else [1, *dims]
        (videos if kind == "video" else images).append([t, h * MERGE, w * MERGE])
        types_ += [2 if kind == "video" else 1] * (t * h * w)
    ids = torch.zeros(1, len(types_), dtype=torch.long)  # token ids are not read: the type ids mark the visuals
    kwargs = dict(
        mm_token_type_ids=torch.tensor([types_], dtype=torch.int),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    if seconds_per_grid is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds_per_grid, dtype=torch.float32)
    pos, _ = model_cls.get_rope_index(host, ids, **kwargs)
    return pos[:, 0].T.to(torch.float32)  # [N, 3]


MIXED = "text:3 video:4x3x5 text:2 image:2x3 text:1 video:2x2x2 text:2"


@pytest.mark.parametrize("spec", [MIXED, "video:3x2x2 text:2", "image:3x4 text:1 image:2x2 text:3"])
def test_mrope_hw_rule_matches_transformers_qwen2_vl(spec):
    ours = position_ids(spec, "mrope", after_visual="hw")
    assert torch.equal(ours, _hf_rope_index(qwen2_vl.Qwen2VLModel, spec))


def test_transformers_qwen2_vl_ignores_t_after_a_video():
    # T = 4 > max(H, W) = 3: the released rule (max + 1) and transformers' (start + max(H, W)) part ways
    spec = "text:1 video:4x2x3 text:1"
    hf = _hf_rope_index(qwen2_vl.Qwen2VLModel, spec)
    released = position_ids(spec, "mrope")
    assert hf[-1].tolist() == [4, 4, 4]  # 1 + max(2, 3): collides with the video's last frame t = 1 + 3
    assert released[-1].tolist() == [5, 5, 5]  # max over the block (t = 4) + 1
    assert torch.equal(released[:-1], hf[:-1])  # everything before the closing text agrees
    square = "text:1 video:3x3x3 text:1"  # T <= max(H, W): the two rules agree
    assert torch.equal(position_ids(square, "mrope"), _hf_rope_index(qwen2_vl.Qwen2VLModel, square))


@pytest.mark.parametrize("seconds", [[1.0, 1.0], [0.5, 0.5], [0.7, 0.7]])
def test_mrope_time_hw_rule_matches_transformers_qwen2_5_vl(seconds):
    ours = position_ids(MIXED, "mrope_time", temporal_interval=2 * seconds[0], after_visual="hw")
    assert torch.equal(ours, _hf_rope_index(qwen2_5_vl.Qwen2_5_VLModel, MIXED, seconds))


def test_mrope_time_temporal_ids_are_time_aligned():
    # interval 1.4 (2 tokens / s x 0.7 s per temporal token): t = floor(k * 1.4) = 0, 1, 2, 4 from the block start
    pos = position_ids("text:2 video:4x1x2 text:1", "mrope_time", temporal_interval=1.4)
    assert pos[2:10, 0].tolist() == [2, 2, 3, 3, 4, 4, 6, 6]
    assert pos[2:10, 2].tolist() == [2, 3] * 4
    assert pos[-1].tolist() == [7, 7, 7]  # released rule: the block's max (t = 6) + 1
    assert position_ids("text:2 video:4x1x2 text:1", "mrope_time", temporal_interval=1.4, after_visual="hw")[
        -1
    ].tolist() == [4, 4, 4]  # transformers 5.x: 2 + max(1, 2)
    # interval 1 is Qwen2-VL's M-RoPE
    spec = parse_segments(MIXED)
    assert torch.equal(position_ids(spec, "mrope_time", temporal_interval=1.0), position_ids(spec, "mrope"))


def test_mrope_time_reads_mrope_sections():
    assert torch.equal(stream_of_pairs("mrope_time", 64), stream_of_pairs("mrope", 64))
    assert torch.equal(frequency_matrix("mrope_time", 128), frequency_matrix("mrope", 128))


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(temporal_interval=0.0), "temporal_interval"),
        (dict(after_visual="min"), "after_visual"),
        (dict(temporal_stride=2), "does not take"),
    ],
)
def test_mrope_time_rejects_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        position_ids("text:1 video:2x2x2", "mrope_time", **options)


# ------------------------------------------------------------------------------------- RoPE-ViT +APE resampling


def _naver_resample(table: torch.Tensor, old: int, new: tuple[int, int]) -> torch.Tensor:
    """naver RoPE-ViT's APE at another grid: the [1, old*old, C] table as an image, plain bicubic."""
    img = table.reshape(1, old, old, -1).permute(0, 3, 1, 2)
    img = torch.nn.functional.interpolate(img, size=new, mode="bicubic", align_corners=False)
    return img.permute(0, 2, 3, 1).flatten(1, 2)


@pytest.mark.parametrize("name", ["vit_n_rope2d_ape", "vit_n_rope2d_mixed_ape"])
@pytest.mark.parametrize("grid", [(24, 24), (7, 7), (10, 18)])
def test_rope_ape_presets_resample_as_naver(name, grid):
    import timm

    ape = timm.create_model(name, no_embed_class=True).pe.encodings["ape"]  # naver's layout: no class entry
    assert ape.resample == "bicubic" and ape.num_prefix_entries == 0
    ref = _naver_resample(ape.pos_embed.detach(), ape.grid[0], grid)
    # the same bicubic kernel on the same fp32 inputs: a few ulps at most (16-tap sums of values ~0.02)
    torch.testing.assert_close(ape.table(grid).detach(), ref, rtol=0, atol=1e-7)
    with_cls = timm.create_model(name).pe.encodings["ape"]  # a class entry is carried over unchanged
    out = with_cls.table(grid)
    assert torch.equal(out[:, :1], with_cls.pos_embed[:, :1])
    torch.testing.assert_close(
        out[:, 1:], _naver_resample(with_cls.pos_embed[:, 1:].detach(), with_cls.grid[0], grid), rtol=0, atol=1e-7
    )


def test_plain_ape_keeps_timm_resampling():
    import timm
    from timm.layers import resample_abs_pos_embed

    ape = timm.create_model("vit_n_ape").pe.encodings["ape"]
    assert ape.resample == "timm"
    old, e = list(ape.grid), ape.num_prefix_entries
    for grid in ((24, 24), (7, 7)):
        want = resample_abs_pos_embed(ape.pos_embed, new_size=list(grid), old_size=old, num_prefix_tokens=e)
        assert torch.equal(ape.table(grid), want)
        # and the two methods differ by far more than rounding, so the choice matters
        naver = _naver_resample(ape.pos_embed[:, e:].detach(), old[0], grid)
        assert (want[:, e:] - naver).norm() > 0.05 * naver.norm()


def test_ape_resample_option_follows_set_grid_and_rejects_unknown():
    import timm

    ape = timm.create_model("vit_n_rope2d_ape", no_embed_class=True).pe.encodings["ape"]
    ref = _naver_resample(ape.pos_embed.detach(), ape.grid[0], (8, 8))
    ape.set_grid((8, 8))
    torch.testing.assert_close(ape.pos_embed.detach(), ref, rtol=0, atol=1e-7)  # as above: same kernel, fp32
    with pytest.raises(ValueError, match="resample"):
        timm.create_model("vit_n_ape", pe_kwargs={"ape": {"resample": "bilinear"}})


def test_models_take_the_scheme_options_through_pe_kwargs():
    import timm

    spec = "text:1 video:4x2x3 text:1"
    hw = timm.create_model("mm_n_mrope", pe_kwargs={"rope_nd": {"scheme_options": {"after_visual": "hw"}}})
    assert torch.equal(hw.scheme_layout(spec).pos, position_ids(spec, "mrope", after_visual="hw"))
    assert hw.scheme_layout(spec).pos[-1, 0] == 4  # transformers' rule; the default model gives 5
    assert timm.create_model("mm_n_mrope").scheme_layout(spec).pos[-1, 0] == 5
    with pytest.raises(ValueError, match="after_visual"):
        timm.create_model("mm_n_mrope", pe_kwargs={"rope_nd": {"scheme_options": {"after_visual": "x"}}})
