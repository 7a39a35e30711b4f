import pytest
import timm
import torch
from conftest import one_per_pe

import visionpe
from visionpe.zoo.registry import family_of
from visionpe.zoo.vit_family import VIT_PES, VIT_SIZES

ALL_MODELS = visionpe.list_visionpe_models()


def test_vit_grid_is_generated_from_the_tables():
    expected = {f"vit_{s}_{pe}" for s in VIT_SIZES for pe in VIT_PES}
    assert expected <= set(ALL_MODELS)
    base = ["ape", "sincos", "nope", "rope2d", "rope2d_mixed", "rope2d_ape", "rope2d_mixed_ape"]
    assert {f"vit_{s}_{pe}" for s in "ntsbl" for pe in base} <= set(ALL_MODELS)


def test_timm_lists_and_creates_our_models():
    listed = timm.list_models("vit_*_rope2d*")
    assert "vit_b_rope2d" in listed and "vit_s_rope2d_mixed_ape" in listed
    # RoPE-ViT's four, DINOv3's and its _aug, p-RoPE's, Spiral RoPE's two; 5 sizes
    assert len([n for n in listed if n in ALL_MODELS]) == 9 * 5
    m = timm.create_model("vit_b_rope2d")
    assert m.embed_dim == 768 and len(m.blocks) == 12 and m.patch_embed.patch_size == (16, 16)


def test_video_and_multimodal_families_list_the_2026_multimodal_ropes():
    # MRoPE-I and MHRoPE (Huang et al.) on both families, 4 sizes each; the interleaved M-RoPE without reset stays
    new = [n for n in timm.list_models("*_mrope_i") + timm.list_models("*_mhrope") if n in ALL_MODELS]
    assert len(new) == 2 * 2 * 4 and {n.split("_")[0] for n in new} == {"vivit", "mm"}
    assert "mm_b_mrope_interleaved" in ALL_MODELS and "vivit_n_mrope_interleaved" in ALL_MODELS


@pytest.mark.parametrize("name", ALL_MODELS)
def test_pretrained_cfg_lets_timm_data_helpers_work(name):
    cfg = timm.models.get_pretrained_cfg(name)
    assert cfg.fixed_input_size is False and cfg.paper_ids and len(cfg.input_size) >= 3
    data_cfg = timm.data.resolve_data_config({}, pretrained_cfg=cfg.to_dict())
    assert data_cfg["mean"] and data_cfg["crop_pct"] > 0


def _example(fam, size, batch=2):
    return fam.example_input(size, batch)


def _run(model, inp):
    return model(**inp) if isinstance(inp, dict) else model(inp)


@pytest.mark.parametrize("name", one_per_pe(ALL_MODELS))
def test_every_model_runs_forward_and_backward_at_two_resolutions(name):
    fam = family_of(name)
    model = timm.create_model(name, **fam.tiny).train()
    for size in fam.test_sizes:
        model.zero_grad()
        out = _run(model, _example(fam, size))
        assert out.ndim == 2 and torch.isfinite(out).all()
        out.square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), "every parameter gets a gradient"


def test_each_family_reads_its_paper_and_evaluation_size_from_the_tables():
    from visionpe.papers import PAPERS, family_paper
    from visionpe.zoo.family import FAMILIES

    assert sorted(p.family for p in PAPERS.values() if p.family) == sorted(FAMILIES)  # one backbone row per family
    for fam in FAMILIES.values():
        row = family_paper(fam.name)
        assert fam.cfg["paper_ids"] == f"arXiv:{row.arxiv}"
        assert fam.cfg["paper_name"] == (row.family_name or row.title)
        assert fam.cfg.get("origin_url", "") == row.code  # the family's official code, where the row has one
        for size, kwargs in fam.sizes.items():  # a size with an img_size is evaluated there, uncropped
            cfg = {**fam.cfg, **fam.size_cfg.get(size, {})}
            side = kwargs.get("img_size", 224)
            assert cfg["input_size"] == (3, side, side)
            assert cfg["crop_pct"] == (1.0 if "img_size" in kwargs else fam.cfg["crop_pct"])
    assert timm.models.get_pretrained_cfg("cvt_n").input_size == (3, 32, 32)
    assert timm.models.get_pretrained_cfg("swin_t_rpb").origin_url == "https://github.com/microsoft/Swin-Transformer"
    assert timm.models.get_pretrained_cfg("vit_s_nope").paper_name == "Training data-efficient image transformers"
    with pytest.raises(KeyError, match="names the family 'nofam'"):
        family_paper("nofam")
