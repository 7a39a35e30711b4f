"""Packed native batches through the multimodal encoder: several (clip + its text) sequences per row, each with its
own prefix tokens and position ids, attention blocked between them; each sequence's logits equal its logits alone."""

import pytest
import timm
import torch
from conftest import one_per_pe

import visionpe
from visionpe.layout.batch import pack_images
from visionpe.models import native_batch
from visionpe.zoo.multimodal_family import MM

MMS = one_per_pe(visionpe.list_visionpe_models("mm_*"))
# (T, H, W) at tubelet 2, patch 8: the reference, fewer and more frames, a 1 x 3 grid per frame, an image (one
# tubelet frame), non-square; rows of 2, 3 and 3 sequences, the first fills the length; one grid twice in a row,
# one in two rows
CLIPS = [(4, 32, 32), (2, 16, 40), (6, 8, 24), (2, 24, 16), (2, 24, 16), (4, 24, 16), (2, 16, 40), (2, 8, 8)]
ROWS = [[0, 1], [2, 3, 4], [5, 6, 7]]
PREFIX = {"avg": dict(class_token=False), "token": dict(class_token=True, reg_tokens=2, global_pool="token")}


@pytest.fixture(params=["images", "mask"])
def native_attention(request):
    """Both routes of attention: per group of same-grid sequences, and masked over the whole batch."""
    native_batch.set_native_attention(request.param)
    yield request.param
    native_batch.set_native_attention("auto")


def _close(got, want):
    return float((got - want).abs().max() / want.abs().max())


def _packed(clips, rows=ROWS, length=None):
    return pack_images([[clips[i] for i in row] for row in rows], 8, length=length, tubelet=2)


def _shuffled(batch: dict, seed: int = 0) -> dict:
    """The same batch with every row's patches (and padding) in a random order: sequences interleave in a row."""
    g = torch.Generator().manual_seed(seed)
    n = batch["patches"].shape[1]
    order = torch.stack([torch.randperm(n, generator=g) for _ in range(batch["patches"].shape[0])])
    return {k: v.gather(1, order.view(*order.shape, *[1] * (v.ndim - 2)).expand_as(v)) for k, v in batch.items()}


@pytest.mark.parametrize("prefix", sorted(PREFIX))
@pytest.mark.parametrize("name", MMS)
def test_each_packed_sequence_matches_it_alone(name, prefix, native_attention):
    m = timm.create_model(name, **{**dict(MM.tiny), **PREFIX[prefix]}, num_classes=10).eval()
    torch.manual_seed(0)
    clips = [torch.randn(3, *shape) for shape in CLIPS]
    text = torch.randint(0, 32, (len(clips), 5))  # one text row per sequence: row order, then sequence order
    batch = _packed(clips)
    with torch.no_grad():
        for split in (None, 0, 5):
            want = torch.cat([m(c[None], text[i : i + 1], split) for i, c in enumerate(clips)])
            for b in (batch, _shuffled(batch)):
                feats = m.forward_features(b, text, split)
                assert torch.isfinite(feats["patches"]).all()
                assert _close(m.forward_head(feats), want) < 1e-5


def test_packed_rows_with_padding_an_empty_row_and_no_text(native_attention):
    m = timm.create_model("mm_n_v2pe", **dict(MM.tiny), class_token=True, num_classes=10).eval()
    clips = [torch.randn(3, *shape) for shape in CLIPS[:3]]
    rows = [[0], [], [1, 2]]  # padding after every row, a row with no sequence
    with torch.no_grad():
        want = torch.cat([m(c[None]) for c in clips])
        feats = m.forward_features(_packed(clips, rows, length=200))
        assert torch.isfinite(feats["patches"]).all()
        assert _close(m.forward_head(feats), want) < 1e-5
        assert feats["patch_valid"].shape[0] == 3 and not feats["patch_valid"][1].any()


def test_packed_layout_places_prefixes_first_and_blocks_sequences():
    m = timm.create_model("mm_n_mrope", **dict(MM.tiny), class_token=True, num_classes=10).eval()
    clips = [torch.randn(3, *shape) for shape in [(2, 8, 16), (2, 8, 8)]]
    text = torch.randint(0, 32, (2, 3))
    batch = _packed(clips, [[0, 1]])
    from visionpe.models.native_sequence import embed_native_sequence

    _, layout = embed_native_sequence(m, batch, text, 1)
    # two prefix slots, then body 0 (3 text + 2 markers + 2 cells) and body 1 (3 + 2 + 1)
    assert layout.ids.tolist() == [[0, 1] + [0] * 7 + [1] * 6]
    assert layout.prefix_length == 2 and layout.num_images == 2
    dense = layout.mask.dense()[0, 0]
    assert not dense[2:9, 9:].any() and dense[2:9, 2:9].all() and dense[0, 2:9].all() and not dense[0, 9:].any()


def test_packed_sequence_errors():
    m = timm.create_model("mm_n_mrope", **dict(MM.tiny), num_classes=10).eval()
    clips = [torch.randn(3, *shape) for shape in CLIPS[:3]]
    batch = _packed(clips, [[0, 1], [2]])
    text = torch.randint(0, 32, (3, 4))
    gap = {**batch, "image_ids": torch.where(batch["image_ids"] == 1, 2, batch["image_ids"])}
    with pytest.raises(ValueError, match="row 0 has image_ids 2 but no patches with image_ids 1"):
        m(gap, text)
    with pytest.raises(ValueError, match="has 2 rows but the packed batch holds 3 sequences"):
        m(batch, text[:2])
    cut = {**batch, "patch_valid": batch["patch_valid"].clone()}
    cut["patch_valid"][0, 3] = False  # sequence 0 of row 0 loses a patch of its grid
    with pytest.raises(ValueError, match="image 0 of row 0 has"):
        m(cut, text)
    with pytest.raises(ValueError, match="text_split=5 is outside"):
        m(batch, text, 5)


def test_packed_gradients_equal_the_sum_over_sequences_alone(native_attention):
    """Training on a packed batch: every parameter's gradient equals the sum of the sequences' gradients alone."""
    m = timm.create_model("mm_n_videorope", **{**dict(MM.tiny), **PREFIX["token"]}, num_classes=10)
    torch.manual_seed(1)
    clips = [torch.randn(3, *shape) for shape in CLIPS]
    text = torch.randint(0, 32, (len(clips), 4))
    weights = torch.randn(len(clips), 10)

    def grads(loss):
        m.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    packed = grads((m(_shuffled(_packed(clips)), text) * weights).sum())
    alone = grads(sum((m(c[None], text[i : i + 1]) * weights[i]).sum() for i, c in enumerate(clips)))
    assert packed.keys() == alone.keys() and "markers" in packed
    for name, g in alone.items():
        assert _close(packed[name], g) < 1e-5, name
