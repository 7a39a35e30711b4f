"""The worked example of docs/adding_a_pe.md, kept as a test: a 2D ALiBi-style logits-site bias added as one PE
class plus a preset, with no backbone change, runs on ViT, Swin and CvT."""

from __future__ import annotations

import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout import TokenLayout, cell_centre_layout, image_layout, window_layout
from visionpe.pos.base import AttnSpec, PEHost, PosContext, PosEncoding
from visionpe.pos.presets import PE_KINDS, PE_PRESETS, PRESET_PAPERS, Paper, register_pe_kind, register_pe_preset
from visionpe.zoo import family_of


# ---- the file docs/adding_a_pe.md adds as visionpe/pos/alibi2d.py (same code) --------------------------------------
class ALiBi2D(PosEncoding):
    """logit_ij -= slope_h * ||p_i - p_j||_2 over the layout's (x, y) positions; head h of H has slope
    2^(-8 (h + 1) / H) (ALiBi's geometric slopes); pairs with a prefix token get no bias."""

    def __init__(self, host: PEHost, max_slope_exp: float = 8.0):
        super().__init__(host)
        self.max_slope_exp = float(max_slope_exp)

    def slopes(self, heads: int) -> torch.Tensor:
        return 2.0 ** (-self.max_slope_exp * torch.arange(1, heads + 1) / heads)

    def context(self, i: int, layout: TokenLayout, kv_layout: TokenLayout | None = None) -> PosContext:
        kv = layout if kv_layout is None else kv_layout
        heads = self.host.layers[i].num_heads

        def bias(q, k):
            dist = torch.cdist(layout.pos, kv.pos)  # [N, M]
            out = q.new_zeros(heads, layout.num_tokens, kv.num_tokens)
            out[:, layout.num_prefix :, kv.num_prefix :] = -self.slopes(heads).to(q)[:, None, None] * dist.to(q)
            return out[None]  # [1, H, P + N, Pk + M]

        return PosContext(bias=bias)


def _register() -> None:  # the preset line (in pos/presets.py: PE_KINDS["alibi2d"] = ALiBi2D; PE_PRESETS[...])
    if "alibi2d" not in PE_KINDS:
        register_pe_kind("alibi2d", ALiBi2D)
        register_pe_preset("alibi2d", [("alibi2d", {})], paper=Paper("2108.12409", "Train Short, Test Long (ALiBi)"))


# ---------------------------------------------------------------------------------------------------------- tests


def _expected(layout: TokenLayout, kv: TokenLayout, heads: int) -> torch.Tensor:
    """The definition, written out pair by pair (independent of cdist / broadcasting)."""
    out = torch.zeros(heads, layout.num_tokens, kv.num_tokens, dtype=torch.float64)
    for h in range(heads):
        slope = 2.0 ** (-8.0 * (h + 1) / heads)
        for i in range(layout.num_pos):
            for j in range(kv.num_pos):
                d = ((layout.pos[i] - kv.pos[j]).double() ** 2).sum().sqrt()
                out[h, layout.num_prefix + i, kv.num_prefix + j] = -slope * d
    return out


def test_alibi2d_bias_matches_its_definition_on_image_window_and_strided_layouts():
    host = PEHost(dim=16, grid=(3, 4), num_prefix=1, layers=(AttnSpec(16, 4, 4),))
    pe = ALiBi2D(host)
    q = torch.zeros(1, 4, 1, 4)
    cases = [
        (image_layout(3, 4, 1), None),  # ViT: CLS + 3 x 4 patches
        (window_layout(4, 4), None),  # Swin: one 4 x 4 window, window-local coordinates
        (image_layout(4, 6, 1), cell_centre_layout(2, 3, 2, 1)),  # CvT: stride-2 keys at cell centres
    ]
    for layout, kv in cases:
        got = pe.context(0, layout, kv).bias(q, q)
        want = _expected(layout, kv or layout, 4)
        # float32 cdist of coordinates <= 6 and one multiply: a few ulp of |bias| <= 0.5 * 7.3
        torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)
    # head 0 of 2 has slope 2^-4; the diagonal neighbour is sqrt(2) away (float64 reference: ~1e-17 rounding)
    assert abs(_expected(window_layout(2, 2), window_layout(2, 2), 2)[0, 0, 3] + 2**0.5 / 16) < 1e-12


def test_alibi2d_appears_on_vit_swin_and_cvt_without_a_backbone_change():
    _register()
    try:
        _run_on_three_families()
    finally:  # leave the global tables as other tests expect them
        PE_KINDS.pop("alibi2d"), PE_PRESETS.pop("alibi2d"), PRESET_PAPERS.pop("alibi2d")


def _run_on_three_families() -> None:
    assert PE_PRESETS["alibi2d"] == [("alibi2d", {})] and PRESET_PAPERS["alibi2d"].arxiv == "2108.12409"
    for name in ("vit_n_nope", "swin_n_nope", "cvt_n_rope2d"):
        fam = family_of(name)
        torch.manual_seed(0)
        plain = timm.create_model(name, **{**fam.tiny, "pe": "nope"}).eval()
        torch.manual_seed(0)
        model = timm.create_model(name, **{**fam.tiny, "pe": "alibi2d"}).eval()
        assert model.state_dict().keys() == plain.state_dict().keys()  # a parameter-free PE adds no keys
        model.load_state_dict(plain.state_dict())
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            assert model(torch.randn(2, 3, 44, 44)).shape == (2, 10)  # another size runs too
            y, y0 = model.forward_features(x), plain.forward_features(x)
            # the bias reaches attention: the same weights give other features (a fresh model's attention branch is
            # small, ~1e-3 of the O(1) normalised features), well above the 1e-5 fp32 floor checked just below ...
            assert (y - y0).abs().max() > 1e-4
            # ... and with every slope at zero (2^-inf) the model is the plain one again
            model.pe.encodings["alibi2d"].max_slope_exp = float("inf")
            # bias exactly 0 (-0 * d): only the kernel path may differ, fp32 rounding of softmax over <= 65 keys
            torch.testing.assert_close(model.forward_features(x), y0, rtol=1e-5, atol=1e-5)
