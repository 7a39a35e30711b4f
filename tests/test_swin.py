import re

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.tokens import window_layout
from visionpe.models.swin_windows import MASK_VALUE, plan_windows, window_mask
from visionpe.pos import CheckpointMismatch
from visionpe.zoo.swin_family import SWIN
from visionpe.zoo.swin_weights import checkpoint_filter_fn

TINY = dict(SWIN.tiny)


def _swin(name="swin_n_rpb", **kw):
    return timm.create_model(name, **{**TINY, **kw}).eval()


def _layers(model):
    """Each attention layer's positional state (`attn.pos`, a LayerPos) in layer order, over the stages."""
    return [block.attn.pos for stage in model.layers for block in stage.blocks]


@pytest.fixture(scope="module")
def timm_swin_t():
    """timm's Swin-T with random weights (2 blocks per stage keeps it fast; every stage still has a shifted block)."""
    torch.manual_seed(0)
    ref = timm.create_model("swin_tiny_patch4_window7_224", depths=(2, 2, 2, 2)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "relative_position_bias_table" in name:
                p.normal_()  # a bias that clearly matters
    return ref, timm.create_model("swin_t_rpb", depths=(2, 2, 2, 2)).eval()


# ------------------------------------------------------------------------------------------------ published weights


def test_timm_swin_tiny_state_dict_gives_the_same_logits(timm_swin_t):
    ref, model = timm_swin_t
    model.load_state_dict(checkpoint_filter_fn(ref.state_dict(), model))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expect, got = ref(x), model(x)
        # two implementations (other kernels and summation orders) of 12 fp32 blocks of width <= 768: ~sqrt(768) eps
        # ~ 2e-6 relative per op, grown through depth to ~1e-5 on the logits; a misplaced bias or mask is >> 1e-4
        assert (expect - got).abs().max() < 1e-4
        # the bias is Swin's: layer i's bias equals timm's relative_position_bias for that block
        ctx = model.pe.context(3, window_layout(7, 7), None, _layers(model)[3])
        timm_bias = ref.layers[1].blocks[1].attn._get_rel_pos_bias()
        q = torch.zeros(1, 6, 49, 16)
        assert torch.allclose(ctx.bias(q, q), timm_bias)  # exact: both gather the same table entries (q = 0)
        out = model(torch.randn(1, 3, 320, 320))  # any other size runs (windows padded and masked)
    assert out.shape == (1, 1000) and torch.isfinite(out).all()


def test_official_checkpoint_layout_loads_too(timm_swin_t):
    ref, model = timm_swin_t
    official = {}
    for k, v in ref.state_dict().items():  # official: merging at the end of the previous stage, head.weight
        k = re.sub(r"^layers\.(\d+)\.downsample", lambda m: f"layers.{int(m[1]) - 1}.downsample", k)
        official[k.replace("head.fc.", "head.")] = v
    for p in model.parameters():
        p.data.zero_()
    model.load_state_dict(checkpoint_filter_fn(official, model))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (ref(x) - model(x)).abs().max() < 1e-4  # same networks as the test above: same bound


def test_bias_tables_into_a_model_without_them_is_a_clear_error():
    ref = _swin()
    timm_style = {k: v for k, v in ref.state_dict().items() if not k.startswith("pe.") and ".attn.pos." not in k}
    timm_style["layers.0.blocks.0.attn.relative_position_bias_table"] = _layers(ref)[0]["irpe"].bias_k
    with pytest.raises(CheckpointMismatch, match="rpb"):
        checkpoint_filter_fn(timm_style, _swin("swin_n_rope2d"))


# ---------------------------------------------------------------------------------------------------- windows


@pytest.mark.parametrize("hw, window", [((8, 8), (4, 4)), ((10, 7), (4, 4)), ((5, 12), (7, 7))])
@pytest.mark.parametrize("shifted", [False, True])
def test_tokens_attend_exactly_the_tokens_whose_window_offset_is_their_map_offset(hw, window, shifted):
    """A pair may attend (mask 0) iff both are real (or both padding) and their window-local offset equals their
    offset on the feature map: the shift keeps positions consistent, wrapped neighbours and padding are cut off."""
    plan = plan_windows(hw, window, shifted)
    h, w = hw
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([xx, yy, torch.ones_like(xx)], -1)[None].float()  # (x, y, real) per map token
    win = plan.partition(coords)  # [nW, N, 3]; padding rows are (0, 0, 0)
    mask = window_mask(plan)
    mask = torch.zeros(win.shape[0], win.shape[1], win.shape[1]) if mask is None else mask
    local = window_layout(*plan.window).pos  # [N, 2] window-local (x, y)
    local_off = local[:, None] - local[None, :]
    map_off = win[:, :, None, :2] - win[:, None, :, :2]
    real = win[..., 2] > 0
    same_kind = real[:, :, None] == real[:, None, :]
    consistent = (map_off == local_off).all(-1)
    allowed = same_kind & (consistent | ~real[:, :, None])
    assert torch.equal(mask == 0, allowed)
    assert set(mask.unique().tolist()) <= {0.0, MASK_VALUE}
    if shifted and plan.shift != (0, 0):
        assert (mask != 0).any()  # the shift really cuts some pairs


def test_partition_and_reverse_are_inverse_and_windows_clamp_to_small_maps():
    x = torch.randn(2, 10, 7, 3)
    for shifted in (False, True):
        plan = plan_windows((10, 7), (4, 4), shifted)
        assert torch.equal(plan.reverse(plan.partition(x)), x)
    plan = plan_windows((5, 12), (7, 7), True)
    assert plan.window == (5, 7) and plan.shift == (0, 3)  # one window high: no shift along y
    assert plan_windows((7, 7), (7, 7), True).shift == (0, 0)  # Swin-T's last stage at 224
    assert window_mask(plan_windows((8, 8), (4, 4), False)) is None


# ----------------------------------------------------------------------------------------------------- model


def test_any_resolution_and_sizes_not_divisible_by_the_patch_are_zero_padded():
    m = _swin()
    for h, w in [(32, 32), (44, 20), (8, 8), (2, 70)]:
        assert m(torch.randn(1, 3, h, w)).shape == (1, 10)
    x = torch.randn(1, 3, 33, 31)
    with torch.no_grad():
        # same padded pixels, but the patch conv sees another input size (may pick other blocking): a few blocks
        # of width <= 64 on O(1) values, ~1e-6; padding with anything but zeros moves border tokens by O(0.1)
        assert torch.allclose(m(x), m(F.pad(x, (0, 1, 0, 1))), atol=1e-5)
    assert m.token_grid((33, 31)) == (9, 8)


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.randn(3, 32, 32), "batch dimension"),
        (torch.randn(1, 1, 32, 32), "input channels"),
        (torch.randn(1, 3, 1, 32), "patch"),
    ],
)
def test_bad_input_is_a_clear_error(x, match):
    with pytest.raises(ValueError, match=match):
        _swin()(x)


def test_pe_presets_act_inside_windows():
    x = torch.randn(1, 3, 32, 32)
    m = _swin("swin_n_rope2d")
    assert m.pe.encodings["rope2d"].theta == 50.0  # RoPE-ViT's Swin uses theta 50
    assert {s.grid for s in m.pe.host.layers} == {(4, 4)}  # per-layer grids are the windows
    outs = {pe: _swin(f"swin_n_{pe}")(x) for pe in ("rpb", "nope", "rope2d_mixed", "irpe", "lepe")}
    assert all(torch.isfinite(o).all() for o in outs.values())
    rpb = _swin()
    assert _layers(rpb)[0]["irpe"].bias_k.shape == ((2 * 4 - 1) ** 2, 1)
    assert _layers(rpb)[2]["irpe"].bias_k.shape == ((2 * 4 - 1) ** 2, 2)  # one column per head


def test_set_input_size_changes_the_window_and_resizes_the_bias_tables():
    m = _swin()
    with torch.no_grad():
        _layers(m)[1]["irpe"].bias_k.fill_(0.25)
    m.set_input_size(img_size=48, window_size=6)
    assert m.window_sizes == ((6, 6), (6, 6))
    table = _layers(m)[1]["irpe"].bias_k
    # resampling a constant: fp32 weights summing to 1 within a few eps, times 0.25: ~1e-7
    assert table.shape == (11 * 11, 1) and torch.allclose(table, torch.full_like(table, 0.25), atol=1e-5)
    assert m.pretrained_cfg["input_size"] == (3, 48, 48)
    assert m(torch.randn(1, 3, 48, 48)).shape == (1, 10)


def test_forward_intermediates_and_features_only():
    m = _swin()
    x = torch.randn(2, 3, 32, 48)
    final, inter = m.forward_intermediates(x)
    assert [t.shape for t in inter] == [(2, 16, 16, 24), (2, 32, 8, 12)]
    # another code path (reshapes between stages may pick other kernels) through blocks of width <= 64 on O(1)
    # normalised features: ~1e-6; a skipped block or norm changes them by O(1)
    assert torch.allclose(final, m.forward_features(x), atol=1e-5)
    fm = timm.create_model("swin_n_rpb", features_only=True, out_indices=(0, 1), **TINY)
    feats = fm(torch.randn(1, 3, 32, 32))
    assert [f.shape for f in feats] == [(1, 16, 16, 16), (1, 32, 8, 8)]
    assert fm.feature_info.channels() == [16, 32] and fm.feature_info.reduction() == [2, 4]


def test_head_pre_logits_and_reset_classifier():
    m = _swin()
    x = torch.randn(2, 3, 32, 32)
    feats = m.forward_features(x)
    assert feats.shape == (2, 8, 8, 32)
    assert m.forward_head(feats, pre_logits=True).shape == (2, 32)
    m.reset_classifier(5)
    assert m.get_classifier().out_features == 5 and m(x).shape == (2, 5)


def test_bias_tables_skip_weight_decay_and_grad_checkpointing_matches():
    m = _swin(drop_path_rate=0.0).train()
    assert "layers.0.blocks.0.attn.pos.irpe.bias_k" in m.no_weight_decay()  # exact names, no wildcards
    opt = create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05)
    table = _layers(m)[0]["irpe"].bias_k
    assert next(g for g in opt.param_groups if any(p is table for p in g["params"]))["weight_decay"] == 0.0
    x = torch.randn(2, 3, 32, 32)
    out = m(x)
    out.sum().backward()
    grad = table.grad.clone()
    m.zero_grad()
    m.set_grad_checkpointing(True)
    out2 = m(x)
    out2.sum().backward()
    # recomputation repeats the forward ops; the shared table's gradient sums the blocks' and windows'
    # contributions, maybe in another order: ~eps * sum |contributions| ~ 1e-6 on O(1) entries
    assert torch.allclose(out, out2, atol=1e-5) and torch.allclose(grad, table.grad, atol=1e-5)
