import re

import pytest
import timm
import torch
from timm.layers import QuickGELU
from timm.optim import create_optimizer_v2

import visionpe  # noqa: F401  (registers the models)
from visionpe.pos import CheckpointMismatch
from visionpe.zoo.cvt_family import CVT
from visionpe.zoo.cvt_weights import checkpoint_filter_fn

TINY = dict(CVT.tiny)


def _layers(model):
    """Each attention layer's positional state (`attn.pos`, a LayerPos) in layer order, over the stages."""
    return [block.attn.pos for stage in model.stages for block in stage.blocks]


def _cvt(name="cvt_n", **kw):
    return timm.create_model(name, **{**TINY, **kw}).eval()


@pytest.fixture(scope="module")
def hf_cvt():
    """transformers' CvtForImageClassification with CvT-13 widths, random weights and BatchNorm statistics.
    (Depths 1, 2, 3: fewer blocks keep it fast; the port needs depth[s] > s.)"""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.CvtConfig(depth=[1, 2, 3], num_labels=10)
    model = transformers.CvtForImageClassification(cfg).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    ours = _cvt13(act_layer="gelu")
    ours.load_state_dict(checkpoint_filter_fn(model.state_dict(), ours))
    return model, ours


def _cvt13(**kw):
    return timm.create_model("cvt_13", depths=(1, 2, 3), num_classes=10, **kw).eval()


# ------------------------------------------------------------------------------------------------ published weights


def test_paper_parameter_counts():
    with torch.device("meta"):  # shapes only
        counts = {n: sum(p.numel() for p in timm.create_model(n).parameters()) / 1e6 for n in ("cvt_13", "cvt_21")}
    # integer counts against the paper's figures, printed to 0.1 M: half a unit of the last digit
    assert counts["cvt_13"] == pytest.approx(20.0, abs=0.05)
    assert counts["cvt_21"] == pytest.approx(31.6, abs=0.05)


def test_transformers_port_loads_and_gives_the_same_logits_with_gelu(hf_cvt):
    hf_cvt, model = hf_cvt
    x = torch.randn(2, 3, 112, 96)
    with torch.no_grad():
        expect, got = hf_cvt(x).logits, model(x)
        # two implementations (other kernels and summation orders) of 6 fp32 blocks of width <= 384: ~sqrt(384) eps
        # ~ 1e-6 relative per op, grown through depth and BatchNorm/LayerNorm to ~1e-5 on logits |.| ~ 1-10;
        # a wrong op (QuickGELU for GELU, below) moves them by > 1e-3
        assert (expect - got).abs().max() < 1e-4
        quick = _cvt13()  # the default is the official QuickGELU: same weights, different function
        quick.load_state_dict(model.state_dict())
        assert (quick(x) - expect).abs().max() > 1e-3


def test_official_checkpoint_names_load(hf_cvt):
    hf_cvt, model = hf_cvt
    official = {re.sub(r"^stages\.(\d+)\.", r"stage\1.", k): v for k, v in model.state_dict().items()}
    for key in (  # names of leoxiaobin/CvT's cls_cvt.py
        "stage0.patch_embed.proj.weight",
        "stage2.cls_token",
        "stage2.blocks.2.attn.conv_proj_k.conv.weight",
        "stage2.blocks.2.attn.conv_proj_v.bn.running_var",
        "stage1.blocks.1.attn.proj_q.weight",
        "stage1.blocks.1.attn.proj.bias",
        "stage0.blocks.0.mlp.fc2.weight",
        "norm.weight",
        "head.weight",
    ):
        assert key in official
    fresh = _cvt13(act_layer="gelu")
    fresh.load_state_dict(checkpoint_filter_fn(official, fresh))
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert (fresh(x) - hf_cvt(x).logits).abs().max() < 1e-4  # same network as above: same bound


def test_a_checkpoint_of_another_depth_is_a_clear_error(hf_cvt):
    with torch.device("meta"):
        deeper = timm.create_model("cvt_13", depths=(1, 2, 4), num_classes=10)
    with pytest.raises(CheckpointMismatch, match="lacks"):
        checkpoint_filter_fn(hf_cvt[0].state_dict(), deeper)


def test_official_quirks_scale_activation_and_cls_in_the_last_stage_only():
    with torch.device("meta"):
        m = timm.create_model("cvt_13")
    attn = m.stages[2].blocks[0].attn
    assert attn.scale == 384**-0.5 and attn.head_dim == 64  # full width, not head_dim**-0.5
    assert isinstance(m.stages[0].blocks[0].mlp.act, QuickGELU)
    assert [s.cls_token is not None for s in m.stages] == [False, False, True]
    assert m.global_pool == "token"


# ---------------------------------------------------------------------------------------------------- positions


def test_keys_sit_at_their_cell_centres_in_query_grid_units():
    m = _cvt()
    q, kv = m.layouts(2, (5, 6))
    assert q.grid == (1, 5, 6) and kv.grid == (1, 3, 3)
    assert q.num_prefix == kv.num_prefix == 1  # the CLS token in the last stage
    # exact: half-integer centres are exact in fp32
    assert torch.equal(kv.pos[:3, 0], torch.tensor([0.5, 2.5, 4.5])) and torch.equal(kv.pos[::3, 1], kv.pos[:3, 0])
    q0, kv0 = m.layouts(0, (4, 4))
    assert q0.num_prefix == kv0.num_prefix == 0


@pytest.mark.parametrize("pe", ["rope2d", "rope2d_mixed"])
def test_rope_logits_depend_only_on_the_query_to_cell_centre_offset(pe):
    m = _cvt(f"cvt_n_{pe}")
    i = m.stage_starts[1]
    q_lay, kv_lay = m.layouts(1, (6, 6))
    rot = m.pe.context(i, q_lay, kv_lay, _layers(m)[i]).rotate
    heads, d = 2, 16
    qv = torch.randn(1, heads, 1, d).expand(1, heads, q_lay.num_tokens, d)
    kv = torch.randn(1, heads, 1, d).expand(1, heads, kv_lay.num_tokens, d)
    qr, kr = rot(qv, kv)
    logits = (qr @ kr.transpose(-1, -2))[0]  # [heads, N, M]
    by_offset = {}
    for a in range(q_lay.num_pos):
        for b in range(kv_lay.num_pos):
            key = tuple((q_lay.pos[a] - kv_lay.pos[b]).tolist())
            by_offset.setdefault(key, []).append(logits[:, a, b])
    spread = max((torch.stack(v) - v[0]).abs().max().item() for v in by_offset.values())
    # fp32 cos/sin of angles |pos * f| <= ~10 carry ~10 eps ~ 1e-6 each, times logits' scale |q||k| ~ 16: ~2e-5;
    # a logit that depended on the absolute position would differ by O(1), as the offsets below do (> 1e-3)
    assert spread < 1e-4 and len(by_offset) > 1
    assert (logits[:, 0, 0] - logits[:, 0, 1]).abs().max() > 1e-3


def test_cpe_acts_after_the_first_block_of_every_stage():
    assert _cvt("cvt_n_cpe").pe.encodings["cpe"].blocks == (0, 1, 2)
    with torch.device("meta"):
        assert timm.create_model("cvt_13_cpe").pe.encodings["cpe"].blocks == (0, 1, 3)
    assert _cvt("cvt_n_cpe", pe_kwargs=dict(blocks=(1,))).pe.encodings["cpe"].blocks == (1,)


# ----------------------------------------------------------------------------------------------------- model


def test_any_resolution_and_a_too_small_image_is_a_clear_error():
    m = _cvt("cvt_n_irpe")
    for h, w in [(32, 32), (44, 20), (7, 9), (1, 1)]:
        assert m(torch.randn(1, 3, h, w)).shape == (1, 10)
    assert m.token_grid((44, 20)) == (6, 3)
    with pytest.raises(ValueError, match="too small for CvT"):
        _cvt(patch_size=(7, 3, 3), patch_stride=(4, 2, 2), patch_padding=(2, 1, 1))(torch.randn(1, 3, 2, 64))
    with pytest.raises(ValueError, match="input channels"):
        m(torch.randn(1, 4, 32, 32))


def test_forward_intermediates_and_features_only():
    m = _cvt()
    x = torch.randn(2, 3, 32, 48)
    final, inter = m.forward_intermediates(x)
    assert [t.shape for t in inter] == [(2, 16, 16, 24), (2, 32, 8, 12), (2, 64, 4, 6)]
    # another code path (reshapes between stages may pick other kernels) through 6 blocks of width <= 64 on O(1)
    # normalised features: ~1e-6; a skipped block or norm changes them by O(1)
    assert torch.allclose(final, m.forward_features(x), atol=1e-5)
    nlc = m.forward_intermediates(x, indices=[2], output_fmt="NLC", intermediates_only=True)
    assert nlc[0].shape == (2, 24, 64)  # CLS excluded
    fm = timm.create_model("cvt_n_rope2d", features_only=True, **TINY)
    feats = fm(torch.randn(1, 3, 32, 32))
    assert [f.shape for f in feats] == [(1, 16, 16, 16), (1, 32, 8, 8), (1, 64, 4, 4)]
    assert fm.feature_info.reduction() == [2, 4, 8]


def test_avg_pool_without_cls_head_and_reset_classifier():
    m = _cvt(cls_token=False)
    assert m.global_pool == "avg" and m.stages[-1].cls_token is None
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 16, 64)
    # exact in practice: pool() is the same .mean(dim=1) over the same 16 tokens (no prefix); allclose for safety
    assert torch.allclose(m.forward_head(feats, pre_logits=True), feats.mean(1))
    with pytest.raises(ValueError, match="cls_token"):
        m.reset_classifier(5, "token")
    m.reset_classifier(5)
    assert m(x).shape == (2, 5)


def test_grad_checkpointing_matches_and_cls_skips_weight_decay():
    m = _cvt("cvt_n_rope2d_mixed").train()
    nwd = m.no_weight_decay()
    assert "stages.2.cls_token" in nwd and "stages.2.blocks.0.attn.pos.rope2d.freqs" in nwd
    opt = timm.optim.create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05)
    no_decay = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    freqs = [own["rope2d"].freqs for own in _layers(m)]
    assert len(freqs) == 3 and all(id(p) in no_decay for p in freqs)
    x = torch.randn(2, 3, 32, 32)
    out = m(x)
    out.sum().backward()
    grad = freqs[2].grad.clone()
    m.zero_grad()
    m.set_grad_checkpointing(True)
    out2 = m(x)
    out2.sum().backward()
    # recomputation repeats the forward ops; gradients from the 3 stages may accumulate in another order:
    # a few fp32 roundings of O(1-10) values, ~1e-6, inside atol 1e-5 + rtol 1e-5
    assert torch.allclose(out, out2, atol=1e-5) and torch.allclose(grad, freqs[2].grad, atol=1e-5)


def test_per_layer_rope_mixed_frequencies_skip_weight_decay():
    m = _cvt("cvt_n_rope2d_mixed")
    opt = create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05)
    freqs = _layers(m)[1]["rope2d"].freqs
    assert next(g for g in opt.param_groups if any(p is freqs for p in g["params"]))["weight_decay"] == 0.0
