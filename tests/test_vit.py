import pytest
import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

import visionpe
from visionpe.zoo.vit_family import VIT

TINY = dict(VIT.tiny)


def _vit(name="vit_n_rope2d_mixed_ape", **kw):
    return timm.create_model(name, **{**TINY, **kw}).eval()


def test_any_resolution_without_rebuilding():
    m = _vit()
    for h, w in [(32, 32), (48, 64), (16, 40)]:
        assert m(torch.randn(2, 3, h, w)).shape == (2, 10)


def test_sizes_not_divisible_by_the_patch_are_zero_padded():
    m = _vit()
    x = torch.randn(1, 3, 36, 30)
    padded = F.pad(x, (0, 32 - 30, 0, 40 - 36))  # bottom/right zeros to whole patches
    # same padded pixels, but the patch conv sees another input size (may pick other blocking): a few blocks
    # of width 32 on O(1) values, ~1e-6; padding with anything but zeros moves border tokens by O(0.1)
    assert torch.allclose(m(x), m(padded), atol=1e-5)
    assert m.token_grid((36, 30)) == (5, 4)


def test_forward_features_head_and_pre_logits():
    m = _vit()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 1 + 16, 32)
    assert m.forward_head(feats, pre_logits=True).shape == (2, 32)
    assert torch.allclose(m.forward_head(feats), m(x))  # exact in eval: m(x) repeats the same ops in the same order


def test_reset_classifier_and_get_classifier():
    m = _vit()
    m.reset_classifier(5, "avg")
    assert m.get_classifier().out_features == 5 and m.global_pool == "avg"
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    m.reset_classifier(0)
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 32)


def test_no_weight_decay_names_pe_tables_and_optimizer_uses_it():
    m = _vit()
    nwd = m.no_weight_decay()
    assert {"cls_token", "blocks.0.attn.pos.rope2d.freqs", "pe.encodings.ape.pos_embed"} <= nwd
    opt = create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05)
    for block in m.blocks:  # each layer's own RoPE-Mixed frequencies
        freqs = block.attn.pos["rope2d"].freqs
        group = next(g for g in opt.param_groups if any(p is freqs for p in g["params"]))
        assert group["weight_decay"] == 0.0


def test_group_matcher_groups_pe_with_the_stem():
    m = _vit()
    groups = timm.models.group_parameters(m, m.group_matcher())
    first = next(iter(groups.values()))
    assert "pe.encodings.ape.pos_embed" in first and "patch_embed.proj.weight" in first


def test_grad_checkpointing_gives_same_output_and_grads():
    torch.manual_seed(0)
    m = _vit().train()
    x = torch.randn(2, 3, 32, 32)
    out = m(x)
    out.sum().backward()
    g = torch.stack([b.attn.pos["rope2d"].freqs.grad for b in m.blocks]).clone()
    m.zero_grad()
    m.set_grad_checkpointing(True)
    out2 = m(x)
    out2.sum().backward()
    # recomputation repeats the forward ops; the frequencies' gradient sums every layer's, head's and token's
    # contribution, maybe in another order: ~eps * sum |contributions| ~ 1e-6 on O(1) entries
    assert torch.allclose(out, out2, atol=1e-5)
    assert torch.allclose(g, torch.stack([b.attn.pos["rope2d"].freqs.grad for b in m.blocks]), atol=1e-5)


def test_forward_intermediates_and_features_only():
    m = _vit()
    x = torch.randn(2, 3, 32, 48)
    final, inter = m.forward_intermediates(x, indices=2)
    assert len(inter) == 2 and inter[0].shape == (2, 32, 4, 6)
    # another code path (the intermediates are reshaped and copied) through blocks of width 32 on O(1)
    # normalised features: ~1e-6; a skipped block or norm changes them by O(1)
    assert torch.allclose(final, m.forward_features(x), atol=1e-5)
    nlc = m.forward_intermediates(x, indices=[0], output_fmt="NLC", intermediates_only=True)
    assert nlc[0].shape == (2, 24, 32)
    fm = timm.create_model("vit_n_rope2d", features_only=True, out_indices=(0, 1), **TINY)
    feats = fm(torch.randn(1, 3, 32, 32))
    assert [f.shape for f in feats] == [(1, 32, 4, 4)] * 2
    assert fm.feature_info.channels() == [32, 32]


def test_set_input_size_resamples_ape_and_updates_cfg():
    m = _vit("vit_n_ape")
    m.set_input_size(img_size=(48, 64))
    assert m.pe.encodings["ape"].grid == (6, 8)
    assert m.pe.encodings["ape"].pos_embed.shape == (1, 1 + 48, 32)
    assert m.pretrained_cfg["input_size"] == (3, 48, 64)


def test_register_tokens_avg_pool_and_drop_path():
    m = _vit("vit_n_rope2d_ape", reg_tokens=2, global_pool="avg", class_token=False, drop_path_rate=0.1).train()
    out = m(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 10) and m.num_prefix_tokens == 2


def test_interpolate_mode_rescales_positions_to_the_reference_grid():
    m = _vit("vit_n_rope2d")
    x = torch.randn(1, 3, 32, 32)
    ref = m(x)
    m.set_position_mode("interpolate")
    assert torch.allclose(m(x), ref)  # identical at the reference size: positions scale by exactly 1
    lay = m.layout((8, 8))
    # an 8 x 8 grid squeezed into the 4 x 4 reference; dyadic values, exact in fp32
    assert lay.pos.max() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="position_mode"):
        m.set_position_mode("stretch")


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(3, 32, 32), r"\[B, C, H, W\], got a 3-D"),
        (torch.randn(1, 1, 32, 32), "input channels"),
        (torch.randn(1, 3, 6, 32), "smaller than one patch"),
    ],
)
def test_bad_input_is_a_clear_error(x, match):
    with pytest.raises(ValueError, match=match):
        _vit()(x)


def test_unknown_pe_and_model_name_suggest_nearest():
    with pytest.raises(ValueError, match="rope2d_mixed"):
        timm.create_model("vit_n_ape", pe="rope2d_mixd")
    with pytest.raises(ValueError, match="vit_b_rope2d"):
        visionpe.create_model("vit_b_rop2d")
    with pytest.raises(ValueError, match="valid keys"):
        timm.create_model("vit_n_rope2d", pe_kwargs=dict(thetta=3))


def test_pe_kwargs_reach_the_encoding():
    m = timm.create_model("vit_n_rope2d", pe_kwargs=dict(theta=50.0), **TINY)
    assert m.pe.encodings["rope2d"].theta == 50.0


@pytest.mark.parametrize("name", ["vit_n_rope2d", "vit_n_rope2d_mixed", "vit_n_sincos"])
def test_training_after_an_inference_mode_call(name):
    m = _vit(name, img_size=24)  # a grid no other test caches first
    with torch.inference_mode():
        m(torch.randn(1, 3, 24, 24))
    m.train()(torch.randn(1, 3, 24, 24)).sum().backward()
