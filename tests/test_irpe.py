import pytest
import timm
import torch
from torch import nn

import visionpe  # noqa: F401
from visionpe.attention.backends import attn_backend
from visionpe.layers.attention_layer import attention_core
from visionpe.layout.tokens import cell_centre_layout, image_layout, window_layout
from visionpe.pos import IRPE, AttnSpec, PEHost, build_pos_encoding, piecewise_index, relative_bucket_ids
from visionpe.zoo.vit_family import VIT

TINY = dict(VIT.tiny)


def _host(grid=(14, 14), prefix=1, layers=((384, 6, 64),), windows=None):
    specs = tuple(AttnSpec(d, h, hd, windows) for d, h, hd in layers)
    return PEHost(dim=layers[0][0], grid=grid, num_prefix=prefix, layers=specs)


def _randomise(pe: IRPE) -> tuple[IRPE, nn.ModuleList]:
    """The PE and its layers' modules (`pe.layer(i)`, as a backbone keeps them), their tables drawn N(0, 1)."""
    own = nn.ModuleList([pe.layer(i) for i in range(pe.host.depth)])
    for p in [*pe.parameters(), *own.parameters()]:
        torch.nn.init.normal_(p)
    return pe, own


def _explicit_ids(pe: IRPE, q_layout, k_layout, i=0) -> list[torch.Tensor]:
    return pe._ids(q_layout, k_layout, pe.offsets[i])


# ------------------------------------------------------------------------------------------------- index and buckets


def test_piecewise_index_for_ratio_1_9():
    x = torch.arange(11, dtype=torch.float32)
    assert piecewise_index(x, 1.9, 3.8, 15.2).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3]
    assert piecewise_index(-x, 1.9, 3.8, 15.2).tolist() == [0, -1, -2, -2, -3, -3, -3, -3, -3, -3, -3]
    far = piecewise_index(torch.tensor([1e4, -1e4]), 1.9, 3.8, 15.2)
    assert far.tolist() == [3, -3], "saturates at +-int(beta) at any distance"


@pytest.mark.parametrize("mapping, buckets", [("product", 50), ("euclidean", 8), ("quantization", 8), ("cross", 2 * 8)])
def test_bucket_count_on_14x14_with_cls(mapping, buckets):
    pe = IRPE(_host(), mapping=mapping)
    assert pe.num_buckets(0) == buckets
    layout = image_layout(14, 14, 1)
    ids = _explicit_ids(pe, layout, layout)
    used = torch.cat([t.flatten() for t in ids]).unique()
    assert used.max() < buckets and used.min() >= 0
    if mapping == "product":
        assert used.tolist() == list(range(50)), "a 14 x 14 grid reaches every product bucket"


def test_bucket_ids_follow_the_definition():
    pos = image_layout(6, 9).pos
    ids, n = relative_bucket_ids(pos, pos, "product")
    g = lambda x: piecewise_index(torch.tensor(float(x)), 1.9, 3.8, 15.2).item()  # noqa: E731
    for i, j in [(0, 53), (53, 0), (10, 11), (40, 4), (7, 7)]:
        dr = pos[i, 1] - pos[j, 1]
        dc = pos[i, 0] - pos[j, 0]
        assert ids[i, j] == (g(dr) + 3) * 7 + g(dc) + 3
    (rows, cols), (nr, nc) = relative_bucket_ids(pos, pos, "cross")
    assert (nr, nc) == (7, 7) and rows[0, 53] == g(-5) + 3 and cols[0, 53] == g(-8) + 3
    eu, _ = relative_bucket_ids(pos, pos, "euclidean")
    qu, _ = relative_bucket_ids(pos, pos, "quantization")
    assert eu[0, 10] == g(round((1 + 1) ** 0.5)) + 3 and qu[0, 10] == g(2) + 3


def test_prefix_pairs_share_one_extra_bucket():
    pe = IRPE(_host(grid=(5, 5), prefix=2))
    layout = image_layout(5, 5, 2)
    (ids,) = _explicit_ids(pe, layout, layout)
    assert ids.shape == (27, 27)
    extra = pe.num_buckets(0) - 1
    assert (ids[:2] == extra).all() and (ids[:, :2] == extra).all(), "CLS-CLS, CLS-patch and patch-CLS"
    assert (ids[2:, 2:] < extra).all()


@pytest.mark.parametrize("ws", [(7, 7), (4, 6)])
def test_identity_product_is_swins_relative_position_index(ws):
    h, w = ws
    ids, n = relative_bucket_ids(
        window_layout(h, w).pos, window_layout(h, w).pos, "product", "identity", max_offset=(h - 1, w - 1)
    )
    ref = torch.empty(h * w, h * w, dtype=torch.long)
    for i in range(h * w):
        for j in range(h * w):
            dy, dx = i // w - j // w, i % w - j % w
            ref[i, j] = (dy + h - 1) * (2 * w - 1) + (dx + w - 1)
    assert torch.equal(ids, ref) and n == (2 * h - 1) * (2 * w - 1)


def test_swin_relative_position_bias_layout():
    host = _host(grid=(56, 56), prefix=0, layers=((96, 3, 32), (96, 3, 32), (192, 6, 32)), windows=(7, 7))
    pe, own = _randomise(IRPE(host, mode="bias", mapping="product", index="identity", shared_heads=False))
    assert [tuple(o.bias_k.shape) for o in own] == [(169, 3), (169, 3), (169, 6)], "no prefix bucket"
    assert not pe.state_dict() and all(set(o.state_dict()) == {"bias_k"} for o in own), "each layer its table"
    win = window_layout(7, 7)
    bias = pe.context(2, win, None, own[2]).bias(torch.zeros(8, 6, 49, 32), None)
    index, _ = relative_bucket_ids(win.pos, win.pos, "product", "identity", max_offset=6)
    expected = own[2].bias_k[index.flatten()].view(49, 49, 6).permute(2, 0, 1)  # Swin's lookup
    assert bias.shape == (1, 6, 49, 49) and torch.equal(bias[0], expected)


def test_bucket_ids_are_cached_per_grid():
    pe = IRPE(_host())
    a, b = image_layout(14, 14, 1), image_layout(20, 12, 1)
    first = pe._cached_ids(a, a, pe.offsets[0])
    assert pe._cached_ids(a, a, pe.offsets[0]) is first
    other = pe._cached_ids(b, b, pe.offsets[0])
    assert other is not first and other.full()[0].shape == (1 + 240, 1 + 240)
    assert pe._cached_ids(a.with_pos(a.pos.clone()), a, pe.offsets[0]) is first, "equal positions hit the cache"
    assert int(other.full()[0].max()) == pe.num_buckets(0) - 1, "ids saturate: the same table serves any grid"


# ------------------------------------------------------------------------------------------------- attention terms


def _reference_attention(pe: IRPE, own, q, k, v, ql, kl, i=0):
    """softmax(q k^T / sqrt(d) + terms) v + v-term with every N x M x d lookup materialised."""
    ids = _explicit_ids(pe, ql, kl, i)
    ids_t = [t.t() for t in _explicit_ids(pe, kl, ql, i)]  # b(j, i) at [i, j]
    heads = q.shape[1]
    s = q.shape[-1] ** -0.5

    def rel(target, idx):  # [H, N, M, d]
        table = getattr(own, target)
        look = sum(table[t] if pe.shared_heads else table[:, t] for t in idx)
        return look.expand(heads, *look.shape[-3:]) if pe.shared_heads else look

    logits = (q * s) @ k.transpose(-1, -2)
    if "k" in pe.targets:
        logits = logits + torch.einsum("bhid,hijd->bhij", q * s, rel("k", ids))
    if "q" in pe.targets:
        logits = logits + torch.einsum("bhjd,hijd->bhij", k * s, rel("q", ids_t))
    a = logits.softmax(-1)
    out = a @ v
    if "v" in pe.targets:
        out = out + torch.einsum("bhij,hijd->bhid", a, rel("v", ids))
    return out


@pytest.mark.parametrize("mapping", ["product", "cross", "euclidean", "quantization"])
@pytest.mark.parametrize("shared", [True, False])
def test_contextual_terms_equal_the_explicit_formula(mapping, shared):
    pe, own = _randomise(IRPE(_host((5, 6), 1, ((64, 4, 16),)), mapping=mapping, targets="qkv", shared_heads=shared))
    layout = image_layout(5, 6, 1)
    q, k, v = torch.randn(3, 2, 4, 31, 16).unbind(0)
    ctx = pe.context(0, layout, None, own[0])
    assert ctx.needs_probs
    out = attention_core(q, k, v, ctx)
    assert torch.allclose(out, _reference_attention(pe, own[0], q, k, v, layout, layout), atol=1e-5)


def test_keys_with_their_own_layout_cvt_cell_centres():
    pe, own = _randomise(IRPE(_host((8, 8), 1, ((64, 4, 16),)), targets=("q", "k", "v")))
    ql, kl = image_layout(8, 8, 1), cell_centre_layout(4, 4, 2, 1)
    q = torch.randn(2, 4, 65, 16)
    k, v = torch.randn(2, 2, 4, 17, 16).unbind(0)
    out = attention_core(q, k, v, pe.context(0, ql, kl, own[0]))
    assert out.shape == (2, 4, 65, 16)
    assert torch.allclose(out, _reference_attention(pe, own[0], q, k, v, ql, kl), atol=1e-5)


def test_bias_mode_adds_one_scalar_per_bucket_and_head():
    pe, own = _randomise(IRPE(_host((4, 4), 1, ((32, 2, 16),)), mode="bias", shared_heads=False))
    layout = image_layout(4, 4, 1)
    q, k, v = torch.randn(3, 1, 2, 17, 16).unbind(0)
    (ids,) = _explicit_ids(pe, layout, layout)
    bias = own[0].bias_k[ids].permute(2, 0, 1)  # [H, N, M]
    ref = ((q * 0.25) @ k.transpose(-1, -2) + bias).softmax(-1) @ v
    assert torch.allclose(attention_core(q, k, v, pe.context(0, layout, None, own[0])), ref, atol=1e-5)


def test_backends_agree_on_the_contextual_bias():
    pe, own = _randomise(IRPE(_host((6, 6), 1, ((32, 2, 16),)), targets=("q", "k")))
    layout = image_layout(6, 6, 1)
    q, k, v = torch.randn(3, 2, 2, 37, 16).unbind(0)
    ctx = pe.context(0, layout, None, own[0])
    assert not ctx.needs_probs
    with attn_backend("math"):
        ref = attention_core(q, k, v, ctx)
    with attn_backend("sdpa"):
        assert torch.allclose(attention_core(q, k, v, ctx), ref, atol=1e-5)


def test_hierarchical_hosts_get_tables_per_layer():
    host = _host(layers=((64, 2, 32), (128, 4, 32), (256, 8, 32)), prefix=0)
    pe = IRPE(host, targets=("k", "v"), shared_heads=False)
    own = [pe.layer(i) for i in range(3)]
    assert [tuple(o.k.shape) for o in own] == [(2, 49, 32), (4, 49, 32), (8, 49, 32)]
    assert not pe.state_dict() and all(set(o.state_dict()) == {"k", "v"} for o in own)


# ------------------------------------------------------------------------------------------------- models


@pytest.mark.parametrize("pe", ["irpe", "irpe_bias", "irpe_qkv"])
def test_zero_tables_give_exactly_the_attention_without_irpe(pe):
    ape = timm.create_model("vit_n_ape", **TINY).eval()
    model = timm.create_model(f"vit_n_{pe}", **TINY).eval()
    missing, unexpected = model.load_state_dict(ape.state_dict(), strict=False)
    assert not unexpected and missing and all(".attn.pos.irpe." in k for k in missing)
    x = torch.randn(2, 3, 40, 32)
    with torch.no_grad():
        # the iRPE model attends through its row-block route, the APE one through SDPA: two fp32 kernels whose sums
        # over <= 21 keys and 32 channels round differently (~sqrt(32) eps |logit| ~ 1e-6); real terms move them > 1e-2
        assert torch.allclose(model(x), ape(x), atol=1e-5, rtol=0)
        for p in (p for n, p in model.named_parameters() if ".pos.irpe." in n):
            torch.nn.init.normal_(p, std=30.0)  # q, k, v of a fresh model are small
        change = (model.forward_features(x) - ape.forward_features(x)).abs().max()
        assert change > 1e-2, "non-zero tables change the output"


def test_ids_cached_under_inference_mode_serve_training():
    model = timm.create_model("vit_n_irpe_qkv", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        model(x)
    model.train()
    model(x).square().mean().backward()
    assert model.blocks[0].attn.pos["irpe"].q.grad is not None


def test_irpe_keeps_ape_and_excludes_tables_from_weight_decay():
    model = timm.create_model("vit_n_irpe", **TINY)
    assert model.pe.names == ["irpe", "ape"]
    assert "blocks.0.attn.pos.irpe.k" in model.no_weight_decay()  # exact names, no wildcards
    params = dict(model.named_parameters())
    assert tuple(params["blocks.0.attn.pos.irpe.k"].shape) == (50, 16)
    assert (params["blocks.0.attn.pos.irpe.k"] == 0).all()


@pytest.mark.parametrize(
    "options",
    [
        dict(mode="bias", mapping="cross", targets=("q",)),
        dict(mode="contextual", mapping="euclidean", targets=("q", "v"), shared_heads=False),
        dict(mode="contextual", mapping="quantization", targets="k", ratio=1.0),
        dict(mode="contextual", mapping="product", index="identity", max_offset=2, targets=("k", "v")),
    ],
)
def test_every_option_is_reachable_through_model_kwargs(options):
    model = timm.create_model("vit_n_irpe", **TINY, pe_kwargs={"irpe": options}).train()
    irpe = model.pe.encodings["irpe"]
    assert (irpe.mode, irpe.mapping) == (options["mode"], options["mapping"])
    out = model(torch.randn(2, 3, 48, 40))
    out.square().mean().backward()
    tables = [p for n, p in model.named_parameters() if ".pos.irpe." in n]
    assert tables and all(p.grad is not None for p in [*irpe.parameters(), *tables])


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(ratio=0.0), "ratio"),
        (dict(ratio=-1.0), "ratio"),
        (dict(mapping="manhattan"), "mapping"),
        (dict(targets=("k", "o")), "targets"),
        (dict(mode="relative"), "mode"),
        (dict(mode="bias", targets=("v",)), "contextual"),
        (dict(index="log"), "index"),
    ],
)
def test_impossible_settings_fail_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        build_pos_encoding("irpe", _host(), {"irpe": options})


def test_layout_with_prefix_tokens_needs_a_prefix_bucket():
    pe = IRPE(_host(prefix=0))
    with pytest.raises(ValueError, match="num_prefix"):
        pe.context(0, image_layout(14, 14, 1))


# ------------------------------------------------------------------------------------------------ row-block route


@pytest.mark.parametrize(
    "options",
    [
        dict(mode="contextual", mapping="product", targets="qkv"),
        dict(mode="contextual", mapping="cross", targets="qk", shared_heads=False),
        dict(mode="bias", mapping="product", targets="qk"),
        dict(mode="bias", mapping="euclidean", targets="q", shared_heads=False),
    ],
)
def test_row_blocks_match_the_math_reference_with_grads(options):
    """Every route (fused backend per block, math per block with the value term) against the whole-matrix math path,
    with blocks of 5 rows so that several blocks and a ragged last one are exercised."""
    from visionpe.attention.backends import attend_rows

    pe, own = _randomise(IRPE(_host(grid=(5, 6), layers=((32, 2, 16),)), **options))
    layout = image_layout(5, 6, 1)
    ctx = pe.context(0, layout, None, own[0])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 31, 16, generator=g, requires_grad=True) for _ in range(3))
    with attn_backend("math"):
        ref = attention_core(q, k, v, ctx)
    grads_ref = torch.autograd.grad(ref.square().sum(), [q, k, v, *own.parameters()])
    out = attend_rows(q, k, v, ctx.bias, ctx.value, block_elements=2 * 2 * 31 * 5)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, *own.parameters()])
    # fp32 softmax attention over 31 keys with O(1) inputs: sums of ~31-50 terms, errors ~1e-6; 1e-5 relative
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # backward chains two such reductions: 10x the forward
    with attn_backend("sdpa"):
        assert torch.allclose(attention_core(q, k, v, ctx), ref, atol=1e-5, rtol=1e-5)


def test_q_bias_reads_the_mirrored_bucket():
    pe, own = _randomise(IRPE(_host(grid=(3, 4), prefix=0, layers=((8, 1, 8),)), mode="bias", targets="q"))
    layout = image_layout(3, 4)
    (ids,) = _explicit_ids(pe, layout, layout)
    bias = pe.context(0, layout, None, own[0]).bias(torch.zeros(1, 1, 12, 8), torch.zeros(1, 1, 12, 8))
    assert torch.equal(bias[0, 0], own[0].bias_q[ids.t(), 0]), "logit_ij += rQ[b(j, i)]"
    assert not torch.equal(ids, ids.t()), "the product buckets are not symmetric, so the mirror matters"


def test_math_backend_takes_an_fp32_bias_on_a_bf16_model():
    model = timm.create_model("vit_n_irpe", **{**TINY, "img_size": 32}).to(torch.bfloat16).eval()
    for p in (p for n, p in model.named_parameters() if ".pos.irpe." in n):
        torch.nn.init.normal_(p)
        p.data = p.data.float()  # a PE that keeps fp32 tables
    x = torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)
    with torch.no_grad(), attn_backend("math"):
        a = model(x)
    with torch.no_grad(), attn_backend("sdpa"):
        b = model(x)
    assert a.dtype == torch.bfloat16 and torch.isfinite(a).all()
    # bf16 (8 mantissa bits, eps 7.8e-3) through two blocks: logits agree to a few eps of their size
    assert (a.float() - b.float()).abs().max() <= 0.1 * max(1.0, b.float().abs().max().item())
