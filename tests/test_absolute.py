import math

import torch
from timm.layers import resample_abs_pos_embed

from visionpe.layout.tokens import image_layout
from visionpe.pos import AttnSpec, LearnedAPE, PEHost, SinCos2D
from visionpe.pos.absolute import sincos_2d


def _host(grid=(4, 6), prefix=1, embed_prefix=True, dim=8):
    return PEHost(
        dim=dim, grid=grid, num_prefix=prefix, layers=(AttnSpec(dim, 2, dim // 2),), embed_prefix=embed_prefix
    )


def test_ape_resamples_rectangular_grids_bicubically_keeping_old_size():
    ape = LearnedAPE(_host())
    table = ape.table((8, 9))
    ref = resample_abs_pos_embed(ape.pos_embed, new_size=[8, 9], old_size=[4, 6], num_prefix_tokens=1)
    # exact: table() calls the same resample on the same tensor (same ops, same order)
    assert table.shape == (1, 1 + 72, 8) and torch.equal(table, ref)
    assert torch.equal(table[:, :1], ape.pos_embed[:, :1])  # the CLS entry is not resampled
    assert ape.pos_embed.shape == (1, 25, 8)  # the stored table keeps its size
    # a table that is constant along x stays constant along x after resampling (separable bicubic)
    with torch.no_grad():
        rows = torch.randn(4, 1, 8).expand(4, 6, 8).reshape(1, 24, 8)
        ape.pos_embed[:, 1:] = rows
    t = ape.table((8, 9))[0, 1:].reshape(8, 9, 8)
    # each output is a 4-tap fp32 weighted sum of equal values |v| < ~4 per axis: error ~ 16 * 4 * 6e-8 ~ 4e-6;
    # a non-separable or wrongly shaped resample differs by O(|v|) ~ 1
    assert (t - t[:, :1]).abs().max() < 1e-5


def test_ape_adds_to_patch_tokens_and_prefix_entry():
    ape = LearnedAPE(_host())
    x = torch.zeros(2, 25, 8)
    out = ape.tokens(x, image_layout(4, 6, num_prefix=1))
    assert torch.equal(out[0], ape.pos_embed[0])  # exact: 0 + e is e


def test_ape_without_prefix_entries_leaves_prefix_untouched():
    ape = LearnedAPE(_host(embed_prefix=False, prefix=2))
    x = torch.randn(1, 2 + 24, 8)
    out = ape.tokens(x, image_layout(4, 6, num_prefix=2))
    assert torch.equal(out[:, :2], x[:, :2])
    # one fp32 add per element, as in tokens(): equal to within 1 ulp, far inside allclose's rtol 1e-5
    assert torch.allclose(out[:, 2:], x[:, 2:] + ape.pos_embed)


def test_set_grid_resamples_the_stored_table():
    ape = LearnedAPE(_host())
    expect = ape.table((2, 3)).detach().clone()
    ape.set_grid((2, 3))
    assert ape.grid == (2, 3) and torch.equal(ape.pos_embed.data, expect)  # exact: set_grid stores table()'s output


def test_sincos_values_and_prefix():
    pe = sincos_2d(torch.tensor([[3.0, 5.0]]), 8)
    omega = [1.0, 10000**-0.5]
    expect = [math.sin(3 * w) for w in omega] + [math.cos(3 * w) for w in omega]
    expect += [math.sin(5 * w) for w in omega] + [math.cos(5 * w) for w in omega]
    # fp32 sin/cos of arguments <= 5 vs float64: error ~ |arg| * eps32 ~ 3e-7 on values in [-1, 1]
    assert torch.allclose(pe[0], torch.tensor(expect), atol=1e-6)
    s = SinCos2D(_host())
    x = torch.randn(1, 1 + 6, 8)
    out = s.tokens(x, image_layout(2, 3, num_prefix=1))
    assert torch.equal(out[:, 0], x[:, 0])
    assert sum(p.numel() for p in s.parameters()) == 0
