"""timm's whole-model contract (what timm 1.0.31's tests/test_models.py holds every timm model to), on our names.

Factory kwargs and meta construction, init after to_empty, buffers that rebuild, pruning that leaves every parameter
used, heads that keep their device / dtype / mode, frozen tables that stay frozen, FX and TorchScript. Video and
multimodal models go through their family's example input. docs/using_with_timm.md lists what timm's own file
checks that these tests leave out.
"""

import copy

import pytest
import timm
import torch
from conftest import one_per_pe
from timm.models._manipulate import reinit_non_persistent_buffers

import visionpe
from visionpe.zoo.registry import family_of

ALL_MODELS = visionpe.list_visionpe_models()
NANO = [n for n in ALL_MODELS if n.split("_")[1] == "n"]  # every PE of every family, once


def _input(fam, size=32, batch=2, device=None):
    x = fam.example_input(size, batch)
    if device is not None:
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
    return x


def _call(fn, x, **kwargs):
    return fn(**x, **kwargs) if isinstance(x, dict) else fn(x, **kwargs)


def _pixels(x):
    return x["pixels"] if isinstance(x, dict) else x


def _poison(tensors):
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point():
                t.fill_(float("nan"))


@pytest.mark.parametrize("name", one_per_pe(ALL_MODELS))
def test_meta_build_to_empty_init_and_reload(name):
    """Built on meta in float64 through timm's factory kwargs; after to_empty, init_weights leaves nothing
    uninitialised, and load_state_dict + reinit_non_persistent_buffers reproduces the normal model exactly."""
    fam = family_of(name)
    meta = timm.create_model(name, device="meta", dtype=torch.float64, **fam.tiny)
    assert all(t.device.type == "meta" for t in [*meta.parameters(), *meta.buffers()])
    assert all(p.dtype == torch.float64 for p in meta.parameters())

    model = meta.to_empty(device="cpu").eval()
    _poison([*model.parameters(), *model.buffers()])
    model.init_weights()
    bad = [k for k, t in [*model.named_parameters(), *model.named_buffers()] if not torch.isfinite(t).all()]
    assert not bad, f"init_weights left {bad[:4]} uninitialised"
    x = _input(fam, batch=1)
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()} if isinstance(x, dict) else x.double()
    with torch.no_grad():
        assert torch.isfinite(_call(model, x64)).all()

    ref = timm.create_model(name, **fam.tiny).eval()
    with torch.device("meta"):
        reloaded = timm.create_model(name, **fam.tiny)
    reloaded = reloaded.to_empty(device="cpu").eval()
    _poison(reloaded.buffers())
    reloaded.load_state_dict(ref.state_dict())
    reinit_non_persistent_buffers(reloaded)
    with torch.no_grad():
        torch.testing.assert_close(_call(reloaded, x), _call(ref, x), rtol=0, atol=0)


def test_dtype_and_device_build_directly():
    model = timm.create_model("vit_n_ape", dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(torch.randn(1, 3, 32, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="floating-point"):
        timm.create_model("vit_n_ape", dtype=torch.int64)
    with pytest.raises(TypeError):
        timm.create_model("vit_n_ape", device="meta", not_a_model_arg=1)


@pytest.mark.parametrize("name", NANO)
def test_forward_on_meta(name):
    """timm's cfg test runs forward on meta tensors (no data: no host reads, no autocast on 'meta')."""
    fam = family_of(name)
    with torch.device("meta"):
        model = timm.create_model(name, **fam.tiny).eval()
        out = _call(model, _input(fam, batch=1, device="meta"))
    assert out.device.type == "meta" and out.shape[0] == 1


@pytest.mark.parametrize("name", NANO)
def test_pruning_and_features_only_leave_no_unused_parameter(name):
    """Per-layer PE state of removed blocks goes with them (DDP with find_unused_parameters=False)."""
    fam = family_of(name)
    model = timm.create_model(name, **fam.tiny)
    x = _input(fam)
    last = len(model.feature_info) - 1
    for indices, prune_norm in (([0], False), ([last], False), (list(range(last + 1)), True)):
        pruned = copy.deepcopy(model).train()
        take = pruned.prune_intermediate_layers(indices, prune_norm=prune_norm)
        feats = _call(pruned.forward_intermediates, x, indices=take, norm=not prune_norm, intermediates_only=True)
        sum(f.sum() for f in feats).backward()
        unused = [k for k, p in pruned.named_parameters() if p.grad is None]
        assert not unused, f"pruned to {indices}: {unused}"
    feat = timm.create_model(name, **fam.tiny, features_only=True, out_indices=(0,))
    sum(f.sum() for f in feat(_pixels(x))).backward()
    assert not [k for k, p in feat.named_parameters() if p.grad is None]


@pytest.mark.parametrize("name", ["vit_n_ape", "swin_n_rpb", "cvt_n", "vivit_n_ape", "mm_n_mrope"])
def test_reset_classifier_keeps_place_and_width(name):
    fam = family_of(name)
    model = timm.create_model(name, **fam.tiny).to(torch.float64).eval()
    model.reset_classifier(0)
    model.reset_classifier(3)
    head = model.get_classifier()
    assert {p.dtype for p in head.parameters()} == {torch.float64} and not head.training
    with torch.device("meta"):
        on_meta = timm.create_model(name, **fam.tiny)
    on_meta.reset_classifier(3)
    assert {p.device.type for p in on_meta.get_classifier().parameters()} == {"meta"}

    with pytest.raises(ValueError, match="global_pool"):  # refused as the constructor refuses it ...
        model.reset_classifier(3, "catavgmax")
    with pytest.raises(AssertionError):  # ... and as timm's models do
        model.reset_classifier(3, "catavgmax")
    with pytest.raises(ValueError, match="global_pool"):
        timm.create_model(name, **fam.tiny, global_pool="catavgmax")

    x = _input(fam, batch=2)
    x = {k: v.double() if v.is_floating_point() else v for k, v in x.items()} if isinstance(x, dict) else x.double()
    index = len(model.feature_info) - 2
    model.prune_intermediate_layers([index], prune_norm=True)
    model.reset_classifier(7, "avg")
    with torch.no_grad():
        pre = model.forward_head(_call(model.forward_features, x), pre_logits=True)
        assert (
            pre.shape == (2, model.head_hidden_size) and model.head_hidden_size == model.feature_info[index]["num_chs"]
        )
        assert _call(model, x).shape == (2, 7)


@pytest.mark.parametrize("name", ["vit_n_ape", "vit_n_rope2d_ape", "vit_n_fuzzy_atm", "vivit_n_ape", "swin_n_rpb"])
def test_frozen_tables_stay_frozen_through_set_input_size(name):
    fam = family_of(name)
    model = timm.create_model(name, **fam.tiny).requires_grad_(False)
    model.reset_classifier(0)
    model.set_input_size(img_size=(64, 48))
    if name.startswith("swin"):
        model.set_input_size(window_size=2)
    assert not [n for n, p in model.named_parameters() if p.requires_grad]


def test_swin_timm_attributes():
    model = timm.create_model("swin_n_rpb", strict_img_size=True)  # a no-op, as dynamic_img_size
    assert model.output_fmt == "NHWC"
    feats = model.forward_features(torch.randn(1, 3, 32, 32))
    assert tuple(feats.shape[1:3]) == model.pretrained_cfg["pool_size"]
    assert timm.create_model("swin_t_rpb", pretrained=False, device="meta").pretrained_cfg["pool_size"] == (7, 7)
    for name in ("vit_n_ape", "cvt_n", "vivit_n_ape"):
        timm.create_model(name, strict_img_size=True)


FX_UNSUPPORTED = (
    "irpe",
    "liere",
    "comrope",
    "fuzzy_atm",
    "alibi2d",
    "fire2d",
    "lookhere",
)  # per-size lookups (see visionpe.fx)
FX_VIT = [n for n in NANO if n.startswith("vit_") and not any(u in n for u in FX_UNSUPPORTED)]


@pytest.mark.parametrize("name", FX_VIT)
def test_fx_trace_vit(name):
    """symbolic_trace and features_only(feature_cls='fx') at the reference size, equal to eager."""
    fam = family_of(name)
    model = timm.create_model(name, **fam.tiny).eval()
    x = torch.randn(2, 3, 32, 32)
    graph = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), model(x), rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)
    fx_feat = timm.create_model(name, **fam.tiny, features_only=True, feature_cls="fx", out_indices=(0, 1)).eval()
    torch.manual_seed(0)
    getter = timm.create_model(name, **fam.tiny, features_only=True, out_indices=(0, 1)).eval()
    with torch.no_grad():
        want = getter.model.forward_intermediates(x, indices=[0, 1], output_fmt="NLC", intermediates_only=True)
        got = fx_feat(x)
    # the graph's taps are the block modules' outputs, prefix tokens first; with CPE, forward_intermediates taps
    # after the PE's block site (x + DWConv(x)), which runs outside the block module
    for g, w in zip(got, want, strict=True):
        assert g.shape[-1] == w.shape[-1]
        if "cpe" not in name:
            torch.testing.assert_close(g[:, -w.shape[1] :], w, rtol=1e-5, atol=1e-5)
    graph.train()(x).sum().backward()  # the traced graph trains too


@pytest.mark.parametrize(
    "name", ["vit_n_irpe", "vit_n_fuzzy_atm", "vit_n_comrope_ap", "swin_n_rpb", "cvt_n", "vivit_n_ape", "mm_n_vrope"]
)
def test_fx_unsupported_names_the_alternatives(name):
    model = timm.create_model(name, **family_of(name).tiny)
    with pytest.raises(RuntimeError, match="torch.export.*forward_intermediates"):
        torch.fx.symbolic_trace(model)


@pytest.mark.parametrize("name", ["vit_n_rope2d", "swin_n_rpb", "cvt_n", "vivit_n_ape", "mm_n_mrope"])
def test_torchscript_error_names_compile_and_export(name):
    model = timm.create_model(name, **family_of(name).tiny)
    with pytest.raises(RuntimeError, match="torch.compile.*torch.export") as err:
        torch.jit.script(model)
    assert "\n" not in str(err.value)
