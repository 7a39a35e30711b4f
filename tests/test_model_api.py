"""timm's model interface on every registered name, each built from its family's tiny config.

What timm's own test_models.py checks, written for our families: forward/backward at a non-square size that is not
a multiple of the patch, forward_features / forward_head(pre_logits), reset_classifier(0), forward_intermediates
(indices, norm, output_fmt) and prune_intermediate_layers, features_only with out_indices and feature_info,
set_input_size, set_grad_checkpointing, and timm's dynamic_img_size / dynamic_img_pad flags (accepted; every model
takes any size).
"""

import copy

import pytest
import timm
import torch
from conftest import one_per_pe

import visionpe
from visionpe.zoo.registry import family_of

ALL_MODELS = visionpe.list_visionpe_models()
ODD_HW = (31, 45)  # non-square, not a multiple of any tiny patch (2, 8) nor of CvT's strides
# fp32 through a few tiny blocks: results that should be equal differ only by reduction order (~1e-6 relative)
ATOL = 1e-5


def _input(fam, hw, batch=2):
    return fam.example_input(hw, batch)


def _call(fn, inp, **kwargs):
    return fn(**inp, **kwargs) if isinstance(inp, dict) else fn(inp, **kwargs)


def _map_fmt(fam) -> str:
    """The channels-first map format of a family's forward_intermediates."""
    return {"vivit": "NCTHW", "mm": "NCTHW"}.get(fam.name, "NCHW")


def _spatial(fam, inp) -> tuple[int, int]:
    x = inp["pixels"] if isinstance(inp, dict) else inp
    return tuple(x.shape[-2:])


@pytest.mark.parametrize("name", one_per_pe(ALL_MODELS))
def test_timm_model_api(name):
    fam = family_of(name)
    torch.manual_seed(0)
    model = timm.create_model(name, **fam.tiny, dynamic_img_size=True, dynamic_img_pad=True)

    x = _input(fam, (fam.test_sizes[0],) * 2)
    pixels = x["pixels"] if isinstance(x, dict) else x
    with torch.no_grad():  # reference features of these weights, for features_only below
        feat_fmt = "NLC" if fam.name in ("vivit", "mm") else "NCHW"  # what features_only returns (feature_cfg)
        want = model.eval().forward_intermediates(pixels, indices=(0, 1), output_fmt=feat_fmt, intermediates_only=True)

    # forward/backward at an odd size; grad checkpointing gives the same loss and gradients
    model.train()
    odd = _input(fam, ODD_HW)
    grads = []
    for ckpt in (False, True):
        model.set_grad_checkpointing(ckpt)
        model.zero_grad()
        torch.manual_seed(1)  # the same drop-path draws in both runs
        out = _call(model, odd)
        assert out.ndim == 2 and torch.isfinite(out).all()
        out.square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    model.set_grad_checkpointing(False)
    assert all(g is not None for g in grads[0]), "every parameter gets a gradient"
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)

    # the forward pieces at the default size
    model.eval()
    with torch.no_grad():
        feats = _call(model.forward_features, x)
        logits = _call(model, x)
        torch.testing.assert_close(model.forward_head(feats), logits, atol=ATOL, rtol=0)
        pre = model.forward_head(feats, pre_logits=True)
        assert pre.shape == (logits.shape[0], model.num_features)

        # forward_intermediates: one map per index, channels/stride from feature_info; the final output is
        # forward_features; norm=True on the last index equals the normed final features
        n = len(model.feature_info)
        fmt = _map_fmt(fam)
        final, inter = _call(model.forward_intermediates, x, indices=n, output_fmt=fmt)
        torch.testing.assert_close(final, feats, atol=ATOL, rtol=0)
        if fam.name in ("vit", "vivit", "mm"):  # timm's DINO-style accessor: the same maps, or tokens
            args = dict(x) if isinstance(x, dict) else dict(pixels=x)
            pixels, others = args.pop("pixels"), args  # the multimodal encoder's text go as keywords
            got = model.get_intermediate_layers(pixels, n=n, reshape=True, **others)
            for a, b in zip(got, inter, strict=True):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
            last = model.get_intermediate_layers(pixels, n=1, norm=True, **others)[0]  # NLC, final-normed
            ref = _call(model.forward_intermediates, x, indices=1, output_fmt="NLC", norm=True, intermediates_only=True)
            torch.testing.assert_close(last, ref[0], atol=0, rtol=0)
        # output_dict: timm's dict form of the same tensors (prefix tokens only when asked for and present)
        d = _call(model.forward_intermediates, x, indices=n, output_fmt=fmt, output_dict=True)
        assert set(d) == {"image_intermediates", "image_features"}
        torch.testing.assert_close(d["image_features"], final, atol=0, rtol=0)
        for a, b in zip(d["image_intermediates"], inter, strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
        if fam.name in ("vit", "vivit", "mm") and model.num_prefix_tokens:
            d = _call(model.forward_intermediates, x, indices=1, output_fmt=fmt, return_prefix_tokens=True,
                      intermediates_only=True, output_dict=True)  # fmt: skip
            assert set(d) == {"image_intermediates", "image_intermediates_prefix"}
            assert d["image_intermediates_prefix"][0].shape[1] == model.num_prefix_tokens
        h, w = _spatial(fam, x)
        assert len(inter) == n
        for y, info in zip(inter, model.feature_info):
            assert y.shape[1] == info["num_chs"]
            assert y.shape[-2:] == (-(-h // info["reduction"]), -(-w // info["reduction"])), (y.shape, info)
        tok_fmt = "NHWC" if fam.name == "swin" else "NLC"
        tokens = _call(model.forward_intermediates, x, indices=[n - 1], output_fmt=tok_fmt, intermediates_only=True)
        tokens = [t.flatten(1, 2) if t.ndim == 4 else t for t in tokens]  # NHWC -> NLC
        maps = inter[-1].flatten(2).transpose(1, 2)
        if fam.name == "mm":  # NLC is the whole sequence; the maps are its visual tokens
            start = model.text_split + 1  # text_split text tokens, then <img>
            tokens = [t[:, start : start + maps.shape[1]] for t in tokens]
        torch.testing.assert_close(tokens[0], maps, atol=ATOL, rtol=0)
        if fam.name in ("vit", "cvt"):  # these return final-normed token sequences from forward_features
            normed = _call(model.forward_intermediates, x, indices=[n - 1], norm=True, intermediates_only=True)[0]
            p = model.num_prefix_tokens if fam.name == "vit" else model.stages[-1].num_prefix
            torch.testing.assert_close(normed.flatten(2).transpose(1, 2), feats[:, p:], atol=ATOL, rtol=0)

        # prune to the first feature: its map is unchanged
        pruned = copy.deepcopy(model)
        assert list(pruned.prune_intermediate_layers([0])) == [0]
        first = _call(pruned.forward_intermediates, x, indices=[0], output_fmt=fmt, intermediates_only=True)
        torch.testing.assert_close(first[0], inter[0], atol=ATOL, rtol=0)

        # reset_classifier(0): the model returns the pre-logits
        model.reset_classifier(0)
        torch.testing.assert_close(_call(model, x), pre, atol=ATOL, rtol=0)

    # features_only with out_indices (dynamic_img_* flags left out): the features of the same weights
    torch.manual_seed(0)
    fnet = timm.create_model(name, **fam.tiny, features_only=True, out_indices=(0, 1)).eval()
    with torch.no_grad():
        fo = fnet(pixels)
    assert fnet.output_fmt.value == feat_fmt
    assert len(fo) == 2 and fnet.feature_info.channels() == [y.shape[1 if feat_fmt == "NCHW" else -1] for y in fo]
    for a, b in zip(fo, want):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)

    # set_input_size: a new reference size, recorded in the cfg; the model runs there
    model.set_input_size(img_size=(48, 40))
    assert tuple(model.pretrained_cfg["input_size"][-2:]) == (48, 40)
    with torch.no_grad():
        out = _call(model, _input(fam, (48, 40)))
    assert out.ndim == 2 and torch.isfinite(out).all()
