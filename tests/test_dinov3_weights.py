"""`vit_*_rope2d_dinov3` is timm's DINOv3 ViT: random weights in timm's layout (with and without q/v biases) and in
the official DINOv3 layout (written here from the official key names) load through `pretrained=True` and give timm's
`forward_features` at 224 px and at a non-square size; the lvd1689m tags point at timm's hub copies.

Tolerance 1e-5 relative to the output's scale: fp32 through 2 blocks of two implementations that order their
reductions differently agree to a few 1e-7; a swapped tensor, a k bias or a wrong rotation moves outputs by O(0.1)."""

import pytest
import timm
import torch

import visionpe  # noqa: F401
from visionpe.zoo.pretrained_cfgs import WEIGHTS

DEPTH2 = dict(depth=2)
SIZES = [(224, 224), (224, 320)]


def _random_timm(name: str, **kw):
    torch.manual_seed(0)
    ref = timm.create_model(name, **DEPTH2, **kw).eval()
    sd = ref.state_dict()
    for k, v in sd.items():  # every tensor matters: LayerScale O(1), biases nonzero
        scale = 0.5 if "gamma" in k else 0.05
        sd[k] = torch.randn_like(v) * scale + (1.0 if "norm" in k and k.endswith("weight") else 0.0)
    ref.load_state_dict(sd)
    return ref, sd


def _load(ours: str, sd: dict, tmp_path, **kw):
    path = tmp_path / "w.pth"
    torch.save(sd, str(path))
    return timm.create_model(ours, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **DEPTH2, **kw).eval()


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _assert_same_features(model, ref):
    for hw in SIZES:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            ours, theirs = model.forward_features(x), ref.forward_features(x)
            assert _rel(ours, theirs) < 1e-5, hw
            assert _rel(model.forward_head(ours), ref.forward_head(theirs)) < 1e-5, hw  # pooled (no head)


@pytest.mark.parametrize(
    "source, ours",
    [("vit_small_patch16_dinov3_qkvb", "vit_s_rope2d_dinov3"), ("vit_small_patch16_dinov3", "vit_s_rope2d_dinov3")],
)
def test_timm_layout_gives_timms_features(source, ours, tmp_path):
    ref, sd = _random_timm(source)
    _assert_same_features(_load(ours, sd, tmp_path), ref)


@pytest.mark.parametrize(
    "source, ours",
    [("vit_base_patch16_dinov3", "vit_b_rope2d_dinov3"), ("vit_large_patch16_dinov3", "vit_l_rope2d_dinov3")],
)
def test_base_and_large_timm_ports_load(source, ours, tmp_path):
    ref, sd = _random_timm(source)
    model = _load(ours, sd, tmp_path)
    x = torch.randn(1, 3, 224, 320)
    with torch.no_grad():
        assert _rel(model.forward_features(x), ref.forward_features(x)) < 1e-5


def _official_layout(timm_sd: dict, dim: int, head_dim: int = 64) -> dict:
    """DINOv3's own names for timm's weights: storage_tokens, qkv.bias + bias_mask (k third garbage, masked out),
    ls{1,2}.gamma, mask_token, rope_embed.periods (stored as bf16 in the releases)."""
    sd = {}
    for k, v in timm_sd.items():
        if k == "reg_token":
            sd["storage_tokens"] = v
        elif k.endswith("attn.q_bias"):
            prefix = k[: -len("q_bias")]
            sd[prefix + "qkv.bias"] = torch.cat([v, torch.randn_like(v), timm_sd[prefix + "v_bias"]])
            sd[prefix + "qkv.bias_mask"] = torch.cat([torch.ones(dim), torch.zeros(dim), torch.ones(dim)])
        elif k.endswith("attn.v_bias"):
            continue
        else:
            sd[k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")] = v
    sd["mask_token"] = torch.zeros(1, dim)
    sd["rope_embed.periods"] = (100.0 ** (torch.arange(head_dim // 4) / (head_dim // 4))).bfloat16()
    return {"model": sd}


def test_official_layout_gives_timms_features(tmp_path):
    ref, sd = _random_timm("vit_small_patch16_dinov3_qkvb")
    model = _load("vit_s_rope2d_dinov3", _official_layout(sd, 384), tmp_path)
    _assert_same_features(model, ref)
    bias = model.blocks[0].attn.qkv.bias
    assert torch.equal(bias[384:768], torch.zeros(384))  # the k third is zero, not the checkpoint's garbage


def test_a_checkpoint_k_bias_is_kept_or_refused_never_zeroed(tmp_path):
    from visionpe.pos import CheckpointMismatch

    # eva's names (q_bias, k_bias, v_bias), a non-zero k bias: with RoPE it changes the outputs
    ref, sd = _random_timm("vit_small_patch16_dinov3_qkvb")
    for i, block in enumerate(ref.blocks):
        sd[f"blocks.{i}.attn.k_bias"] = torch.randn_like(sd[f"blocks.{i}.attn.q_bias"]) * 0.5
        block.attn.k_bias.copy_(sd[f"blocks.{i}.attn.k_bias"])
    _assert_same_features(_load("vit_s_rope2d_dinov3", sd, tmp_path, qkv_bias=True), ref)  # kept
    with pytest.raises(CheckpointMismatch, match=r"blocks\.0\.attn\.k_bias .*non-zero.*qkv_bias=True"):
        _load("vit_s_rope2d_dinov3", sd, tmp_path)  # a q/v-bias model cannot hold it: refused
    # one qkv.bias without DINOv3's bias_mask
    torch.manual_seed(0)
    full = timm.create_model("vit_n_rope2d_dinov3", qkv_bias=True, **DEPTH2).eval()
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0, 0.2)
    kept = _load("vit_n_rope2d_dinov3", full.state_dict(), tmp_path, qkv_bias=True)
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        assert torch.equal(kept(x), full(x))
    with pytest.raises(CheckpointMismatch, match=r"blocks\.0\.attn\.qkv\.bias .*non-zero.*qkv_bias=True"):
        _load("vit_n_rope2d_dinov3", full.state_dict(), tmp_path)


def test_token_pooling_is_the_cls_token_as_timm(tmp_path):
    ref, sd = _random_timm("vit_small_patch16_dinov3_qkvb", global_pool="token")
    model = _load("vit_s_rope2d_dinov3", sd, tmp_path, global_pool="token")
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert _rel(model(x), ref(x)) < 1e-5


def test_architecture_is_dinov3s():
    m = timm.create_model("vit_s_rope2d_dinov3")
    assert m.num_reg_tokens == 4 and m.num_prefix_tokens == 5 and m.global_pool == "avg"
    assert m.blocks[0].ls1.gamma.eq(1e-5).all() and m.blocks[0].norm1.eps == 1e-5 and m.norm.eps == 1e-5
    assert m.blocks[0].attn.qv_bias_only and "pe.encodings.ape.pos_embed" not in m.state_dict()
    assert set(m.pe.encodings) == {"rope2d_dinov3"}


def test_k_bias_gets_no_gradient_and_does_not_act():
    m = timm.create_model("vit_n_rope2d_dinov3", num_classes=3)
    x = torch.randn(2, 3, 32, 32)
    m(x).sum().backward()
    attn = m.blocks[0].attn
    d = attn.qkv.bias.shape[0] // 3
    assert attn.qkv.bias.grad[d : 2 * d].abs().sum() == 0 and attn.qkv.bias.grad[:d].abs().sum() > 0
    with torch.no_grad():
        before = m(x)
        attn.qkv.bias[d : 2 * d] = 5.0
        assert torch.equal(m(x), before)
    with pytest.raises(ValueError, match="qkv_bias"):
        timm.create_model("vit_n_rope2d", qkv_bias="k")


@pytest.mark.parametrize("size, arch", [("s", "small"), ("b", "base"), ("l", "large")])
def test_lvd1689m_tags_point_at_timms_hub_copies(size, arch):
    ours = timm.models.get_pretrained_cfg(f"vit_{size}_rope2d_dinov3.lvd1689m")
    theirs = timm.models.get_pretrained_cfg(f"vit_{arch}_patch16_dinov3.lvd1689m")
    assert ours.hf_hub_id == theirs.hf_hub_id == f"timm/vit_{arch}_patch16_dinov3.lvd1689m"
    for field in ("num_classes", "input_size", "crop_pct", "interpolation", "mean", "std", "license"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.fixed_input_size is False and ours.paper_ids == "arXiv:2508.10104"
    assert timm.models.get_pretrained_cfg(f"vit_{size}_rope2d_dinov3").tag == "lvd1689m"
    assert list(WEIGHTS[f"vit_{size}_rope2d_dinov3"]) == ["lvd1689m"]
