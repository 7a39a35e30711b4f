import sys
import types

import pytest
import torch

import visionpe.attention.backends as A
from visionpe import attend, attn_backend, set_attn_backend


def _qkv(b=2, h=3, n=17, m=13, d=16):
    return torch.randn(b, h, n, d), torch.randn(b, h, m, d), torch.randn(b, h, m, d)


@pytest.mark.parametrize("bias_shape", [None, (1, 3, 17, 13), (2, 1, 17, 13), (2, 3, 17, 13)])
def test_math_and_sdpa_agree_in_fp32(bias_shape):
    q, k, v = _qkv()
    bias = None if bias_shape is None else torch.randn(bias_shape)
    with attn_backend("math"):
        ref = attend(q, k, v, bias, scale=0.3)
    with attn_backend("sdpa"):
        out = attend(q, k, v, bias, scale=0.3)
    assert (out - ref).abs().max() < 1e-5
    # and the math path is the definition
    p = torch.softmax(q @ k.transpose(-1, -2) * 0.3 + (0 if bias is None else bias), -1)
    assert (ref - p @ v).abs().max() < 1e-5


def test_auto_falls_back_to_sdpa_on_cpu():
    q, _, _ = _qkv()
    with attn_backend("auto"):
        assert A.resolve_backend(q, None) == "sdpa"


def test_auto_takes_xformers_when_it_can(monkeypatch):
    q, _, _ = _qkv()
    monkeypatch.setattr(A, "xformers_supports", lambda q, bias: (True, ""))
    with attn_backend("auto"):
        assert A.resolve_backend(q, None) == "xformers"


def test_naming_a_backend_that_cannot_run_raises(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setattr(A, "xformers_supports", lambda q, bias: (False, "xformers runs on CUDA tensors only"))
    with attn_backend("xformers"), pytest.raises(RuntimeError, match="CUDA"):
        attend(q, k, v)


def test_xformers_capability_checks():
    q, _, _ = _qkv()
    ok, why = A.xformers_supports(q, None)
    assert not ok and why  # CPU tensors (or no xformers) are refused with a reason


def _install_xformers(monkeypatch, kernel) -> None:
    """An `xformers` package whose memory_efficient_attention is `kernel`, usable on these (CPU) tensors."""
    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = kernel
    pkg = types.ModuleType("xformers")
    pkg.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", pkg)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    monkeypatch.setattr(A, "xformers_supports", lambda q, bias: (True, ""))


def test_xformers_call_path_layout_and_bias_alignment(monkeypatch):
    """Drive the xformers path with a stand-in kernel that checks what xformers requires: [B, M, H, K] inputs and
    a full-shape bias whose row stride is a multiple of 8."""
    calls = {}

    def fake_mea(q, k, v, attn_bias=None, scale=None):
        calls["shape"] = q.shape
        if attn_bias is not None:
            assert attn_bias.shape == (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
            assert attn_bias.stride(-2) % 8 == 0
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        logits = qh @ kh.transpose(-1, -2) * scale + (0 if attn_bias is None else attn_bias)
        return (logits.softmax(-1) @ vh).transpose(1, 2)

    _install_xformers(monkeypatch, fake_mea)
    q, k, v = _qkv()
    bias = torch.randn(1, 3, 17, 13)
    with attn_backend("sdpa"):
        ref = attend(q, k, v, bias)
    with attn_backend("xformers"):
        out = attend(q, k, v, bias)
    assert calls["shape"] == (2, 17, 3, 16)  # tokens before heads
    assert (out - ref).abs().max() < 1e-5


def test_auto_falls_back_to_sdpa_once_xformers_kernel_fails(monkeypatch):
    """xformers installed, but its compiled ops built for another torch: `auto` must not crash a run. It warns once,
    answers with sdpa and stops choosing xformers; naming xformers still raises the kernel's own error."""
    calls = []

    def no_operator(*args, **kwargs):
        calls.append(1)
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward`")

    _install_xformers(monkeypatch, no_operator)
    monkeypatch.setattr(A, "_auto_failed", {})
    q, k, v = _qkv()
    with attn_backend("sdpa"):
        ref = attend(q, k, v)
    with attn_backend("auto"):
        assert A.resolve_backend(q, None) == "xformers"
        with pytest.warns(UserWarning, match="xformers attention failed"):
            out = attend(q, k, v)
        assert torch.equal(out, ref) and len(calls) == 1
        assert A.resolve_backend(q, None) == "sdpa"  # not picked again
        assert torch.equal(attend(q, k, v), ref) and len(calls) == 1
    with attn_backend("xformers"), pytest.raises(NotImplementedError, match="No operator found"):
        attend(q, k, v)


def test_backend_selection_errors(monkeypatch):
    with pytest.raises(ValueError, match="choose one of"):
        set_attn_backend("flash")
    monkeypatch.setenv("VISIONPE_ATTN", "nope")
    with pytest.raises(ValueError, match="VISIONPE_ATTN"):
        A.get_attn_backend()


def test_attn_backend_context_restores_previous():
    before = A.get_attn_backend()
    with attn_backend("math"):
        assert A.get_attn_backend() == "math"
    assert A.get_attn_backend() == before


def test_math_casts_an_fp32_bias_to_the_query_dtype_as_sdpa_does():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=g).to(torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 2, 7, 7, generator=g)  # fp32, e.g. a PE table not cast with the model
    with attn_backend("math"):
        a = attend(q, k, v, bias)
    with attn_backend("sdpa"):
        b = attend(q, k, v, bias)
    assert a.dtype == torch.bfloat16
    # bf16 eps 7.8e-3; outputs are convex combinations of O(1) values: a few eps apart at most
    assert (a.float() - b.float()).abs().max() < 0.05
