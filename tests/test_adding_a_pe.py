"""The worked example of docs/adding_a_pe.md, kept as a test: a Gaussian locality logits-site bias added as one PE
class plus a preset, with no backbone change, runs on ViT, Swin and CvT."""

from __future__ import annotations

import math

import pytest
import timm
import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.tokens import TokenLayout, cell_centre_layout, image_layout, window_layout
from visionpe.pos.base import AttnSpec, LayerParams, PEHost, PosContext, PosEncoding
from visionpe.pos.presets import PE_KINDS, PE_PRESETS, PRESET_PAPERS, register_pe_kind, register_pe_preset
from visionpe.zoo.registry import family_of


# ---- the file docs/adding_a_pe.md adds as visionpe/pos/gaussbias.py (same code) --------------------------------------
class GaussBias(PosEncoding):
    """logit_ij -= ||p_i - p_j||^2 / (2 sigma_h^2) over the layout's (x, y) positions, a Gaussian locality prior;
    head h has width sigma_h = width * 2^h; pairs with a prefix token get no bias."""

    def __init__(self, host: PEHost, width: float = 1.0):
        super().__init__(host)
        self.width = float(width)

    def inverse_variances(self, heads: int) -> torch.Tensor:
        """1 / (2 sigma_h^2) per head."""
        return 0.5 / (self.width * 2.0 ** torch.arange(heads)) ** 2

    def context(self, i: int, layout: TokenLayout, kv_layout: TokenLayout | None = None, own=None) -> PosContext:
        kv = layout if kv_layout is None else kv_layout
        heads = self.host.layers[i].num_heads

        def bias(q, k):
            dist2 = torch.cdist(layout.pos, kv.pos).square()  # [N, M]
            out = q.new_zeros(heads, layout.num_tokens, kv.num_tokens)
            scale = self.inverse_variances(heads).to(q)[:, None, None]
            out[:, layout.num_prefix :, kv.num_prefix :] = -scale * dist2.to(q)
            return out[None]  # [1, H, P + N, Pk + M]

        return PosContext(bias=bias)


def _register() -> None:  # the preset line (in pos/presets.py: PE_KINDS["gaussbias"] = GaussBias; PE_PRESETS[...])
    if "gaussbias" not in PE_KINDS:
        register_pe_kind("gaussbias", GaussBias)
        register_pe_preset("gaussbias", [("gaussbias", {})])


# ---------------------------------------------------------------------------------------------------------- tests


def _expected(layout: TokenLayout, kv: TokenLayout, heads: int) -> torch.Tensor:
    """The definition, written out pair by pair (independent of cdist / broadcasting)."""
    out = torch.zeros(heads, layout.num_tokens, kv.num_tokens, dtype=torch.float64)
    for h in range(heads):
        sigma = 2.0**h
        for i in range(layout.num_pos):
            for j in range(kv.num_pos):
                d2 = ((layout.pos[i] - kv.pos[j]).double() ** 2).sum()
                out[h, layout.num_prefix + i, kv.num_prefix + j] = -d2 / (2 * sigma**2)
    return out


def test_gaussbias_bias_matches_its_definition_on_image_window_and_strided_layouts():
    host = PEHost(dim=16, grid=(3, 4), num_prefix=1, layers=(AttnSpec(16, 4, 4),))
    pe = GaussBias(host)
    q = torch.zeros(1, 4, 1, 4)
    cases = [
        (image_layout(3, 4, 1), None),  # ViT: CLS + 3 x 4 patches
        (window_layout(4, 4), None),  # Swin: one 4 x 4 window, window-local coordinates
        (image_layout(4, 6, 1), cell_centre_layout(2, 3, 2, 1)),  # CvT: stride-2 keys at cell centres
    ]
    for layout, kv in cases:
        got = pe.context(0, layout, kv).bias(q, q)
        want = _expected(layout, kv or layout, 4)
        # float32 cdist of coordinates <= 6, squared, one multiply: a few ulp of |bias| <= 0.5 * 53
        torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)
    # head 1 has sigma 2: the diagonal neighbour, 2 squared units away, gets -2 / 8 (exact in float64)
    assert _expected(window_layout(2, 2), window_layout(2, 2), 2)[1, 0, 3] == -0.25


def test_gaussbias_appears_on_vit_swin_and_cvt_without_a_backbone_change():
    _register()
    try:
        _run_on_three_families()
    finally:  # leave the global tables as other tests expect them
        PE_KINDS.pop("gaussbias"), PE_PRESETS.pop("gaussbias")


def _run_on_three_families() -> None:
    assert PE_PRESETS["gaussbias"] == [("gaussbias", {})] and "gaussbias" not in PRESET_PAPERS
    for name in ("vit_n_nope", "swin_n_nope", "cvt_n_rope2d"):
        fam = family_of(name)
        torch.manual_seed(0)
        plain = timm.create_model(name, **{**fam.tiny, "pe": "nope"}).eval()
        torch.manual_seed(0)
        model = timm.create_model(name, **{**fam.tiny, "pe": "gaussbias"}).eval()
        assert model.state_dict().keys() == plain.state_dict().keys()  # a parameter-free PE adds no keys
        model.load_state_dict(plain.state_dict())
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            assert model(torch.randn(2, 3, 44, 44)).shape == (2, 10)  # another size runs too
            y, y0 = model.forward_features(x), plain.forward_features(x)
            # the bias reaches attention: the same weights give other features (a fresh model's attention branch is
            # small, ~1e-3 of the O(1) normalised features), well above the 1e-5 fp32 floor checked just below ...
            assert (y - y0).abs().max() > 1e-4
            # ... and with every width infinite (1 / inf^2 = 0) the model is the plain one again
            model.pe.encodings["gaussbias"].width = float("inf")
            # bias exactly 0 (-0 * d): only the kernel path may differ, fp32 rounding of softmax over <= 65 keys
            torch.testing.assert_close(model.forward_features(x), y0, rtol=1e-5, atol=1e-5)


# ---- a PE with parameters owns them end to end: docs/adding_a_pe.md section 2 ---------------------------------------
class LearnedGaussBias(GaussBias):
    """GaussBias with a learned log-width per layer and head (layer i's `log_width` [heads], flat name
    `log_widths.{i}`); a published ViT layout (invented for the example) stores the widths as
    `blocks.{i}.attn.gauss_width`."""

    checkpoint_keys = {"vit": r"^blocks\.\d+\.attn\.gauss_width$"}
    layer_names = {r"log_widths\.(?P<i>\d+)": "log_width"}  # flat name -> the name in layer i's module

    def layer(self, i: int) -> LayerParams:
        heads = self.host.layers[i].num_heads
        return LayerParams(lambda: {"log_width": torch.zeros(heads)})  # the backbone keeps it in blocks[i].attn.pos

    def context(self, i, layout, kv_layout=None, own=None):
        ctx = super().context(i, layout, kv_layout)
        scale = torch.exp(-2 * own.log_width)[None, :, None, None]  # 1 / w^2: the learned widths of the heads
        return PosContext(bias=lambda q, k: ctx.bias(q, k) * scale.to(q))

    def convert_checkpoint(self, entries, source):
        return {f"log_widths.{key.split('.')[1]}": v.log() for key, v in entries.items()}


def test_a_pe_converts_its_checkpoint_entries_and_names_its_layers_without_a_backbone_change():
    from timm.optim import create_optimizer_v2

    from visionpe.pos import CheckpointMismatch
    from visionpe.zoo.vit_weights import checkpoint_filter_fn

    register_pe_kind("learnedgauss", LearnedGaussBias)
    register_pe_preset("learnedgauss", [("learnedgauss", {})])
    try:
        model = timm.create_model("vit_n_nope", **{**family_of("vit_n_nope").tiny, "pe": "learnedgauss"})
        # layer decay: layer i's widths live in block i (`blocks.{i}.attn.pos.<kind>`), so timm's block rules group them
        opt = create_optimizer_v2(model, "adamw", lr=1.0, layer_decay=0.5)
        scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
        params = dict(model.named_parameters())
        for i in range(2):
            own = scale[id(params[f"blocks.{i}.norm1.weight"])]
            assert scale[id(params[f"blocks.{i}.attn.pos.learnedgauss.log_width"])] == own
        assert scale[id(params["blocks.0.norm1.weight"])] < scale[id(params["blocks.1.norm1.weight"])]
        # a published checkpoint: the backbone's own keys plus the PE's, which only the PE knows how to read
        published = {k: v for k, v in model.state_dict().items() if not k.startswith("pe.") and ".pos." not in k}
        published |= {f"blocks.{i}.attn.gauss_width": torch.full((2,), 2.0**i) for i in range(2)}
        converted = checkpoint_filter_fn(published, model)
        model.load_state_dict(converted)
        for i in range(2):  # log of the published widths 2^i: i log 2, to float32's ~1e-7
            want = torch.full((2,), i * math.log(2.0))
            got = model.blocks[i].attn.pos["learnedgauss"].log_width.data
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        # the same checkpoint into a model without this PE: the PE kind's message, not a generic key error
        with pytest.raises(CheckpointMismatch, match="LearnedGaussBias"):
            checkpoint_filter_fn(published, timm.create_model("vit_n_nope", **family_of("vit_n_nope").tiny))
    finally:
        PE_KINDS.pop("learnedgauss"), PE_PRESETS.pop("learnedgauss")
