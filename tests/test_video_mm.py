"""Video ViT (vivit_*) and multimodal encoder (mm_*): every model forward and backward at two clip sizes through
timm, the RoPE schemes wired into attention, the space-time APE, bad input, and the generated datasets."""

from __future__ import annotations

import pytest
import timm
import torch
from torch.utils.data import default_collate

import visionpe
from visionpe.data import get_dataset_info
from visionpe.data.datasets.image_text import COLOURS, render_board
from visionpe.data.datasets.video_shapes import render_scene, reverse_scene
from visionpe.layers import attention_core
from visionpe.pos.rope_nd import RoPEND
from visionpe.zoo.video_family import VIDEO_PES

VIVIT_NANO = [f"vivit_n_{pe}" for pe in VIDEO_PES]
MM_NANO = [f"mm_n_{s}" for s in ("rope1d", "mrope", "videorope", "vrope", "v2pe")]


def _grads_ok(model) -> None:
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient for {missing[:5]}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_every_registered_name_is_a_timm_model():
    names = visionpe.list_visionpe_models("vivit_*") + visionpe.list_visionpe_models("mm_*")
    expected = {f"vivit_{s}_{pe}" for s in "ntsb" for pe in VIDEO_PES}
    mm = ("rope1d", "mrope", "videorope", "vrope", "v2pe", "mrope_interleaved", "hope", "rope1d_p", "mrope_i", "mhrope")
    expected |= {f"mm_{s}_{pe}" for s in "ntsb" for pe in mm}
    assert set(names) == expected
    assert set(timm.list_models("vivit_*")) >= {n for n in expected if n.startswith("vivit")}
    cfg = timm.get_pretrained_cfg("vivit_s_vrope")
    assert cfg.input_size == (3, 224, 224) and cfg.fixed_input_size is False and "2502.11664" in cfg.paper_ids


@pytest.mark.parametrize("name", VIVIT_NANO)
def test_video_vit_forward_backward_at_two_clip_sizes(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=8)
    for shape in [(2, 3, 4, 32, 32), (1, 3, 5, 24, 40)]:  # 5 frames: padded to 3 tubelets; 24 x 40: 6 x 10 patches
        model.zero_grad()
        out = model(torch.randn(shape))
        assert out.shape == (shape[0], 8) and torch.isfinite(out).all()
        out.square().mean().backward()
        _grads_ok(model)


@pytest.mark.parametrize("name", MM_NANO)
def test_multimodal_forward_backward_with_images_and_clips(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=7)
    for pixels, length in [(torch.randn(2, 3, 32, 32), 4), (torch.randn(2, 3, 4, 24, 40), 6)]:
        model.zero_grad()
        ids = torch.randint(0, model.vocab_size, (2, length))
        out = model(pixels, text_ids=ids)
        assert out.shape == (2, 7) and torch.isfinite(out).all()
        out.square().mean().backward()
        _grads_ok(model)


def test_multimodal_returns_token_features_and_pooled_output():
    model = timm.create_model("mm_n_vrope", num_classes=3).eval()
    ids = torch.randint(0, 10, (2, 5))
    tokens, pooled = model.encode(torch.randn(2, 3, 4, 16, 24), text_ids=ids)
    n_vis = 2 * 4 * 6  # (4 / 2) x (16 / 4) x (24 / 4)
    assert tokens.shape == (2, 5 + 2 + n_vis, 96) and pooled.shape == (2, 96)
    _, layout = model.embed(torch.randn(2, 3, 4, 16, 24), ids)
    assert layout.grid is None and layout.streams == 4 and layout.num_pos == tokens.shape[1]
    # text(k + 1) incl. <img> | video | text: the first visual token sits right after the opening marker
    assert layout.pos[1].tolist() == [1.0] * 4 and layout.pos[2, 0] == 2
    # average pooling over the whole sequence; a mean over ~55 tokens in another order differs by ~sqrt(55) eps
    # ~ 5e-7 relative before the norm: inside assert_close's fp32 defaults (atol 1e-5) on O(1) outputs
    torch.testing.assert_close(pooled, model.fc_norm(tokens.mean(1)))


def test_multimodal_text_changes_the_answer_and_order_matters():
    torch.manual_seed(0)
    model = timm.create_model("mm_n_mrope", num_classes=4).eval()
    pixels = torch.randn(1, 3, 32, 32)
    a = model(pixels, text_ids=torch.tensor([[1, 2, 4, 7]]))
    b = model(pixels, text_ids=torch.tensor([[1, 2, 5, 7]]))
    c = model(pixels, text_ids=torch.tensor([[1, 2, 7, 4]]))  # same bag of words, other order
    # other words or order change the pooled text tokens by O(0.1), far above allclose's rtol 1e-5
    assert not torch.allclose(a, b) and not torch.allclose(a, c)


def _logits_of_identical_tokens(name: str, clip_shape) -> tuple[torch.Tensor, object]:
    model = timm.create_model(name, num_classes=0).eval()
    _, layout = model.embed(torch.zeros(clip_shape))
    ctx = model.pe.context(0, layout)
    d = model.blocks[0].attn.head_dim
    n = layout.num_tokens
    q = torch.randn(1, 1, 1, d).expand(1, 1, n, d)  # the same vector at every token
    qr, kr = ctx.rotate(q, q)
    return (qr @ kr.transpose(-1, -2))[0, 0], layout


@pytest.mark.parametrize("name", ["vivit_n_rope3d", "vivit_n_mrope", "vivit_n_vrope"])
def test_video_rope_logits_depend_only_on_relative_position(name):
    torch.manual_seed(0)
    logits, layout = _logits_of_identical_tokens(name, (1, 3, 6, 16, 20))
    p = layout.num_prefix
    pos = layout.pos
    rel = {}
    for i in range(layout.num_pos):
        for j in range(layout.num_pos):
            key = tuple((pos[i] - pos[j]).tolist())
            rel.setdefault(key, []).append(logits[p + i, p + j].item())
    spread = max(max(v) - min(v) for v in rel.values())
    # fp32 cos/sin of angles <= ~20 carry ~20 eps ~ 1.2e-6 each, times logits' scale |q||k| ~ 24: ~3e-5;
    # an absolute-position dependence would be O(1)
    assert spread < 1e-4 and len(rel) > 20
    q = torch.randn(1, 2, layout.num_tokens, 24)
    qr, _ = timm.create_model(name).pe.context(0, layout).rotate(q, q)
    assert torch.equal(qr[:, :, 0], q[:, :, 0])  # the CLS token is not rotated
    # rotation preserves norms: 24-element norms |q| ~ 5 of fp32 rotations agree to ~10 eps * 5 ~ 3e-6, inside
    # assert_close's fp32 defaults (atol 1e-5 + rtol 1.3e-6)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1))


def test_scheme_changes_attention_but_not_parameters():
    torch.manual_seed(0)
    a = timm.create_model("vivit_n_rope3d").eval()
    b = timm.create_model("vivit_n_videorope").eval()
    b.load_state_dict(a.state_dict())  # the schemes hold no parameters: the same weights load
    x = torch.randn(1, 3, 4, 16, 16)
    # other positions change attention logits by O(1), so some output moves by far more than 1e-5
    assert not torch.allclose(a(x), b(x), atol=1e-5)


def test_rope_nd_runs_inside_attention_with_every_backend():
    torch.manual_seed(0)
    model = timm.create_model("mm_n_vrope").eval()
    _, layout = model.embed(torch.randn(1, 3, 32, 32), torch.randint(0, 9, (1, 3)))
    ctx = model.pe.context(1, layout)
    q, k, v = torch.randn(3, 1, 4, layout.num_tokens, 24).unbind(0)
    with visionpe.attn_backend("math"):
        ref = attention_core(q, k, v, ctx)
    with visionpe.attn_backend("sdpa"):
        # math vs SDPA kernels: softmax-weighted sums of ~60 values |v| <= ~4.5, ~sqrt(60) eps * 4.5 ~ 2e-6
        torch.testing.assert_close(attention_core(q, k, v, ctx), ref, atol=1e-5, rtol=1e-4)


def test_v2pe_draws_delta_in_training_and_is_fixed_at_inference():
    model = timm.create_model("vivit_n_v2pe")
    x = torch.randn(1, 3, 4, 16, 16)
    model.train()
    torch.manual_seed(1)
    steps = set()
    for _ in range(30):  # one delta per clip, from {1, 1/2, ..., 1/256}
        pos = model.layout((2, 4, 4)).pos[:, 0]
        steps.add((pos[1] - pos[0]).item())
        # exact: deltas are powers of 2 and positions < 2^6, so fp32 holds every position and step exactly
        assert torch.allclose(pos[1:] - pos[:-1], pos[1] - pos[0])
    assert len(steps) >= 4 and steps <= {1 / 2**i for i in range(9)}
    model.eval()
    pos = model.layout((2, 4, 4)).pos[:, 0]
    torch.testing.assert_close(pos, torch.arange(32.0) * 0.25)  # exact: dyadic positions (see above)
    torch.testing.assert_close(model(x), model(x))  # exact in eval: same ops in the same order, no sampling
    assert isinstance(model.pe.encodings["rope_nd"], RoPEND) and model.pos_scheme == "v2pe"


def test_space_time_ape_is_separable_and_resampled():
    model = timm.create_model("vivit_n_ape").eval()
    ape = model.pe.encodings["ape_st"]
    assert (ape.frames, ape.grid) == (4, (8, 8))  # 8 frames / tubelet 2; 32 px / patch 4
    table = ape.table((4, 8, 8)).view(4, 64, -1)
    # at the stored size the table is one fp32 add of the two factors: within 1 ulp (assert_close fp32 defaults)
    torch.testing.assert_close(table, ape.time[0][:, None] + ape.space[0][None])
    assert ape.table((2, 5, 7)).shape == (1, 2 * 5 * 7, 96)  # other lengths and sizes: resampled
    x = torch.zeros(1, 1 + 2 * 5 * 7, 96)
    out = ape.tokens(x, model.layout((2, 5, 7)))
    assert torch.equal(out[:, 0], x[:, 0])  # CLS gets no entry
    assert out[:, 1:].abs().sum() > 0
    feats = model.forward_intermediates(torch.randn(1, 3, 6, 20, 28), indices=2, intermediates_only=True)
    assert [f.shape for f in feats] == [(1, 96, 3, 5, 7)] * 2


def test_tubelet_embedding_equals_the_conv3d_it_holds():
    model = timm.create_model("vivit_n_rope3d")
    x = torch.randn(2, 3, 5, 24, 40)  # 5 frames: zero-padded to 6
    tokens, grid = model.patch_embed(x)
    ref = model.patch_embed.proj(torch.nn.functional.pad(x, (0, 0, 0, 0, 0, 1)))  # [B, D, 3, 6, 10]
    assert grid == (3, 6, 10)
    # the same conv3d, maybe with other blocking for another memory layout: 96-product sums of O(1) size differ
    # by ~sqrt(96) eps ~ 1e-6; a wrong tubelet order or padding is O(0.1)
    torch.testing.assert_close(tokens, ref.flatten(2).transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_full_size_configs_run():
    with torch.no_grad():
        video = timm.create_model("vivit_t_vrope").eval()
        assert video(torch.randn(1, 3, 2, 32, 32)).shape == (1, 400)
        mm = timm.create_model("mm_t_v2pe").eval()
        assert mm(torch.randn(1, 3, 32, 32), text_ids=torch.tensor([[1, 2, 3]])).shape == (1, 1000)


# --------------------------------------------------------------------------------------------------- bad input


def test_clip_shorter_than_the_tubelet_is_a_clear_error():
    model = timm.create_model("vivit_n_rope3d")
    with pytest.raises(ValueError, match="1 frames, fewer than one tubelet \\(2 frames\\)"):
        model(torch.randn(1, 3, 1, 32, 32))
    with pytest.raises(ValueError, match="add a time axis"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="smaller than one patch"):
        model(torch.randn(1, 3, 4, 2, 32))
    with pytest.raises(ValueError, match="expected 3 channels"):
        model(torch.randn(1, 4, 3, 32, 32))


def test_text_ids_out_of_range_are_a_clear_error():
    model = timm.create_model("mm_n_mrope", vocab_size=16)
    pixels = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match="text id 16 is out of range .* \\[0, 16\\).*vocab_size=17"):
        model(pixels, text_ids=torch.tensor([[1, 16], [0, 2]]))
    with pytest.raises(ValueError, match="text id -1 is out of range"):
        model(pixels, text_ids=torch.tensor([[1, -1], [0, 2]]))
    with pytest.raises(TypeError, match="integer token ids"):
        model(pixels, text_ids=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="batch 1 but the visual input has batch 2"):
        model(pixels, text_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown positional encoding 'vropee'"):
        timm.create_model("mm_n_mrope", pe="vropee")


# ------------------------------------------------------------------------------------------------------ datasets


def test_video_shapes_items_and_temporal_order():
    info = get_dataset_info("video-shapes")
    assert (info.kind, info.num_classes, info.in_chans) == ("video", 8, 3)
    ds = info.factory("train", 32, frames=4, num_samples=16)
    clip, target = ds[5]
    assert clip.shape == (3, 4, 32, 32) and target == 5
    assert torch.equal(ds[5][0], clip)  # deterministic
    assert ds.render(5, (24, 40), frames=6)[0].shape == (3, 6, 24, 40)  # any size and length
    assert sorted(ds[i][1] for i in range(8)) == list(range(8))
    for i in range(8):  # playing a clip backwards gives a clip of another class: the classes need the order
        s = ds.scene(i)
        r = reverse_scene(s)
        assert r["target"] != s["target"]
        # hard-edged pixels from fp32 +, *, <= (IEEE-exact on every CPU): colours match exactly unless an edge
        # lies within ~1e-7 of a pixel centre, which no scene here does
        torch.testing.assert_close(render_scene(r, 6, 32), render_scene(s, 6, 32).flip(1))
    frames = render_scene(ds.scene(0), 6, 32)
    assert not torch.equal(frames[:, 0], frames[:, -1])  # things move


def test_fixed_rate_clips_keep_the_event_and_add_still_frames_around_it():
    ds = get_dataset_info("video-shapes").factory("val", 16, frames=4, num_samples=8, noise=0.0)
    clip, target = ds.render(3)
    same, same_target = ds.render_duration(3, frames=4)
    assert torch.equal(same, clip) and same_target == target  # at the training length: the training clip
    longer, _ = ds.render_duration(3, frames=12)  # 4 still frames, the 4-frame event, 4 still frames
    assert longer.shape == (3, 12, 16, 16)
    torch.testing.assert_close(longer[:, 4:8], clip)  # the event at the training frame rate, frame for frame
    # a 1-frame event in 3 frames samples times -0.5, 0.5, 1.5: the scene before it starts and after it ends
    before, _, after = render_scene(ds.scene(3), 3, 16, event_frames=1).unbind(1)
    assert all(torch.equal(longer[:, f], before) for f in range(4))  # the shapes at rest where they start
    assert all(torch.equal(longer[:, f], after) for f in range(8, 12)) and not torch.equal(before, after)
    stretched, _ = ds.render(3, frames=12)  # the frames protocol instead spreads the same event over 12 frames
    assert not torch.equal(stretched[:, 4:8], clip)


def test_image_text_answer_depends_on_the_named_position():
    info = get_dataset_info("image-text-shapes")
    assert (info.kind, info.num_classes) == ("image_text", 7)
    ds = info.factory("val", 48, num_samples=40, noise=0.0)
    item, target = ds[3]
    assert item["pixels"].shape == (3, 48, 48) and item["text_ids"].dtype == torch.long
    assert int(item["text_ids"].max()) < ds.vocab_size
    colours = list(COLOURS.values())
    for i in range(40):  # the answer is what the image shows at the cell the question names
        s = ds.scene(i)
        img = render_board(s["colours"], s["shapes"], ds.grid, 48)
        cy, cx = int((s["row"] + 0.5) * 16), int((s["col"] + 0.5) * 16)
        if s["kind"] == "colour":
            assert torch.allclose(img[:, cy, cx], torch.tensor(colours[ds[i][1]]))  # exact: flat colour, no noise
        else:
            assert ds[i][1] == 4 + s["shapes"][s["row"] * 3 + s["col"]]
    answers = {(ds.scene(i)["colours"][c]) for i in range(4) for c in range(9)}
    assert len(answers) > 1  # the same kind of question has different answers at different cells


def test_models_train_on_the_dataset_batches():
    video = get_dataset_info("video-shapes").factory("train", 32, frames=4, num_samples=4)
    x, y = default_collate([video[i] for i in range(4)])
    model = timm.create_model("vivit_n_vrope", num_classes=8)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    pairs = get_dataset_info("image-text-shapes").factory("train", 32, num_samples=4)
    inputs, y = default_collate([pairs[i] for i in range(4)])
    model = timm.create_model("mm_n_v2pe", num_classes=7)
    loss = torch.nn.functional.cross_entropy(model(**inputs), y)  # a dict input goes in as keyword arguments
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", ["video-shapes", "image-text-shapes"])
def test_generated_split_sizes(name):
    factory = get_dataset_info(name).factory
    defaults = (len(factory("train", 16)), len(factory("val", 16)))
    assert defaults == ((4000, 800) if name == "video-shapes" else (6000, 1000))
    # per-split counts size only their own split; the first items are the same whatever the size
    assert len(factory("train", 16, num_train=12)) == 12 and len(factory("val", 16, num_train=12)) == defaults[1]
    assert len(factory("val", 16, num_val=7)) == 7 and len(factory("train", 16, num_val=7)) == defaults[0]
    a, b = factory("val", 16, num_val=7)[3][0], factory("val", 16)[3][0]
    if name == "image-text-shapes":
        a, b = a["pixels"], b["pixels"]
    assert torch.equal(a, b)
    assert len(factory("val", 16, num_samples=5)) == 5  # num_samples: both splits
    with pytest.raises(ValueError, match="either num_samples"):
        factory("train", 16, num_samples=5, num_train=12)
