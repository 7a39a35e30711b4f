"""Native batches of clips (tubelets with (t, y, x) coordinates) on every video ViT and multimodal preset: each
clip's logits in a padded (or, for the video ViT, packed) batch equal its logits alone (packed multimodal
sequences: tests/test_native_mm_packed.py)."""

import pytest
import timm
import torch
from conftest import one_per_pe

import visionpe
from visionpe.layout.batch import pack_images, patchify_clip
from visionpe.zoo.multimodal_family import MM
from visionpe.zoo.video_family import VIDEO

VIVITS = one_per_pe(visionpe.list_visionpe_models("vivit_*"))
MMS = one_per_pe(visionpe.list_visionpe_models("mm_*"))
# (T, H, W): frames of the reference, fewer and more frames, a 1 x 3 grid per frame, non-square (tubelet 2, patch 8)
CLIPS = [(4, 32, 32), (2, 16, 40), (6, 8, 24), (4, 24, 16)]


def _close(got, want):
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("name", VIVITS)
def test_each_clip_in_a_batch_matches_it_alone(name):
    m = timm.create_model(name, **dict(VIDEO.tiny), num_classes=10).eval()
    clips = [torch.randn(3, *shape) for shape in CLIPS]
    k = m.patch_embed.tubelet_size
    with torch.no_grad():
        want = torch.cat([m(c[None]) for c in clips])
        for rows in (clips, [clips[:2], clips[2:]]):
            feats = m.forward_features(pack_images(rows, 8, tubelet=k))
            assert torch.isfinite(feats["patches"]).all()
            assert _close(m.forward_head(feats), want) < 1e-5


def test_patchify_clip_pads_and_orders_tubelets():
    clip = torch.randn(3, 3, 10, 17)
    cells, coords = patchify_clip(clip, 2, 8)
    assert cells.shape == (2 * 2 * 3, 2 * 8 * 8 * 3) and coords.shape == (12, 3)
    assert coords[-1].tolist() == [1, 1, 2] and coords[1].tolist() == [0, 0, 1]
    # tubelet (t=0, y=0, x=1), element (pt=1, ph=2, pw=3, c=2) is pixel (t=1, y=2, x=8 + 3) of channel 2
    assert cells[1].view(2, 8, 8, 3)[1, 2, 3, 2] == clip[2, 1, 2, 11]
    assert (cells[-1].view(2, 8, 8, 3)[1] == 0).all()  # the padded third frame's second half


def test_native_clip_intermediates_are_nlc_only():
    m = timm.create_model("vivit_n_rope3d", **dict(VIDEO.tiny), num_classes=10).eval()
    batch = pack_images([torch.randn(3, *s) for s in CLIPS[:2]], 8, tubelet=2)
    with torch.no_grad():
        out = m.forward_intermediates(batch, indices=[1], output_fmt="NLC", intermediates_only=True)
    assert out[0].shape == (2, batch["patches"].shape[1], 32)
    with pytest.raises(ValueError, match="NLC"):
        m.forward_intermediates(batch, output_fmt="NCTHW")
    with pytest.raises(ValueError, match=r"\[B, N, 3\]"):
        m({**batch, "patch_coord": batch["patch_coord"][..., :2]})


@pytest.mark.parametrize("name", MMS)
def test_each_clip_with_its_text_matches_it_alone(name):
    m = timm.create_model(name, **dict(MM.tiny), num_classes=10).eval()
    clips = [torch.randn(3, *shape) for shape in CLIPS]
    text = torch.randint(0, 32, (len(clips), 5))
    batch = pack_images(clips, 8, tubelet=2)
    with torch.no_grad():
        for split in (None, 0, 3):
            want = torch.cat([m(c[None], text[i : i + 1], split) for i, c in enumerate(clips)])
            feats = m.forward_features(batch, text, split)
            assert torch.isfinite(feats["patches"]).all()
            assert _close(m.forward_head(feats), want) < 1e-5


def test_multimodal_image_as_a_one_tubelet_clip_padded_or_packed():
    m = timm.create_model("mm_n_mrope", **dict(MM.tiny), num_classes=10).eval()
    images = [torch.randn(3, 16, 40), torch.randn(3, 32, 32)]
    clips = [img.unsqueeze(1).expand(-1, 2, -1, -1) for img in images]  # the encoder repeats an image to a tubelet
    with torch.no_grad():
        want = torch.cat([m(img[None]) for img in images])
        assert _close(m(pack_images(clips, 8, tubelet=2)), want) < 1e-5
        assert _close(m(pack_images([clips], 8, tubelet=2)), want) < 1e-5  # both in one packed row
