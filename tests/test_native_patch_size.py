"""A native batch with its own patch size: unflattened patches [B, N, (pt,) P, P, C] of another P (timm's NaFlex
loader with patch_size_choices) through the model's kernel PI-resized to P, as timm's PatchEmbedInterpolator does;
the learned tables and PEs follow the batch's grid.

Tolerances: both sides of each comparison compute the same float32 sums in another order (1e-6 relative on tokens);
whole models through a few blocks, 1e-5 relative to the logits' scale, as in tests/test_native.py.
"""

from __future__ import annotations

import copy

import pytest
import timm
import torch
from timm.layers import PatchEmbedInterpolator

import visionpe  # noqa: F401  (registers the models)
from visionpe.layout.batch import pack_images
from visionpe.zoo.video_family import VIDEO
from visionpe.zoo.vit_family import VIT

SIZES = [(32, 32), (16, 48), (24, 16)]  # px; at patch 4 and 8 every side a whole number of patches


def _close(got, want):
    return float((got - want).abs().max() / want.abs().max())


def _unflattened(batch: dict, *cell) -> dict:
    """pack_images' (ph, pw, c)-flattened patches as timm's unflattened [B, N, (pt,) ph, pw, C]."""
    b, n = batch["patches"].shape[:2]
    return {**batch, "patches": batch["patches"].reshape(b, n, *cell)}


def _vit(name: str):
    torch.manual_seed(0)
    return timm.create_model(name, **VIT.tiny).eval()  # patch 8


@pytest.mark.parametrize("q", [4, 16])
def test_patch_tokens_equal_timms_patch_embed_interpolator(q):
    model = _vit("vit_n_ape")
    torch.manual_seed(1)
    images = [torch.randn(3, h, w) for h, w in SIZES]
    batch = _unflattened(pack_images(images, q), q, q, 3)
    with torch.no_grad():
        x, layout = model.embed_native(batch)
        proj = model.patch_embed.proj
        interp = PatchEmbedInterpolator((8, 8), in_chans=3, embed_dim=32, channels_last=True)
        ref = interp(batch["patches"], proj.weight.permute(0, 2, 3, 1).flatten(1), proj.bias, patch_size=(q, q))
    valid = batch["patch_valid"]
    got = x[:, layout.prefix_length :]
    assert (got - ref)[valid].abs().max() <= 1e-6 * ref.abs().max()


@pytest.mark.parametrize("name", ["vit_n_ape", "vit_n_rope2d", "vit_n_cpe", "vit_n_irpe", "vit_n_fuzzy"])
@pytest.mark.parametrize("q", [4, 16])
def test_each_image_at_the_batchs_patch_size_matches_the_resized_model_alone(name, q):
    """The batch at patch q = each image alone through the model resized to patch q with the same reference grid
    (set_input_size(img_size=32 q / 8, patch_size=q)): the same kernel, and the tables and PEs resampled from the
    reference grid to the image's own grid (once, as for an image of that grid at the model's patch)."""
    model = _vit(name)
    resized = copy.deepcopy(model)
    resized.set_input_size(img_size=32 * q // 8, patch_size=q)
    assert resized.pe_grid == model.pe_grid
    torch.manual_seed(1)
    images = [torch.randn(3, h, w) for h, w in SIZES]
    with torch.no_grad():
        want = torch.cat([resized(img[None]) for img in images])
        padded = _unflattened(pack_images(images, q), q, q, 3)
        packed = _unflattened(pack_images([images[:2], images[2:]], q), q, q, 3)
        for batch in (padded, packed):
            assert _close(model(batch), want) < 1e-5


def test_clips_at_the_batchs_patch_size_match_the_resized_model_alone():
    torch.manual_seed(0)
    model = timm.create_model("vivit_n_rope3d", **VIDEO.tiny, num_classes=10).eval()
    resized = copy.deepcopy(model)
    resized.set_input_size(img_size=16, patch_size=4)  # the same reference grid
    clips = [torch.randn(3, t, h, w) for t, h, w in [(4, 32, 32), (2, 16, 24)]]
    with torch.no_grad():
        want = torch.cat([resized(c[None]) for c in clips])
        got = model(_unflattened(pack_images(clips, 4, tubelet=2), 2, 4, 4, 3))
    assert _close(got, want) < 1e-5


def test_gradients_reach_the_base_kernel():
    model = _vit("vit_n_rope2d").train()
    batch = _unflattened(pack_images([torch.randn(3, 16, 16)], 4), 4, 4, 3)
    model(batch).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


def test_another_tubelet_length_is_a_clear_error():
    model = timm.create_model("vivit_n_rope3d", **VIDEO.tiny).eval()
    batch = _unflattened(pack_images([torch.randn(3, 4, 16, 16)], 8, tubelet=4), 4, 8, 8, 3)
    with pytest.raises(ValueError, match="tubelets of 4 frames, the model's have 2"):
        model(batch)


def test_flattened_patches_of_another_size_name_the_unflattened_form():
    model = _vit("vit_n_rope2d")
    with pytest.raises(ValueError, match=r"come unflattened, \[B, N, P, P, C\]"):
        model(pack_images([torch.randn(3, 16, 16)], 4))
