"""Learnable Fourier features (`lff`) against their formula, and RADIO's cropped APE (`ape_radio`) against the rules
of transformers' `models/radio` (evaluation) and NVlabs/RADIO (training crops), re-derived here."""

import math

import pytest
import timm
import torch
from transformers.models.radio.configuration_radio import RadioConfig
from transformers.models.radio.modeling_radio import RadioPatchEmbeddings

from visionpe.layout.tokens import image_layout
from visionpe.pos import AttnSpec, PEHost
from visionpe.pos.ape_radio import CroppedAPE, radio_eval_table, window_sample
from visionpe.pos.fourier import LearnableFourier, fourier_features
from visionpe.zoo.vit_family import VIT


def _host(grid=(4, 4), dim=8, prefix=1):
    return PEHost(dim=dim, grid=grid, num_prefix=prefix, layers=(AttnSpec(dim, 2, dim // 2),))


# ------------------------------------------------------------------------------------------------ learnable Fourier


def _by_hand(pe: LearnableFourier, xy: list[tuple[float, float]]) -> torch.Tensor:
    """The paper's Algorithm 1 written out in float64, one position and one feature at a time."""
    w_r = pe.w_r.weight.detach().double()
    w1, b1, w2, b2 = (t.detach().double() for t in (pe.mlp[0].weight, pe.mlp[0].bias, pe.mlp[2].weight, pe.mlp[2].bias))
    nf = 2 * w_r.shape[0]
    rows = []
    for x, y in xy:
        angles = [float(w_r[k, 0]) * x + float(w_r[k, 1]) * y for k in range(w_r.shape[0])]
        feats = torch.tensor([math.cos(a) for a in angles] + [math.sin(a) for a in angles], dtype=torch.float64)
        hidden = w1 @ (feats / math.sqrt(nf)) + b1
        hidden = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))  # exact GELU
        rows.append(w2 @ hidden + b2)
    return torch.stack(rows)


def test_lff_equals_its_formula_on_patch_tokens_and_leaves_the_prefix():
    torch.manual_seed(0)
    pe = LearnableFourier(_host(dim=8), feature_dim=6, hidden_dim=5, gamma=2.0)
    layout = image_layout(3, 4, num_prefix=1)
    x = torch.randn(2, 13, 8)
    out = pe.tokens(x, layout)
    xy = [(float(i % 4), float(i // 4)) for i in range(12)]  # raster order, x = column
    want = _by_hand(pe, xy)
    # float32 features and MLP against float64: |error| ~ 1e-7 relative to O(1) values; a swapped x / y, sin / cos
    # order or a missing 1/sqrt(|F|) changes them by O(0.1)
    assert (out[:, 1:] - x[:, 1:] - want.float()).abs().max() < 1e-5
    assert torch.equal(out[:, :1], x[:, :1])


def test_lff_features_have_norm_one_over_sqrt2_and_shift_by_a_rotation():
    torch.manual_seed(1)
    w_r = torch.randn(5, 2, dtype=torch.float64)
    p = torch.randn(7, 2, dtype=torch.float64) * 3
    f = fourier_features(p.double(), w_r)
    assert torch.allclose(f.norm(dim=1), torch.full((7,), 2**-0.5, dtype=torch.float32), atol=1e-6)
    # translation: features of p + c are those of p rotated per frequency by the angle w_k . c
    c = torch.tensor([1.5, -2.0], dtype=torch.float64)
    phi = w_r @ c
    cos, sin = f[:, :5].double(), f[:, 5:].double()
    rotated = torch.cat([cos * phi.cos() - sin * phi.sin(), sin * phi.cos() + cos * phi.sin()], dim=1)
    assert torch.allclose(fourier_features(p + c, w_r).double(), rotated, atol=1e-6)
    # scale: scaling the coordinates is scaling the frequencies
    assert torch.allclose(fourier_features(p * 2.5, w_r), fourier_features(p, w_r * 2.5), atol=1e-6)


def test_lff_position_modes_read_raw_or_rescaled_coordinates():
    torch.manual_seed(2)
    model = timm.create_model("vit_n_lff", **VIT.tiny).eval()  # reference grid 4 x 4 (32 px, patch 8)
    pe = model.pe.encodings["lff"]
    ref = pe.encode(model.layout((4, 4)).pos).reshape(4, 4, -1)
    big = pe.encode(model.layout((8, 8)).pos).reshape(8, 8, -1)
    assert torch.equal(big[:4, :4], ref)  # extrapolate: the same patch index, the same PE; new indices beyond
    model.set_position_mode("interpolate")
    fine = pe.encode(model.layout((8, 8)).pos).reshape(8, 8, -1)
    assert torch.allclose(fine[::2, ::2], ref, atol=1e-6)  # interpolate: every other patch lands on the 4 x 4 grid
    assert (fine[1::2, 1::2] - ref).abs().max() > 1e-3  # and the others between them


def test_lff_learns_its_frequencies_without_weight_decay():
    pe = LearnableFourier(_host(), gamma=10.0)
    assert pe.w_r.weight.shape == (4, 2) and 0.0 < float(pe.w_r.weight.std()) < 1.0  # std 1 / gamma
    pe.tokens(torch.zeros(1, 17, 8), image_layout(4, 4, num_prefix=1)).sum().backward()
    assert pe.w_r.weight.grad is not None and pe.w_r.weight.grad.abs().sum() > 0
    assert pe.no_weight_decay() == {"w_r.weight"} and pe.layer(0) is None  # model-level: no per-layer state
    with pytest.raises(ValueError, match="even"):
        LearnableFourier(_host(), feature_dim=5)


# ------------------------------------------------------------------------------------------------------ RADIO CPE


def _radio(max_grid=16, dim=8, **kw) -> CroppedAPE:
    torch.manual_seed(3)
    return CroppedAPE(_host(dim=dim), max_grid=max_grid, **kw)


@pytest.mark.parametrize("grid", [(16, 16), (5, 5), (3, 7), (7, 3), (1, 9), (20, 20), (12, 30)])
def test_radio_eval_matches_transformers(grid):
    pe = _radio().eval()
    emb = RadioPatchEmbeddings(RadioConfig(hidden_size=8, patch_size=4, max_img_size=64, num_channels=3))
    with torch.no_grad():
        emb.position_embedding.copy_(pe.pos_embed)
        want = emb._interpolate_position_embedding(grid, torch.float32)
    assert torch.allclose(pe.table(grid), want, atol=1e-6)
    x = torch.zeros(2, 1 + grid[0] * grid[1], 8)
    out = pe.tokens(x, image_layout(*grid, num_prefix=1))
    assert torch.equal(out[:, 1:], want.expand(2, -1, -1)) and torch.equal(out[:, :1], x[:, :1])


def test_radio_eval_rule_resize_then_top_left_window():
    pe = _radio().eval()
    assert torch.equal(pe.table((16, 16)), pe.pos_embed)  # the table's own grid: the table itself
    img = pe.pos_embed.reshape(1, 16, 16, 8).permute(0, 3, 1, 2)
    full = torch.nn.functional.interpolate(img, size=(9, 9), mode="bilinear", align_corners=False)
    want = full[..., :4, :].flatten(2).transpose(1, 2)  # H < W: the first H rows of the W x W resize
    assert torch.allclose(pe.table((4, 9)), want, atol=1e-6)


@pytest.mark.parametrize("grid", [(16, 16), (5, 5), (3, 7), (7, 3), (1, 9), (20, 20), (40, 2)])
def test_radio_eval_window_for_symbolic_sizes_equals_resize_then_crop(grid):
    """The one-grid_sample form used under torch.export samples the same points as resize-then-crop: equal up to
    float32 rounding of the coordinates (~1e-6 on O(1) values); a shifted half-cell would differ by O(0.1)."""
    img = torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(0))
    assert (window_sample(img, grid) - radio_eval_table(img, grid)).abs().max() < 2e-5


def test_radio_training_crops_are_radio_windows_of_the_table():
    """A table whose two channels are each cell's column and row: bilinear sampling of it returns the sampled
    coordinates exactly, so each image's PE shows its crop window, compared with RADIO's draws re-made here."""
    r, (h, w), batch = 16, (5, 7), 64
    pe = _radio(max_grid=r, dim=2, pos_dropout=0.0).train()
    rows, cols = torch.meshgrid(torch.arange(r).float(), torch.arange(r).float(), indexing="ij")
    with torch.no_grad():
        pe.pos_embed.copy_(torch.stack([cols, rows], dim=-1).reshape(1, r * r, 2))
    torch.manual_seed(7)
    got = pe.tokens(torch.zeros(batch, h * w, 2), image_layout(h, w)).reshape(batch, h, w, 2)
    # RADIO's draws in its order: scale, aspect, offset
    torch.manual_seed(7)
    lo = math.sqrt(0.1)
    s = torch.rand(batch, 1, 1) * (1 - lo) + lo
    a = torch.exp(torch.rand(batch, 1, 1) * 2 * math.log(4 / 3) - math.log(4 / 3))
    sides = torch.stack([s * a, s / a], dim=-1).clamp(0, 1)
    offset = torch.rand(batch, 1, 1, 2) * (1 - sides)
    ux = torch.linspace(0, 1, w)
    uy = torch.linspace(0, 1, h)
    want_x = (r - 1) * (ux[None, None, :] * sides[..., 0] + offset[..., 0])  # [B, 1, W]
    want_y = (r - 1) * (uy[None, :, None] * sides[..., 1] + offset[..., 1])  # [B, H, 1]
    assert torch.allclose(got[..., 0], want_x.expand(-1, h, -1), atol=1e-4)
    assert torch.allclose(got[..., 1], want_y.expand(-1, -1, w), atol=1e-4)
    # each window: evenly spaced, inside the table, area >= 0.1 of it, aspect within (4/3)^2
    span_x = (got[:, 0, -1, 0] - got[:, 0, 0, 0]) / (r - 1)
    span_y = (got[:, -1, 0, 1] - got[:, 0, 0, 1]) / (r - 1)
    assert torch.allclose(got[:, :, 1:, 0] - got[:, :, :-1, 0], (span_x * (r - 1) / (w - 1))[:, None, None], atol=1e-4)
    assert got.min() >= -1e-4 and got.max() <= r - 1 + 1e-4
    assert (span_x * span_y).min() >= 0.1 - 1e-4 and (span_x * span_y).max() <= 1 + 1e-4
    ratio = span_x / span_y
    assert ratio.min() >= 9 / 16 - 1e-3 and ratio.max() <= 16 / 9 + 1e-3
    assert len({round(float(v), 3) for v in span_x}) > batch // 2  # one crop per image


def test_radio_pos_dropout_zeroes_whole_images_in_training_only():
    pe = _radio(pos_dropout=0.5).train()
    torch.manual_seed(0)
    out = pe.tokens(torch.zeros(200, 17, 8), image_layout(4, 4, num_prefix=1))[:, 1:]
    zero = (out == 0).flatten(1).all(dim=1)
    assert 0.3 < float(zero.float().mean()) < 0.7
    assert (out[~zero] != 0).flatten(1).all(dim=1).all()  # the others keep their whole PE
    assert (pe.eval().tokens(torch.zeros(3, 17, 8), image_layout(4, 4, num_prefix=1))[:, 1:] != 0).all()


def test_radio_table_grid_reads_the_table_in_training_and_options_are_checked():
    pe = _radio(pos_dropout=0.0).train()
    got = pe.tokens(torch.zeros(3, 256, 8), image_layout(16, 16))
    assert torch.allclose(got, pe.pos_embed.expand(3, -1, -1), atol=1e-5)
    assert _radio(max_grid=None).pos_embed.shape == (1, 16 * 16, 8)  # default: 4 x the reference grid's side
    with pytest.raises(ValueError, match="pos_dropout"):
        _radio(pos_dropout=1.0)
    with pytest.raises(ValueError, match="min_area"):
        _radio(min_area=1.5)
