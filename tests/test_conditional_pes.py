import pytest
import timm
import torch
import torch.nn.functional as F

import visionpe  # noqa: F401
from visionpe.layers.attention_layer import attention_core
from visionpe.layers.token_merger import AdaptiveTokenMerger, merge_plan
from visionpe.layout.tokens import image_layout, window_layout
from visionpe.pos import CPE, AttnSpec, FuzzyPE, LePE, PEHost
from visionpe.zoo.vit_family import VIT

TINY = dict(VIT.tiny)


def _host(dim=16, grid=(8, 8), prefix=1, depth=2, heads=2, dims=None):
    dims = dims or [dim] * depth
    layers = tuple(AttnSpec(d, heads, d // heads) for d in dims)
    return PEHost(dim=dims[0], grid=grid, num_prefix=prefix, layers=layers)


def _zero(module):
    for p in module.parameters():
        torch.nn.init.zeros_(p)
    return module


def _own(pe):
    """Each layer's own module (`pe.layer(i)`, None where it has none), as a backbone keeps it in its block."""
    return [pe.layer(i) for i in range(pe.host.depth)]


# --------------------------------------------------------------------------------------------------------- CPE / PEG


def test_peg_with_a_zero_conv_is_the_identity():
    peg = CPE(_host())
    own = _own(peg)
    _zero(own[0])
    x = torch.randn(2, 1 + 64, 16)
    assert torch.equal(peg.block(0, x, image_layout(8, 8, 1), own[0]), x)  # exact: x + 0 is x


def test_peg_is_x_plus_a_depthwise_conv_and_leaves_prefix_tokens_alone():
    peg = CPE(_host(prefix=2))
    conv = peg.layer(0)
    x = torch.randn(2, 2 + 48, 16)
    out = peg.block(0, x, image_layout(6, 8, 2), conv)
    assert torch.equal(out[:, :2], x[:, :2])
    feat = x[:, 2:].transpose(1, 2).reshape(2, 16, 6, 8)
    ref = feat + F.conv2d(feat, conv.weight, conv.bias, padding=1, groups=16)
    # 9-tap fp32 depthwise conv (|terms| <= ~5) plus residual, maybe another kernel for another memory layout:
    # error ~ 10 eps * 5 ~ 3e-6; a wrong padding, group or missing residual is O(0.1)
    assert torch.allclose(out[:, 2:], ref.flatten(2).transpose(1, 2), atol=1e-5)


def test_peg_is_translation_equivariant_away_from_borders():
    peg = CPE(_host(prefix=0))
    conv = peg.layer(0)
    feat = torch.randn(1, 16, 12, 12)
    shifted = torch.roll(feat, shifts=(2, 3), dims=(2, 3))
    layout = image_layout(12, 12)
    tok = lambda f: f.flatten(2).transpose(1, 2)  # noqa: E731
    grid = lambda t: t.transpose(1, 2).reshape(1, 16, 12, 12)  # noqa: E731
    a = grid(peg.block(0, tok(feat), layout, conv))
    b = grid(peg.block(0, tok(shifted), layout, conv))
    inner = (slice(None), slice(None), slice(4, 11), slice(5, 11))  # away from borders and the wrapped rows
    # same 9-tap conv at other positions; vectorised tails may round differently: ~10 eps * 5 ~ 3e-6 (see above)
    assert torch.allclose(torch.roll(a, shifts=(2, 3), dims=(2, 3))[inner], b[inner], atol=1e-5)
    # zero padding vs wrapped rows changes border outputs by O(|w| |x|) ~ 0.1, far above 1e-3
    assert not torch.allclose(torch.roll(a, shifts=(2, 3), dims=(2, 3)), b, atol=1e-3), "borders are not"


def test_peg_acts_after_the_configured_blocks_with_each_blocks_width():
    peg = CPE(_host(dims=[16, 32, 32]), blocks=(0, 2))
    own = _own(peg)
    assert [sorted(o.state_dict()) if o is not None else None for o in own] == [
        ["bias", "weight"],
        None,
        ["bias", "weight"],
    ]
    assert not peg.state_dict() and own[2].weight.shape == (32, 1, 3, 3) and own[0].weight.shape == (16, 1, 3, 3)
    x = torch.randn(1, 17, 32)
    # exact: block 1 has no conv, x passes through
    assert torch.equal(peg.block(1, x, image_layout(4, 4, 1), own[1]), x)
    with pytest.raises(ValueError, match="blocks"):
        CPE(_host(depth=2), blocks=(2,))


def test_cpe_models_use_no_ape_and_cpe_gap_pools_by_average():
    cpe = timm.create_model("vit_n_cpe", **TINY)
    gap = timm.create_model("vit_n_cpe_gap", **TINY)
    assert cpe.pe.names == ["cpe"] and gap.pe.names == ["cpe"]
    assert cpe.cls_token is not None and gap.cls_token is None and gap.global_pool == "avg"
    for m in (cpe, gap):
        assert m(torch.randn(2, 3, 40, 48)).shape == (2, 10)


# ------------------------------------------------------------------------------------------------------------- LePE


def test_lepe_with_a_zero_conv_is_plain_attention():
    lepe = LePE(_host())
    conv = _zero(lepe.layer(1))
    q, k, v = torch.randn(3, 2, 2, 65, 8).unbind(0)
    out = attention_core(q, k, v, lepe.context(1, image_layout(8, 8, 1), None, conv))
    # the LePE path may use another attention kernel (math vs SDPA): softmax-weighted sums of 65 values
    # |v| <= ~4.5 differ by ~sqrt(65) eps * 4.5 ~ 2e-6; a non-zero term would be O(0.1)
    assert torch.allclose(out, attention_core(q, k, v, None), atol=1e-5)


def test_lepe_adds_dwconv_of_v_to_patch_tokens_only():
    lepe = LePE(_host(prefix=1))
    conv = lepe.layer(0)
    q, k, v = torch.randn(3, 2, 2, 1 + 30, 8).unbind(0)
    out = attention_core(q, k, v, lepe.context(0, image_layout(5, 6, 1), None, conv))
    term = out - attention_core(q, k, v, None)
    # term is a difference of two attention outputs (maybe two kernels): ~2e-6 each, see the test above;
    # a conv term on the CLS token would be O(0.1)
    assert torch.allclose(term[:, :, :1], torch.zeros(2, 2, 1, 8), atol=1e-5), "no LePE term for the CLS token"
    feat = v[:, :, 1:].transpose(2, 3).reshape(2, 16, 5, 6)  # all heads together, channel = head * d + c
    ref = F.conv2d(feat, conv.weight, conv.bias, padding=1, groups=16).reshape(2, 2, 8, 30).transpose(2, 3)
    # two attention outputs over 31 keys (~sqrt(31) eps * 4.5 ~ 2e-6 each) plus a 9-tap conv (~1e-6): < 1e-5
    assert torch.allclose(term[:, :, 1:], ref, atol=1e-5)


def test_lepe_is_translation_equivariant_away_from_borders():
    lepe = LePE(_host(prefix=0))
    value = lepe.context(0, image_layout(10, 10), None, lepe.layer(0)).value
    v = torch.randn(1, 2, 100, 8)
    shift = lambda t: torch.roll(t.unflatten(2, (10, 10)), (1, 2), (2, 3)).flatten(2, 3)  # noqa: E731
    zero = torch.zeros(1, 2, 100, 8)
    a, b = shift(value(v, zero, None)), value(shift(v), zero, None)
    inner = a.unflatten(2, (10, 10))[:, :, 2:9, 3:9], b.unflatten(2, (10, 10))[:, :, 2:9, 3:9]
    # same 9-tap conv at other positions; vectorised tails may round differently: ~10 eps * 5 ~ 3e-6
    assert torch.allclose(*inner, atol=1e-5)


def test_lepe_runs_per_window_with_zero_padding():
    ws, n_win = 4, 3
    lepe = LePE(PEHost(dim=16, grid=(8, 12), num_prefix=0, layers=(AttnSpec(16, 2, 8, (ws, ws)),)))
    value = lepe.context(0, window_layout(ws, ws), None, lepe.layer(0)).value
    v = torch.randn(2 * n_win, 2, ws * ws, 8)  # [B * nW, heads, ws * ws, d]
    zero = torch.zeros_like(v)
    term = value(v, zero, None)
    v2 = v.clone()
    v2[1] += 5.0  # another window changes; window 0 must not see it
    # exact: same call shape, so the same kernel and order; window 0's inputs are unchanged
    assert torch.equal(value(v2, zero, None)[0], term[0])
    alone = value(v[:1], zero[:1], None)
    # batch 1 vs 6 may pick another conv blocking: 9-tap sums ~10 eps * 5 ~ 3e-6; leaking a neighbour is O(0.1)
    assert torch.allclose(alone, term[:1], atol=1e-5), "each window is padded with zeros on its own"


def test_lepe_model_runs_and_rejects_keys_on_another_grid():
    model = timm.create_model("vit_n_lepe", **TINY)
    assert model(torch.randn(2, 3, 40, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="query grid"):
        model.pe.encodings["lepe"].context(0, image_layout(4, 4, 1), image_layout(2, 2, 1))


# -------------------------------------------------------------------------------------------------------- fuzzy PE


def _fuzzy(grid=(6, 7)):
    return FuzzyPE(_host(grid=grid, prefix=1))


def test_fuzzy_pe_in_eval_is_deterministic_and_the_table_itself():
    pe = _fuzzy().eval()
    layout = image_layout(6, 7, 1)
    x = torch.zeros(2, 1 + 42, 16)
    out = pe.tokens(x, layout)
    assert torch.equal(out, pe.tokens(x, layout))  # exact: eval is deterministic, same ops in the same order
    assert torch.equal(out[:, 1:], pe.pos_embed.expand(2, -1, -1)) and torch.equal(out[:, :1], x[:, :1])
    sampled = pe.sample(pe.reference_coords(layout))  # the bilinear path agrees at integer coordinates
    # weights 1/0 up to coordinate rounding ~1e-6 cells times |table| ~ 0.05 (std 0.02): ~1e-7
    assert torch.allclose(sampled, pe.pos_embed, atol=1e-6)


def test_fuzzy_pe_in_training_is_stochastic_within_the_neighbouring_entries():
    pe = _fuzzy().train()
    layout = image_layout(6, 7, 0)
    x = torch.zeros(1, 42, 16)
    a, b = pe.tokens(x, layout)[0], pe.tokens(x, layout)[0]
    assert not torch.allclose(a, b)  # independent jitters move samples by ~table spread (std 0.02) >> rtol 1e-5
    table = pe.pos_embed[0].reshape(6, 7, 16)
    for n in range(42):
        r, c = divmod(n, 7)
        near = table[max(r - 1, 0) : r + 2, max(c - 1, 0) : c + 2].reshape(-1, 16)
        for out in (a, b):
            # a fp32 convex combination of 4 entries |e| <= ~0.1 overshoots its range by < 4 eps * 0.1 ~ 3e-8
            assert (out[n] >= near.min(0).values - 1e-6).all() and (out[n] <= near.max(0).values + 1e-6).all()
    # offsets up to 0.5 cell move samples by ~0.5 * entry differences ~ 0.01 >> allclose's 1e-5
    assert not torch.allclose(a, pe.pos_embed[0]), "jitter moves the samples off the table entries"


def test_fuzzy_pe_at_another_grid_is_the_align_corners_bilinear_resample():
    pe = _fuzzy((6, 6)).eval()
    out = pe.tokens(torch.zeros(1, 11 * 9, 16), image_layout(11, 9, 0))
    table = pe.pos_embed.transpose(1, 2).reshape(1, 16, 6, 6)
    ref = F.interpolate(table, size=(11, 9), mode="bilinear", align_corners=True).flatten(2).transpose(1, 2)
    # grid_sample vs interpolate: coordinates agree to ~10 eps, 4-tap sums of |e| <= ~0.1: error ~1e-7 << 1e-5
    assert torch.allclose(out, ref, atol=1e-5)


def test_fuzzy_pe_rejects_impossible_jitter():
    with pytest.raises(ValueError, match="jitter"):
        FuzzyPE(_host(), jitter=-0.1)


# ------------------------------------------------------------------------------------------------------------- ATM


def test_token_merger_reaches_14x14_from_224_to_1120():
    atm = AdaptiveTokenMerger(32, 14, num_heads=2).eval()
    with torch.no_grad():
        for px in range(224, 1121, 48):
            side = px // 16
            assert atm(torch.randn(1, side, side, 32)).shape == (1, 14, 14, 32), px
        assert atm(torch.randn(1, 30, 70, 32)).shape == (1, 14, 14, 32), "rectangular grids too"
    assert merge_plan((14, 14), (14, 14)) == [], "the reference grid passes unchanged"
    assert [rows[0] for rows, _ in merge_plan((70, 70), (14, 14))] == [35, 18, 14]
    assert [rows[0] for rows, _ in merge_plan((29, 29), (14, 14))] == [15, 14], "odd sizes get a padding slot"


def test_token_merger_cell_is_cross_attention_of_its_mean_over_real_tokens():
    atm = AdaptiveTokenMerger(8, (2, 1), num_heads=2)
    x = torch.randn(1, 3, 2, 8)  # 3 rows -> 2 cells: rows (0, 1) and row 2 with a padding slot; 2 cols -> 1
    out = atm(x)
    cell = x[0, 2]  # the padded cell's real tokens [2, 8]
    q = atm.q(atm.norm_q(cell.mean(0, keepdim=True)))
    k, v = atm.kv(atm.norm_kv(cell)).chunk(2, dim=-1)
    heads = lambda t: t.reshape(t.shape[0], 2, 4).transpose(0, 1)  # noqa: E731
    attn = (heads(q) @ heads(k).transpose(-1, -2) / 2.0).softmax(-1) @ heads(v)  # [2, 1, 4]
    merged = cell.mean(0) + atm.proj(attn.transpose(0, 1).reshape(8))
    merged = merged + atm.mlp(atm.norm2(merged))
    # width-8 LayerNorm, linears and a 2-key softmax on O(1) values, batched vs by hand: ~1e-6 << 1e-5;
    # averaging the padding slot or another cell would change outputs by O(0.1)
    assert torch.allclose(out[0, 1, 0], merged, atol=1e-5)


def test_vit_with_token_merger_feeds_a_fixed_grid_to_its_pe():
    tiny = {**TINY, "patch_size": 16, "img_size": 224, "depth": 1}
    model = timm.create_model("vit_n_fuzzy_atm", **tiny).eval()
    assert model.patch_embed.patch_size == (8, 8) and model.pe_grid == (14, 14)
    assert model.pe.encodings["fuzzy"].pos_embed.shape == (1, 196, 32)
    with torch.no_grad():
        for px in (224, 480, 1120):
            assert model.forward_features(torch.randn(1, 3, px, px)).shape == (1, 1 + 196, 32)
    assert model.token_grid((1120, 1120)) == (14, 14)


def test_token_merger_grid_larger_than_the_input_is_an_error():
    with pytest.raises(ValueError, match="merger"):
        AdaptiveTokenMerger(16, 14, num_heads=2, input_grid=(10, 10))
    with pytest.raises(ValueError, match="merger"):
        timm.create_model("vit_n_fuzzy", **TINY, merger_grid=5)  # 32 px / 8 = 4 x 4 patches
    with pytest.raises(ValueError, match="token_merger"):
        timm.create_model("vit_n_fuzzy_atm", **{**TINY, "patch_size": 5})
    model = timm.create_model("vit_n_fuzzy_atm", **TINY)
    with pytest.raises(ValueError, match="larger image"):
        model(torch.randn(1, 3, 12, 12))  # 3 x 3 patches of 4 px, merger grid 4 x 4
