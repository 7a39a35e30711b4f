"""The separable (per-axis) and compact forms of iRPE's bucket ids give the ids of the definition, and the row-block
routes that use them (one-hot matmul lookup, per-block ids) equal the whole-matrix math reference."""

import pytest
import torch

import visionpe.pos.irpe as irpe_module
from visionpe.attention.backends import attend_rows, attn_backend
from visionpe.layers.attention_layer import attention_core
from visionpe.layout.tokens import cell_centre_layout, image_layout
from visionpe.pos import IRPE, AttnSpec, PEHost
from visionpe.pos.irpe_lookup import FullBuckets, GridBuckets, compact_int_dtype


def _pe(grid, prefix, heads=2, head_dim=16, **options) -> IRPE:
    host = PEHost(dim=heads * head_dim, grid=grid, num_prefix=prefix, layers=(AttnSpec(32, heads, head_dim, None),))
    pe = IRPE(host, **options)
    g = torch.Generator().manual_seed(1)
    for p in pe.parameters():
        p.data = torch.randn(p.shape, generator=g)
    return pe


def _own(pe: IRPE):
    """Layer 0's tables (`pe.layer(0)`, as a backbone keeps them), drawn N(0, 1) from a seeded generator."""
    own = pe.layer(0)
    g = torch.Generator().manual_seed(1)
    for p in own.parameters():
        p.data = torch.randn(p.shape, generator=g)
    return own


@pytest.fixture
def always_separable(monkeypatch):
    """Small test grids take the separable route that large grids take."""
    monkeypatch.setattr(irpe_module, "SMALL_GRID_PAIRS", 0)


@pytest.mark.parametrize("mapping", ["product", "cross"])
@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("index", ["piecewise", "identity"])
def test_separable_ids_equal_the_definition(always_separable, mapping, prefix, index):
    pe = _pe((6, 7), prefix, mapping=mapping, index=index, max_offset=(2, 3) if index == "identity" else None)
    pairs = [
        (image_layout(6, 7, prefix), image_layout(6, 7, prefix)),
        (image_layout(6, 7, prefix), cell_centre_layout(3, 4, 2, prefix)),
    ]
    for ql, kl in pairs:
        ids = pe._buckets(ql, kl, pe.offsets[0])
        assert isinstance(ids, GridBuckets)
        expected = pe._ids(ql, kl, pe.offsets[0])
        assert all(torch.equal(a, b) for a, b in zip(ids.full(), expected))
        for start, stop in [(0, 1), (0, prefix + 3), (prefix + 5, ql.num_tokens)]:  # prefix rows, mixed, grid only
            assert all(torch.equal(a, b[start:stop]) for a, b in zip(ids.block(start, stop), expected))
        for start, stop in [(0, 1), (0, prefix + 3), (prefix + 2, kl.num_tokens)]:  # key columns
            assert all(torch.equal(a, b[:, start:stop]) for a, b in zip(ids.block_t(start, stop), expected))


def test_product_lookup_is_the_gather_it_replaces(always_separable):
    pe = _pe((5, 6), 1)
    layout = image_layout(5, 6, 1)
    ids = pe._buckets(layout, layout, pe.offsets[0])
    lut = torch.randn(2, 3, 31, pe.num_buckets(0))
    (full,) = ids.full()
    for start, stop in [(0, 31), (0, 1), (0, 4), (7, 19)]:
        gathered = lut[:, :, start:stop].gather(-1, full[start:stop].expand(2, 3, -1, -1))
        with torch.inference_mode():  # written into one output buffer
            assert torch.equal(ids.lookup(lut[:, :, start:stop], start, stop), gathered), "one-hot products are exact"
        with torch.enable_grad():  # the autograd form
            leaf = lut[:, :, start:stop].clone().requires_grad_()
            assert torch.equal(ids.lookup(leaf, start, stop), gathered)


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("keys", ["same", "strided"])
def test_banded_lookups_are_the_gathers_they_replace(always_separable, prefix, keys):
    """Rows by runs of key grid rows (the k term), and the transposed read of the q term (b(i, j) for a block of
    key columns j, every query i), on blocks that start and end inside grid rows or inside the prefix tokens."""
    pe = _pe((5, 6), prefix, targets="qk")
    ql = image_layout(5, 6, prefix)
    kl = ql if keys == "same" else cell_centre_layout(3, 3, 2, prefix)  # CvT-like keys: runs of 1-2 grid rows
    for a, b in ((ql, kl), (kl, ql)):
        ids = pe._buckets(a, b, pe.offsets[0])
        (full,) = ids.full()
        n, m = full.shape
        lut = torch.randn(2, 3, n, pe.num_buckets(0))
        gathered = lut.gather(-1, full.expand(2, 3, -1, -1))  # [.., n, m]
        for start, stop in [(0, n), (0, 1), (0, prefix + 3), (prefix + 2, min(n, prefix + 9)), (n - 1, n)]:
            got = ids.lookup_banded(lut[:, :, start:stop], start, stop)
            assert torch.equal(got, gathered[:, :, start:stop]), ("rows", start, stop)
        table = ids.columns_table(lut)
        for start, stop in [(0, m), (0, 1), (0, prefix + 3), (prefix + 2, min(m, prefix + 9)), (m - 1, m)]:
            expected = gathered[..., start:stop].transpose(-1, -2)
            got = ids.lookup_transposed(table, lut[..., -1], start, stop)
            assert torch.equal(got, expected), ("columns", start, stop)
            base = torch.randn_like(expected)  # added in place: one fp32 addition per element
            added = ids.lookup_transposed(table, lut[..., -1], start, stop, into=base.clone())
            assert torch.equal(added, base + expected)


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_bucket_sums_are_the_scatter_add_they_replace(always_separable, prefix):
    pe = _pe((5, 6), prefix, targets="qkv")
    layout = image_layout(5, 6, prefix)
    ids = pe._buckets(layout, layout, pe.offsets[0])
    (full,) = ids.full()
    n, buckets = layout.num_tokens, pe.num_buckets(0)
    probs = torch.rand(2, 3, n, n, generator=torch.Generator().manual_seed(0))
    for start, stop in [(0, n), (0, 1), (0, prefix + 3), (prefix + 2, n)]:  # prefix rows, mixed, grid only
        p = probs[:, :, start:stop]
        ref = p.new_zeros(*p.shape[:-1], buckets).scatter_add_(-1, full[start:stop].expand_as(p), p)
        for got in (ids.bucket_sums(p, start, stop, buckets), ids.bucket_sums_banded(p, start, stop, buckets)):
            # the same <= n terms in [0, 1) summed in another order: fp32 error at most n * eps * |sum|
            tol = n * torch.finfo(torch.float32).eps * ref.abs().max().item()
            assert torch.allclose(got, ref, atol=tol, rtol=0)
            assert torch.equal(got == 0, ref == 0)  # the same empty buckets: nothing lands in a wrong one


def test_positions_that_are_not_a_product_grid_keep_the_whole_id_grid(always_separable):
    pe = _pe((4, 4), 0)
    layout = image_layout(4, 4)
    bent = layout.with_pos(layout.pos + torch.linspace(0, 0.9, 16)[:, None])  # raster order, but x depends on y
    ids = pe._buckets(bent, bent, pe.offsets[0])
    assert isinstance(ids, FullBuckets)
    assert torch.equal(ids.full()[0], pe._ids(bent, bent, pe.offsets[0])[0])


def test_whole_id_grids_are_stored_compactly():
    pe = _pe((14, 14), 1)
    layout = image_layout(14, 14, 1)
    ids = pe._buckets(layout, layout, pe.offsets[0])
    assert isinstance(ids, FullBuckets) and ids.parts[0].dtype == torch.uint8  # 50 buckets
    assert [compact_int_dtype(n) for n in (255, 256, 32767, 32768)] == [
        torch.uint8,
        torch.int16,
        torch.int16,
        torch.int32,
    ]


@pytest.mark.parametrize(
    "options, prefix",
    [
        (dict(mode="contextual", mapping="product", targets="qkv"), 1),
        (dict(mode="contextual", mapping="product", targets="k", shared_heads=False), 0),
        (dict(mode="contextual", mapping="cross", targets="qkv"), 1),
        (dict(mode="bias", mapping="product", targets="qk", shared_heads=False), 2),
        (dict(mode="bias", mapping="product", targets="k"), 1),
    ],
)
@pytest.mark.parametrize("grad", [True, False])
def test_separable_row_blocks_match_the_math_reference(always_separable, options, prefix, grad):
    pe = _pe((5, 6), prefix, **options)
    own = _own(pe)
    ql, kl = image_layout(5, 6, prefix), cell_centre_layout(3, 3, 2, prefix)
    ctx = pe.context(0, ql, kl, own)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, ql.num_tokens, 16, generator=g, requires_grad=grad)
    k, v = (torch.randn(2, 2, kl.num_tokens, 16, generator=g, requires_grad=grad) for _ in range(2))
    with attn_backend("math"), torch.set_grad_enabled(grad):
        ref = attention_core(q, k, v, ctx)
    with torch.set_grad_enabled(grad):
        # blocks of 4 query rows: a prefix-only or mixed first block, grid blocks, a ragged last one
        out = attend_rows(q, k, v, ctx.bias, ctx.value, block_elements=2 * 2 * kl.num_tokens * 4)
    # fp32 attention over <= 11 keys, 16 channels, O(1) inputs: sums of ~16-50 terms, errors ~1e-6; 1e-5 relative
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    if grad:
        params = [q, k, v, *own.parameters()]
        grads_ref = torch.autograd.grad(ref.square().sum(), params)
        grads = torch.autograd.grad(out.square().sum(), params)
        for a, b in zip(grads, grads_ref):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # backward chains two such reductions: 10x the forward
