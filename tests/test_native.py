"""Native-resolution batches (padded NaFlex dicts and packed rows) on every vit preset: each image's logits in a
batch equal its logits alone at its own size."""

import pytest
import timm
import torch
from conftest import one_per_pe
from timm.data.naflex_dataset import NaFlexCollator
from timm.data.naflex_transforms import Patchify

import visionpe
from visionpe.layout.batch import pack_images
from visionpe.models import native_batch
from visionpe.zoo.vit_family import VIT

TINY = dict(VIT.tiny)
VITS = one_per_pe(visionpe.list_visionpe_models("vit_*"))

# (H, W) in pixels of patch 8: square, non-square both ways, a 1 x 5 grid, a 5 x 1 grid, and the longest (fills a row)
SIZES = [(32, 32), (16, 48), (8, 40), (40, 8), (24, 16), (40, 32)]
# ViTAR's token merger reduces any grid to its 4 x 4 (patch 4): every side at least 4 patches
MERGER_SIZES = [(32, 32), (16, 48), (16, 40), (40, 16), (24, 16), (40, 32)]
PACKED_ROWS = [[0, 2, 4], [1], [3, 5]]  # image indices per row; output order = row order, then image order


def _model(name, **kw):
    return timm.create_model(name, **{**TINY, **kw}).eval()


def _images(model):
    sizes = MERGER_SIZES if model.token_merger is not None else SIZES
    return [torch.randn(3, h, w) for h, w in sizes]


def _alone(model, images):
    with torch.no_grad():
        return torch.cat([model(img[None]) for img in images])


def _close(got, want):
    """Max error relative to the logits' scale."""
    return float((got - want).abs().max() / want.abs().max())


@pytest.fixture(params=["images", "mask"])
def native_attention(request):
    """Both routes of attention over a native batch: per group of images, and masked over the whole batch."""
    native_batch.set_native_attention(request.param)
    yield request.param
    native_batch.set_native_attention("auto")


@pytest.mark.parametrize("name", VITS)
def test_each_image_in_a_batch_matches_it_alone(name, native_attention):
    m = _model(name)
    images = _images(m)
    want = _alone(m, images)
    p = m.patch_embed.patch_size[0]
    padded = pack_images(images, p)
    packed = pack_images([[images[i] for i in row] for row in PACKED_ROWS], p)
    order = [i for row in PACKED_ROWS for i in row]
    with torch.no_grad():
        for batch, ref in ((padded, want), (packed, want[order])):
            feats = m.forward_features(batch)
            got = m.forward_head(feats)
            assert got.shape == ref.shape
            assert _close(got, ref) < 1e-5, name
            assert torch.isfinite(feats["patches"]).all()  # padding tokens included


@pytest.mark.parametrize("pool", ["max", "avgmax", "map"])
def test_max_and_attention_pools_of_a_packed_batch_pool_each_image_alone(pool):
    """timm's max / avgmax / attention (map) pools over a packed batch: each image's tokens alone, none of the
    padding or the other images' (a pool over the row would take their maxima, or attend to them)."""
    m = _model("vit_n_rope2d", global_pool=pool, reg_tokens=1, pre_norm=True)
    images = _images(m)
    want = _alone(m, images)
    order = [i for row in PACKED_ROWS for i in row]
    with torch.no_grad():
        got = m(pack_images([[images[i] for i in row] for row in PACKED_ROWS], 8))
    assert _close(got, want[order]) < 1e-5


@pytest.mark.parametrize("name", ["vit_n_rope2d", "vit_n_irpe", "vit_n_lepe", "vit_n_cpe", "vit_n_lff", "vit_n_seqpe"])
def test_registers_and_interpolate_mode(name, native_attention):
    m = _model(name, reg_tokens=2, position_mode="interpolate")
    images = _images(m)[:4]
    want = _alone(m, images)
    with torch.no_grad():
        got = m(pack_images([images[:3], images[3:]], 8))
    assert _close(got, want) < 1e-5


def test_nlc_intermediates_per_patch_and_padding_zero():
    m = _model("vit_n_rope2d_mixed_ape")
    images = _images(m)[:3]
    batch = pack_images(images, 8)
    with torch.no_grad():
        final, inter = m.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC", return_prefix_tokens=True)
        for b, img in enumerate(images):
            alone = m.forward_intermediates(img[None], indices=[0, 1], output_fmt="NLC", return_prefix_tokens=True)
            n = alone[1][0][0].shape[1]
            for (tokens, prefix), (ref, ref_prefix) in zip(inter, alone[1]):
                assert _close(tokens[b, :n], ref[0]) < 1e-5
                assert _close(prefix[b], ref_prefix[0]) < 1e-5
                assert (tokens[b, n:] == 0).all()  # padding
    assert m.forward_head(final).shape == (3, 10)
    with pytest.raises(ValueError, match="NLC"):
        m.forward_intermediates(batch, output_fmt="NCHW")


def test_timm_patchify_and_collator_feed_the_model():
    m = _model("vit_n_rope2d")
    images = _images(m)[:3]
    patchify = Patchify(8)
    batch, _ = NaFlexCollator(max_seq_len=40)([(patchify(img), 0) for img in images])
    with torch.no_grad():
        assert _close(m(batch), _alone(m, images)) < 1e-5


def test_patch_order_within_a_row_does_not_matter():
    m = _model("vit_n_lookhere")
    images = _images(m)[:2]
    batch = pack_images([images], 8)
    perm = torch.randperm(batch["patches"].shape[1])
    shuffled = {k: v[:, perm] for k, v in batch.items()}
    with torch.no_grad():
        assert _close(m(shuffled), _alone(m, images)) < 1e-5


def test_gradients_of_a_packed_batch_are_those_of_each_image(native_attention):
    m = _model("vit_n_irpe").train()
    images = _images(m)[:3]
    m.zero_grad()
    m(pack_images([images[:2], images[2:]], 8)).square().sum().backward()
    packed = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    for img in images:
        m(img[None]).square().sum().backward()
    overall = max(float(p.grad.abs().max()) for p in m.parameters() if p.grad is not None)
    for n, p in m.named_parameters():
        if p.grad is not None:  # fp32 sums in another order: relative to the parameter's and to all gradients
            assert float((packed[n] - p.grad).abs().max()) <= 1e-4 * float(p.grad.abs().max()) + 1e-6 * overall, n


def test_rows_without_images_and_empty_prefix_slots():
    m = _model("vit_n_rope2d")
    images = _images(m)[:3]
    batch = pack_images([[images[0]], [], [images[1], images[2]]], 8)
    with torch.no_grad():
        feats = m.forward_features(batch)
        assert _close(m.forward_head(feats), _alone(m, images)) < 1e-5
    assert torch.isfinite(feats["patches"]).all()
    assert feats["patches"].shape[1] == 2 * m.num_prefix_tokens + batch["patches"].shape[1]


def test_bad_native_batches_are_clear_errors():
    with pytest.raises(ValueError, match="native attention mode"):
        native_batch.set_native_attention("dense")
    m = _model("vit_n_rope2d")
    good = pack_images(_images(m)[:2], 8)
    with pytest.raises(ValueError, match=r"\[B, N, 192\]"):
        m({**good, "patches": good["patches"][..., :10]})
    with pytest.raises(ValueError, match="full"):
        m({**good, "patch_valid": good["patch_valid"].clone().index_fill_(1, torch.tensor([3]), False)})
    coord = good["patch_coord"].clone()
    coord[0, 1] = coord[0, 0]
    with pytest.raises(ValueError, match="full|repeats"):
        m({**good, "patch_coord": coord})
    empty = good["patch_valid"].clone()
    empty[1] = False
    with pytest.raises(ValueError, match="row 1 has no valid patch"):
        m({**good, "patch_valid": empty})
    with pytest.raises(ValueError, match="unknown keys"):
        m({**good, "attn_mask": None})
    with pytest.raises(ValueError, match="image_ids < 0"):
        m({**good, "image_ids": torch.full_like(good["patch_valid"], -2, dtype=torch.long)})


def test_empty_images_integer_patches_and_huge_ids_are_refused():
    m = _model("vit_n_rope2d")
    a, b = _images(m)[:2]
    with pytest.raises(ValueError, match=r"image 1 of row 0 is empty \(0 x 16 px\)"):
        pack_images([[a, torch.zeros(3, 0, 16), b]], 8)  # it used to vanish, moving b's logits up a row
    good = pack_images([[a, b], [b]], 8)
    gap = good["image_ids"].clone()
    gap[gap == 1] = 2  # image 1 has no patches: an empty image in a hand-built dict
    with pytest.raises(ValueError, match="row 0 has image_ids 2 but no patches with image_ids 1"):
        m({**good, "image_ids": gap})
    pixels = (good["patches"].clamp(0, 1) * 255).to(torch.uint8)
    with pytest.raises(ValueError, match=r"'patches' are uint8; give float patches normalised .*pixels / 255"):
        m({**good, "patches": pixels})
    huge = good["image_ids"].clone()
    huge[1][huge[1] == 0] = 3_000_000  # a table sized by the largest id would take memory per id
    with pytest.raises(ValueError, match="row 1 has image_ids 3000000, not below its 28 patches"):
        m({**good, "image_ids": huge})


def test_training_with_grad_checkpointing_and_bf16_autocast():
    m = _model("vit_n_rope2d_mixed_ape", drop_path_rate=0.1)
    images = _images(m)[:4]
    batch = pack_images([images[:2], images[2:]], 8)
    m.train().set_grad_checkpointing(True)
    m(batch).logsumexp(-1).sum().backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    m.eval().set_grad_checkpointing(False)
    with torch.no_grad():
        want = m(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = m(batch)
    assert got.dtype == torch.bfloat16 and _close(got.float(), want) < 5e-2  # bf16: 8 mantissa bits, 2 blocks


def test_batch_layout_of_a_packed_batch():
    from visionpe.layout.batch import check_native, native_layout
    from visionpe.layout.tokens import image_layout

    # row 0: image 0 (2 x 3, patches in raster order), image 1 (1 x 2); row 1: image 0 (2 x 1) in reverse order
    coords = torch.tensor(
        [[[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2], [0, 0], [0, 1]], [[1, 0], [0, 0]] + [[0, 0]] * 6]
    )
    ids = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, -1, -1, -1, -1, -1, -1]])
    batch = dict(patches=torch.zeros(2, 8, 4), patch_coord=coords, patch_valid=ids >= 0, image_ids=ids)
    _, c, i = check_native(batch, 4)
    layout = native_layout(c, i, 1, lambda g: image_layout(*g, 1))
    assert layout.slots == 2 and layout.length == 10 and layout.num_images == 3
    assert layout.ids.tolist() == [[0, 1, 0, 0, 0, 0, 0, 0, 1, 1], [0, -1, 0, 0, -1, -1, -1, -1, -1, -1]]
    groups = {g.grid: g for g in layout.groups}
    assert groups[(2, 3)].index.tolist() == [[0, 2, 3, 4, 5, 6, 7]] and groups[(2, 3)].images.tolist() == [0]
    assert groups[(1, 2)].index.tolist() == [[1, 8, 9]] and groups[(1, 2)].images.tolist() == [1]
    assert groups[(2, 1)].index.tolist() == [[10, 13, 12]] and groups[(2, 1)].images.tolist() == [2]  # raster order
    assert layout.mask.seqlens() is None  # the prefix slots sit apart from their patches
