"""Patch size as a resolution axis: every family's `set_input_size(patch_size=)` (FlexiViT's PI-resize).

Tolerances: a token sums P*P*C (here <= 16*16*3) products of O(1) pixels with O(0.1) weights, so float32 rounding
leaves ~1e-6 on it; the resized kernel itself carries the fp32 pseudo-inverse's error (~1e-6 relative), which is
why the invariance checks allow 1e-5 absolute on O(0.1) logits and 1e-4 on O(1) tokens.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import resample_patch_embed

import visionpe  # noqa: F401  (registers the models)
from visionpe.layers.patch_resize import resize_kernel
from visionpe.zoo.cvt_family import CVT
from visionpe.zoo.multimodal_family import MM
from visionpe.zoo.swin_family import SWIN
from visionpe.zoo.video_family import VIDEO
from visionpe.zoo.vit_family import VIT

TINY = {"vit": VIT.tiny, "swin": SWIN.tiny, "vivit": VIDEO.tiny, "mm": MM.tiny}
# (model, the patch it is built with, another one): learned tables (APE, space-time APE, Swin's bias) and RoPEs
CASES = [
    ("vit_n_ape", 8, 4),
    ("vit_n_rope2d_mixed_ape", 8, 16),
    ("swin_n_rpb", 2, 4),
    ("vivit_n_ape", 8, 4),
    ("vivit_n_rope3d", 8, 16),
    ("mm_n_mrope", 8, 4),
]


def _model(name: str, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **{**TINY[name.split("_")[0]], **kw}).eval()


def _inputs(name: str, size: int = 32):
    torch.manual_seed(1)
    family = name.split("_")[0]
    if family == "vivit":
        return (torch.randn(2, 3, 4, size, size),)
    if family == "mm":
        return torch.randn(2, 3, size, size), torch.randint(0, 32, (2, 5))
    return (torch.randn(2, 3, size, size),)


def _upsample_patches(x: torch.Tensor, p: int, q: int) -> torch.Tensor:
    """Images [..., H, W] of p x p patches -> each patch resized on its own to q x q (bicubic, antialiased: the
    resize B that timm's PI-resize inverts), the patches kept in place."""
    *lead, h, w = x.shape
    cells = x.reshape(-1, h // p, p, w // p, p).permute(0, 1, 3, 2, 4).reshape(-1, 1, p, p)
    cells = F.interpolate(cells, size=(q, q), mode="bicubic", antialias=True, align_corners=False)
    cells = cells.reshape(-1, h // p, w // p, q, q).permute(0, 1, 3, 2, 4)
    return cells.reshape(*lead, h // p * q, w // p * q)


@pytest.mark.parametrize("name, p, q", CASES)
def test_the_resized_model_is_the_model_built_at_that_patch_size(name, p, q):
    """set_input_size(patch_size=q) gives exactly the parameters (kernel, resampled tables) of a model built with
    patch q: its state dict loads strictly into one, and both give the same logits."""
    model = _model(name)
    model.set_input_size(patch_size=q)
    built = _model(name, patch_size=q)
    built.load_state_dict(model.state_dict())  # strict: every table has the new grid's shape
    x = _inputs(name)
    assert torch.equal(model(*x), built(*x))
    assert model.patch_embed.patch_size == (q, q)
    assert model.feature_info[-1]["reduction"] == built.feature_info[-1]["reduction"]


@pytest.mark.parametrize("name, p, q", CASES)
def test_the_kernel_is_timms_resample_patch_embed(name, p, q):
    model = _model(name)
    weight = model.patch_embed.proj.weight.detach().clone()
    model.set_input_size(patch_size=q)
    new = model.patch_embed.proj.weight.detach()
    if weight.ndim == 5:  # a tubelet: each of its frames resized as a 2D kernel
        ref = torch.stack([resample_patch_embed(weight[:, :, t], [q, q]) for t in range(weight.shape[2])], 2)
    else:
        ref = resample_patch_embed(weight, [q, q])
    assert (new - ref).abs().max() <= 1e-6 * ref.abs().max()
    assert new.shape[-2:] == (q, q) and model.patch_embed.proj.bias is not None


@pytest.mark.parametrize("name", ["vit_n_ape", "vivit_n_ape", "mm_n_mrope"])
def test_an_image_upsampled_patch_by_patch_gives_the_same_logits(name):
    """FlexiViT's invariance: B x through the PI-resized kernel = x through the original (B: p -> 2p, full column
    rank), and the token grid is the same, so the PEs see the same positions: the logits agree."""
    model = _model(name)
    x = _inputs(name)
    ref = model(*x)
    model.set_input_size(img_size=64, patch_size=16)
    up = (_upsample_patches(x[0], 8, 16), *x[1:])
    assert (model(*up) - ref).abs().max() < 1e-5


def test_downsizing_is_the_least_squares_kernel():
    """p' < p: w' minimises |B^T w' - w| (B: 8 -> 4 px), i.e. <B x, w'> is as close to <x, w> as any kernel makes
    it over white x; a perturbation of w' in any direction grows the residual."""
    torch.manual_seed(0)
    w = torch.randn(4, 3, 8, 8)
    v = resize_kernel(w, (4, 4))
    eye = torch.eye(64).reshape(64, 1, 8, 8)
    down = F.interpolate(eye, size=(4, 4), mode="bicubic", antialias=True, align_corners=False).reshape(64, 16)

    def residual(k):
        return (k.reshape(4, 3, 16) @ down.T - w.reshape(4, 3, 64)).norm()

    assert all(residual(v + 1e-2 * torch.randn_like(v)) > residual(v) for _ in range(5))


def test_a_tubelet_keeps_its_length_and_runs_at_the_new_patch():
    model = _model("vivit_n_rope3d")
    model.set_input_size(patch_size=4)
    assert model.patch_embed.proj.weight.shape[2:] == (2, 4, 4) and model.patch_embed.grid_size == (2, 8, 8)
    assert model(torch.randn(1, 3, 6, 20, 24)).shape == (1, 400)


@pytest.mark.parametrize("bad", [0, -4, 2.5, "8", True, (4, 8)])
def test_a_bad_patch_size_is_a_clear_error(bad):
    for name in ("vivit_n_rope3d", "mm_n_mrope"):
        with pytest.raises(ValueError, match="patch_size must be a positive integer"):
            _model(name).set_input_size(patch_size=bad)


# --------------------------------------------------------------------------------------------------------- CvT


def _cvt(**kw):
    torch.manual_seed(0)
    return timm.create_model("cvt_n_rope2d", **{**CVT.tiny, **kw}).eval()


def test_cvt_scales_its_first_embedding_with_the_stride():
    """CvT's stem is an overlapping conv (nano: kernel 3, stride 2, padding 1): patch_size 4 scales all three by
    2 (kernel 6, padding 2), the kernel PI-resized; a model built with that stem loads the result strictly."""
    model = _cvt()
    w = model.stages[0].patch_embed.proj.weight.detach().clone()
    model.set_input_size(patch_size=4)
    embed = model.stages[0].patch_embed
    assert (embed.kernel, embed.stride, embed.padding) == (6, 4, 2)
    assert (embed.proj.weight - resample_patch_embed(w, [6, 6])).abs().max() <= 1e-6 * w.abs().max()
    built = _cvt(patch_size=(6, 3, 3), patch_stride=(4, 2, 2), patch_padding=(2, 1, 1))
    built.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    assert torch.equal(model(x), built(x))
    assert [f["reduction"] for f in model.feature_info] == [4, 8, 16]


def test_cvt_windows_of_the_upscaled_image_are_the_upscaled_windows():
    """The geometry: with stride, kernel and padding scaled by r = 2, output token (i, j) of the image upscaled by
    r (nearest) reads exactly the upscaled window of token (i, j): a kernel upscaled the same way (/ r^2) gives the
    original conv's output to float32 rounding."""
    model = _cvt()
    embed = model.stages[0].patch_embed
    x = torch.randn(2, 3, 32, 32)
    ref = embed.proj(x)
    w, b = embed.proj.weight.detach(), embed.proj.bias.detach()
    model.set_input_size(patch_size=4)
    new = model.stages[0].patch_embed.proj
    up = F.interpolate(x, scale_factor=2, mode="nearest")
    out = F.conv2d(up, w.repeat_interleave(2, -1).repeat_interleave(2, -2) / 4, b, new.stride, new.padding)
    assert out.shape == ref.shape and (out - ref).abs().max() < 1e-5


def test_cvt_tokens_of_upsampled_windows_are_the_tokens():
    """FlexiViT's invariance on CvT's overlapping windows: each window B-resized (3 -> 6 px) through the new kernel
    gives the original token."""
    model = _cvt()
    embed = model.stages[0].patch_embed
    x = torch.randn(1, 3, 16, 16)
    ref = embed.proj(x).flatten(2)  # [1, O, L]
    model.set_input_size(patch_size=4)
    new = model.stages[0].patch_embed.proj
    windows = F.unfold(x, 3, padding=1, stride=2).transpose(1, 2).reshape(-1, 1, 3, 3)  # [L * C, 1, 3, 3]
    windows = F.interpolate(windows, size=(6, 6), mode="bicubic", antialias=True, align_corners=False)
    tokens = windows.reshape(-1, 3 * 36) @ new.weight.flatten(1).T + new.bias  # [L, O]
    assert (tokens.T[None] - ref).abs().max() < 1e-4


@pytest.mark.parametrize("bad, hint", [(3, "multiple of 2"), (5, "kernel of 7.5 px")])
def test_cvt_refuses_a_stride_that_leaves_a_fractional_kernel(bad, hint):
    with pytest.raises(ValueError, match=hint):
        _cvt().set_input_size(patch_size=bad)
