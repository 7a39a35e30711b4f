"""Masked attention for batches of several images: every backend equals attention over each segment alone; the CUDA
paths (flex attention's BlockMask, xformers' BlockDiagonalMask) checked on CPU through mocks of their kernels."""

import sys
import types

import pytest
import timm
import torch

from visionpe.attention import backends as attention
from visionpe.attention import masks as attn_mask
from visionpe.attention.backends import attend, attn_backend
from visionpe.attention.masks import AttnMask
from visionpe.bench.perf.backend_check import check_masked_backend, check_native_model, packed_segment_ids
from visionpe.layout.batch import pack_images
from visionpe.zoo.vit_family import VIT

# row 0: two images and padding; row 1: one image filling the row; row 2: only padding; row 3: interleaved segments
IDS = torch.tensor(
    [
        [0, 0, 0, 1, 1, 1, 1, -1, -1, -1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [-1, -1, -1, -1, -1, -1, -1, -1, -1, -1],
        [1, 0, 1, 0, 0, 0, 1, 1, -1, 1],
    ]
)


def _qkv(b=4, h=2, n=10, d=8):
    return torch.randn(b, h, n, d), torch.randn(b, h, n, d), torch.randn(b, h, n, d)


def _reference(q, k, v, ids, bias=None):
    """Attention of each segment of each row alone (the math path on its tokens)."""
    out = torch.zeros_like(q)
    scale = q.shape[-1] ** -0.5
    for b in range(ids.shape[0]):
        for seg in ids[b].unique():
            idx = (ids[b] == seg).nonzero().flatten()
            logits = (q[b][:, idx] * scale) @ k[b][:, idx].transpose(-2, -1)
            if bias is not None:
                logits = logits + bias[b][:, idx][:, :, idx]
            out[b][:, idx] = logits.softmax(-1) @ v[b][:, idx]
    return out


@pytest.mark.parametrize("backend", ["math", "sdpa", "flex", "auto"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_masked_attention_equals_each_segment_alone(backend, with_bias):
    q, k, v = _qkv()
    bias = torch.randn(4, 2, 10, 10) if with_bias else None
    with attn_backend(backend):
        got = attend(q, k, v, bias, mask=AttnMask(IDS))
    assert torch.isfinite(got).all()  # the padding-only row too
    torch.testing.assert_close(got, _reference(q, k, v, IDS, bias), rtol=1e-5, atol=1e-5)


def test_seqlens_only_for_contiguous_segments():
    assert AttnMask(IDS[:3]).seqlens() == [3, 4, 3, 10, 10]
    assert AttnMask(IDS).seqlens() is None  # row 3 interleaves its images


def test_auto_on_cuda_uses_flex_with_a_block_mask(monkeypatch):
    calls = []

    def kernel(q, k, v, score_mod=None, block_mask=None, scale=None):
        calls.append((block_mask, score_mod))
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    monkeypatch.setattr(attention, "on_cuda", lambda q: True)
    monkeypatch.setattr(attn_mask, "flex_kernel", lambda device: kernel)
    q, k, v = _qkv()
    mask = AttnMask(IDS)
    got = attend(q, k, v, mask=mask)
    assert len(calls) == 1 and calls[0][1] is None
    assert tuple(calls[0][0].shape) == (4, 1, 10, 10)
    assert attend(q, k, v, mask=mask) is not None and calls[1][0] is calls[0][0]  # the BlockMask is built once
    torch.testing.assert_close(got, _reference(q, k, v, IDS), rtol=1e-5, atol=1e-5)
    attend(q, k, v, torch.randn(4, 2, 10, 10), mask=mask)  # a bias: auto takes SDPA with the dense mask
    assert len(calls) == 2


class _FakeBlockDiagonalMask:
    def __init__(self, seqlens):
        self.seqlens = list(seqlens)

    @classmethod
    def from_seqlens(cls, seqlens):
        return cls(seqlens)


def _fake_xformers(calls):
    """xformers.ops with memory_efficient_attention over [B, M, H, K] tensors, a tensor bias or a block mask."""

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None):
        calls.append(attn_bias)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, M, K]
        if isinstance(attn_bias, _FakeBlockDiagonalMask):
            ids = torch.repeat_interleave(torch.arange(len(attn_bias.seqlens)), torch.tensor(attn_bias.seqlens))
            out = _reference(q, k, v, ids[None])
        else:
            logits = (q * scale) @ k.transpose(-2, -1) + (0 if attn_bias is None else attn_bias)
            out = logits.softmax(-1) @ v
        return out.transpose(1, 2)

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = memory_efficient_attention
    ops.fmha = types.SimpleNamespace(BlockDiagonalMask=_FakeBlockDiagonalMask)
    root = types.ModuleType("xformers")
    root.ops = ops
    return {"xformers": root, "xformers.ops": ops, "xformers.ops.fmha": ops.fmha}


def test_xformers_block_diagonal_and_dense_paths(monkeypatch):
    calls = []
    for name, module in _fake_xformers(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(attention, "xformers_supports", lambda q, bias: (True, ""))
    q, k, v = _qkv()
    contiguous = AttnMask(IDS[:3])
    got = attend(q[:3], k[:3], v[:3], mask=contiguous)  # auto (not on CUDA: no flex) -> xformers' block mask
    assert isinstance(calls[-1], _FakeBlockDiagonalMask) and calls[-1].seqlens == [3, 4, 3, 10, 10]
    torch.testing.assert_close(got, _reference(q[:3], k[:3], v[:3], IDS[:3]), rtol=1e-5, atol=1e-5)
    n = len(calls)
    attend(q, k, v, mask=AttnMask(IDS))  # interleaved segments: auto takes SDPA
    assert len(calls) == n
    with attn_backend("xformers"):  # named: the dense mask as an aligned -inf bias
        got = attend(q, k, v, mask=AttnMask(IDS))
    assert isinstance(calls[-1], torch.Tensor) and calls[-1].stride(-2) % 8 == 0
    torch.testing.assert_close(got, _reference(q, k, v, IDS), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["vit_n_rope2d", "vit_n_irpe", "vit_n_alibi2d"])
@pytest.mark.parametrize("backend", ["flex", "math"])
def test_models_run_native_batches_on_every_backend(name, backend):
    m = timm.create_model(name, **dict(VIT.tiny)).eval()
    images = [torch.randn(3, 16, 40), torch.randn(3, 32, 24), torch.randn(3, 8, 8)]
    with torch.no_grad(), attn_backend(backend):
        got = m(pack_images([images[:2], images[2:]], 8))
        want = torch.cat([m(img[None]) for img in images])
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


@pytest.mark.parametrize("backend,with_bias", [("sdpa", False), ("flex", True)])
def test_backend_check_against_the_math_reference(backend, with_bias):
    r = check_masked_backend(
        backend, "cpu", rows=2, length=64, images_per_row=3, heads=2, head_dim=8, with_bias=with_bias, reps=1
    )
    assert r["fp32_ok"] and r["bf16_ok"], r
    assert r["fp32_max_rel_err"] < 1e-5 and r["images"] == 6 and r["fp32_images_per_s"] > 0
    ids = packed_segment_ids(2, 64, 3)
    assert sorted(ids[0].unique().tolist()) == [-1, 0, 1, 2] and (ids[:, 0] == 0).all()


def test_auto_route_on_cuda_masks_rotary_pes_and_runs_bias_pes_per_image(monkeypatch):
    """On CUDA (pretended) auto takes one flex call over the batch for a rotary PE, and the per-image route for a
    PE with a logits bias (a dense [B, H, L, L] bias would be needed otherwise)."""
    flex_calls = []

    def kernel(q, k, v, score_mod=None, block_mask=None, scale=None):
        from torch.nn.attention.flex_attention import flex_attention

        flex_calls.append(q.shape)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)

    monkeypatch.setattr(attention, "on_cuda", lambda q: True)
    monkeypatch.setattr(attn_mask, "flex_kernel", lambda device: kernel)
    images = [torch.randn(3, 16, 40), torch.randn(3, 32, 24), torch.randn(3, 8, 8)]
    batch = pack_images([images[:2], images[2:]], 8)
    for name, calls in (("vit_n_rope2d", 2), ("vit_n_alibi2d", 0)):
        m = timm.create_model(name, **dict(VIT.tiny)).eval()
        flex_calls.clear()
        with torch.no_grad():
            got = m(batch)
            want = torch.cat([m(img[None]) for img in images])
        assert len(flex_calls) == calls  # one per block (depth 2), over the whole [B, L] batch
        assert all(s[2] == batch["patches"].shape[1] + 2 for s in flex_calls)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_model_check_of_a_backend_on_a_packed_batch():
    m = timm.create_model("vit_n_rope2d_mixed", **dict(VIT.tiny))
    r = check_native_model(m, "sdpa", "cpu", reps=1)
    assert r["fp32_ok"] and r["fp32_max_rel_err"] < 1e-5 and r["images"] == 8, r


def test_auto_falls_back_to_sdpa_when_flex_fails(monkeypatch):
    def broken(device):
        def kernel(*args, **kwargs):
            raise RuntimeError("no triton")

        return kernel

    monkeypatch.setattr(attention, "on_cuda", lambda q: True)
    monkeypatch.setattr(attn_mask, "flex_kernel", broken)
    monkeypatch.setattr(attention, "_auto_failed", {})
    q, k, v = _qkv()
    with pytest.warns(UserWarning, match="falls back to SDPA"):
        got = attend(q, k, v, mask=AttnMask(IDS))
    torch.testing.assert_close(got, _reference(q, k, v, IDS), rtol=1e-5, atol=1e-5)
    assert attention.resolve_backend(q, None, AttnMask(IDS)) == "sdpa"  # not chosen again
    with attn_backend("flex"), pytest.raises(RuntimeError, match="no triton"):  # named: the error surfaces
        attend(q, k, v, mask=AttnMask(IDS))
