"""The speed benchmark and gpu-check: FLOPs match a hand count, ours and timm's models are timed in one run, the
interleaved clock gives paired ratios, the memory probe and the growth fit; gpu-check's backends on CPU and with a
mocked GPU."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import types

import pytest
import timm
import torch

import visionpe  # noqa: F401
import visionpe.attention.backends
from visionpe.attention.backends import attn_backend
from visionpe.bench.__main__ import main as bench_main
from visionpe.bench.perf import gpu_check
from visionpe.bench.perf.backend_check import xformers_status
from visionpe.bench.perf.measure import (
    Clock,
    count_flops,
    example_input,
    interleave,
    paired_ratios,
    saved_activation_mb,
    spread,
)
from visionpe.bench.perf.speed import measure
from visionpe.zoo.registry import create_model, expand_models, family_of, timm_equivalent

# --------------------------------------------------------------------------------------------------- FLOPs, speed


def vit_flops_by_hand(
    img: int,
    patch: int,
    dim: int,
    depth: int,
    num_classes: int,
    in_chans: int = 3,
    num_prefix: int = 1,
    mlp_ratio: float = 4.0,
) -> dict[str, int]:
    """MACs of a ViT with CLS pooling, by part, counted as fvcore does (LayerNorm: 5 per element): what
    measure.count_flops must give."""
    n = (img // patch) ** 2
    t = n + num_prefix
    hidden = int(dim * mlp_ratio)
    per_block = {
        "linear": t * dim * 3 * dim + t * dim * dim + 2 * t * dim * hidden,  # qkv, proj, fc1, fc2
        "attention": 2 * t * t * dim,  # q k^T and probs @ v over all heads
        "layer_norm": 2 * 5 * t * dim,
    }
    return {
        "conv": n * dim * in_chans * patch * patch,
        "linear": depth * per_block["linear"] + dim * num_classes,  # blocks + head on the CLS token
        "attention": depth * per_block["attention"],
        "layer_norm": depth * per_block["layer_norm"] + 5 * t * dim,  # blocks + final norm
    }


def test_flops_of_a_vit_match_the_hand_count_with_attention_counted():
    kw = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model = timm.create_model("vit_n_ape", **kw)
    x = torch.randn(1, 3, 32, 32)
    hand = vit_flops_by_hand(32, 8, 32, 2, 10)
    ops = count_flops(model, x)
    assert sum(ops.values()) == sum(hand.values())
    assert ops["scaled_dot_product_attention"] == hand["attention"] == 2 * 2 * 17 * 17 * 32
    assert ops["linear"] == hand["linear"] and ops["conv"] == hand["conv"]
    with attn_backend("math"):  # explicit matmuls count the same
        assert sum(count_flops(model, x).values()) == sum(ops.values())


def test_swin_flops_match_timms_and_count_at_padded_sizes():
    # fvcore traces with torch.jit, whose sizes are tensors: the window plan's padding test must still decide
    ours = timm.create_model("swin_t_rpb", depths=(2, 2, 2, 2))
    ref = timm.create_model("swin_tiny_patch4_window7_224", depths=(2, 2, 2, 2))
    x = torch.randn(1, 3, 224, 224)
    assert sum(count_flops(ours, x).values()) == sum(count_flops(ref, x).values())  # sdpa there, matmuls in timm's
    small, padded = (sum(count_flops(ours, torch.randn(1, 3, s, s)).values()) for s in (224 - 32, 224 - 24))
    assert 0 < small < padded  # both sizes pad their maps to whole windows


def test_ours_and_timms_vit_measured_in_one_run():
    assert timm_equivalent("vit_s_ape")[0] == "vit_small_patch16_224"
    assert timm_equivalent("swin_t_rpb")[0] == "swin_tiny_patch4_window7_224"
    assert timm_equivalent("cvt_13") is None
    rows = measure(["vit_t_ape"], [32], batch=1, rounds=1, steps=1, train=False, memory=False, log=lambda *a: None)
    by = {r.model: r for r in rows}
    assert by["vit_t_ape"].reference == "vit_tiny_patch16_224"
    # integer flop counts (exact in float64) / 1e9: equal to ~1 ulp; a missing layer is off by > 1 %
    assert by["vit_t_ape"].gflops == pytest.approx(by["vit_tiny_patch16_224"].gflops)
    assert by["vit_t_ape"].gflops == pytest.approx(sum(vit_flops_by_hand(32, 16, 192, 12, 1000).values()) / 1e9)
    assert all(r.infer_ips > 0 for r in rows)


# ----------------------------------------------------------------------------------------- speed: clock and ratios


class _StepClock:
    """A clock that advances only when a task says so: exact, machine-independent rates."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_interleaved_rounds_give_paired_ratios_and_their_spread():
    clock = _StepClock()

    def task(cost: float):
        def run() -> int:
            clock.t += cost
            return 2  # items per call

        return run

    rates = interleave({"fast": task(1.0), "slow": task(4.0)}, clock, rounds=5, steps=3)
    assert rates["fast"] == [2.0] * 5 and rates["slow"] == [0.5] * 5  # 6 items in 3 (resp. 12) time units
    assert paired_ratios(rates, "fast")["slow"] == [0.25] * 5
    s = spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.min, s.max) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert s.text() == "3.00 [2.00-4.00]" and spread([1.0, 3.0]).text() == "2.00 [1.00-3.00]"
    with pytest.raises(ValueError, match="baseline 'nope' was not measured"):
        paired_ratios(rates, "nope")
    with pytest.raises(ValueError, match="use the 'wall' clock"):
        Clock("cpu", "cuda")


def test_speed_covers_video_lengths_against_a_baseline_in_one_run():
    rows = measure(
        ["vivit_n_ape", "vivit_n_rope3d"],
        [32],
        batch=1,
        rounds=2,
        steps=1,
        train=False,
        memory=False,
        flops=False,
        frames=[2, 4],
        baseline="vivit_n_ape",
        log=lambda *a: None,
    )
    by = {(r.model, r.frames): r for r in rows}
    assert set(by) == {(m, f) for m in ("vivit_n_ape", "vivit_n_rope3d") for f in (2, 4)}
    assert by["vivit_n_ape", 4].tokens == 2 * by["vivit_n_ape", 2].tokens  # tubelets along time double
    assert all(r.baseline == "vivit_n_ape" for r in rows)
    assert by["vivit_n_ape", 2].infer_vs_base["median"] == 1.0  # the baseline against itself, round by round
    model = timm.create_model("vivit_n_ape")
    small, large = (saved_activation_mb(model, example_input("vivit_n_ape", 32, 1, f)) for f in (2, 4))
    assert large > 1.5 * small  # activations grow about linearly with the clip length


def test_speed_command_rejects_bad_models_and_sizes(capsys):
    with pytest.raises(SystemExit):
        bench_main(["speed", "--models", "zzz_*"])
    assert "matches no registered visionpe model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["speed", "--models", "vit_n_ape", "--resolutions", "0"])
    assert "--resolutions: takes whole numbers above 0, got '0'" in capsys.readouterr().err
    assert bench_main(["speed", "--data", "no-such-set", "--models", "vit_n_ape"]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert "unknown dataset 'no-such-set'" in err and "Traceback" not in err
    got = expand_models(["vit_n_rope2d*", "vit_n_rope2d"])  # a glob in name order, a repeated name once
    assert got == sorted(set(got)) and {"vit_n_rope2d", "vit_n_rope2d_ape", "vit_n_rope2d_mixed"} <= set(got)
    assert all(n.startswith("vit_n_rope2d") for n in got)


def test_speed_data_measures_any_image_dataset_at_the_given_sizes(tmp_path, capsys):
    out = tmp_path / "data"
    args = ["speed", "--data", "synthetic-shapes", "--models", "vit_n_ape", "--batch", "8", "--rounds", "1"]
    args += ["--steps", "1", "--workers", "0", "--out", str(out)]
    assert bench_main([*args, "--data-options", "num_train=24", "--resolutions", "16", "24"]) == 0
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["images"] == 24 and result["options"] == {"num_train": 24}  # the option reached the dataset
    tasks = {r["task"]: r for r in result["rows"]}
    assert set(tasks) == {
        "loader 16px, 0 worker(s)",
        "loader sizes 16/24, 0 worker(s)",
        "step vit_n_ape",
        "loop vit_n_ape, 0 worker(s)",
    }
    assert tasks["step vit_n_ape"]["vs_base"]["median"] == 1.0  # the baseline against itself
    assert all(r["ips"]["median"] > 0 for r in tasks.values())
    assert "synthetic-shapes (num_train=24)" in out.with_suffix(".md").read_text()
    capsys.readouterr()
    # bad input: one line naming the fix, no traceback
    assert bench_main([*args]) == 2  # a generated dataset has no size of its own
    assert "give the size to measure 'synthetic-shapes' at with --resolutions" in capsys.readouterr().err
    assert bench_main([*args, "--resolutions", "16", "--data-options", "num_items=3"]) == 2
    assert "does not take option(s) ['num_items']" in capsys.readouterr().err
    assert bench_main([*args[:2], "video-shapes", *args[3:], "--resolutions", "16"]) == 2
    assert "--data measures image datasets; 'video-shapes' is a video dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main([*args, "--resolutions", "16", "--data-options", "num_train"])
    assert "--data-options takes KEY=VALUE words, got 'num_train'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- gpu-check


def test_gpu_check_on_cpu_compares_sdpa_with_math_and_says_what_it_skipped(tmp_path, capsys):
    assert bench_main(["gpu-check", "--out", str(tmp_path / "g")]) == 0
    result = json.loads((tmp_path / "g.json").read_text())
    assert {r["backend"] for r in result["agreement"]} == {"sdpa"}
    assert {r["model"] for r in result["agreement"]} == set(gpu_check.AGREEMENT_MODELS.values())
    assert all(r["ok"] and r["rel_err"] <= r["tol"] for r in result["agreement"])
    assert result["throughput"] == [] and any("no CUDA device" in s for s in result["skipped"])
    assert result["masked"] == result["native"] == [] and any("masked attention" in s for s in result["skipped"])
    assert "| bias (Swin RPB + shift mask) | swin_n_rpb | float32 | sdpa |" in (tmp_path / "g.md").read_text()


def _fake_xformers(monkeypatch, calls: list):
    """An `xformers` package whose kernel is plain attention on [B, M, H, K] tensors (counts its calls)."""
    ops = types.ModuleType("xformers.ops")

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None):
        calls.append(q.shape)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn = (q * scale) @ k.transpose(-2, -1) + (0 if attn_bias is None else attn_bias.to(q.dtype))
        return (attn.softmax(-1) @ v).transpose(1, 2)

    class BlockDiagonalMask:  # stands in for fmha's: here the dense additive mask of the segments
        @staticmethod
        def from_seqlens(seqlens):
            ids = torch.repeat_interleave(torch.arange(len(seqlens)), torch.tensor(seqlens))
            return torch.zeros(len(ids), len(ids)).masked_fill(ids[:, None] != ids[None, :], float("-inf"))

    ops.memory_efficient_attention = memory_efficient_attention
    ops.fmha = types.SimpleNamespace(BlockDiagonalMask=BlockDiagonalMask)
    pkg = types.ModuleType("xformers")
    pkg.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", pkg)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)


def test_gpu_check_cuda_branches_run_with_a_mocked_gpu(monkeypatch):
    calls: list = []
    _fake_xformers(monkeypatch, calls)
    allocated = iter(range(0, 10**9, 2**20))  # every reading 1 MiB more: the probe must subtract its base
    real_flex, cuda_is_available = visionpe.attention.backends.flex_attend, torch.cuda.is_available

    def flex_attend(*args):  # the real flex attention (eager on CPU); dynamo inside it must see no CUDA
        with monkeypatch.context() as m:
            m.setattr(torch.cuda, "is_available", cuda_is_available)
            return real_flex(*args)

    monkeypatch.setattr(visionpe.attention.backends, "flex_attend", flex_attend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Mock GPU")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: next(allocated) + 5 * 2**20)
    monkeypatch.setattr(gpu_check.checks, "xformers_status", lambda: dict(torch="t", cuda="c", usable=True, reason=""))
    monkeypatch.setattr(visionpe.attention.backends, "xformers_supports", lambda q, bias: (True, ""))
    shape = dict(rows=2, length=48, images_per_row=3, heads=2, head_dim=8, reps=1)
    tiny = lambda name: create_model(name, **family_of(name).tiny)
    result = gpu_check.run_check("cpu", "vit_n_ape", (32,), 1, "vit_n_rope2d_mixed", tiny, shape)
    assert result["gpu"] == "Mock GPU" and result["backends"] == ["sdpa", "xformers"]
    got = {(r["model"], r["dtype"], r["backend"]) for r in result["agreement"]}
    assert got == {
        (m, d, b)
        for m in gpu_check.AGREEMENT_MODELS.values()
        for d in ("float32", "bfloat16")
        for b in ("sdpa", "xformers")
    }
    assert calls and all(r["ok"] for r in result["agreement"]), [r for r in result["agreement"] if not r["ok"]]
    assert [r["backend"] for r in result["throughput"]] == ["math", "sdpa", "xformers"]
    assert all(r["peak_mb"] == 6.0 and r["vs"] == "sdpa" for r in result["throughput"])  # 1 MiB step + 5 MiB peak
    md = gpu_check.format_markdown(result)
    assert "| vit_n_ape | 32 | xformers |" in md
    # native-resolution batches: a masked-attention line and a packed-model line per backend, all within tolerance
    masked = ["flex", "xformers", "sdpa"]
    assert [r["backend"] for r in result["masked"]] == [r["backend"] for r in result["native"]] == masked
    for r in result["masked"]:  # the math reference is float64 on CPU: fp32 agrees to ~1e-7, bf16 to ~1e-2
        assert r["ok"] and r["fp32_max_rel_err"] < 1e-5 and 0 < r["bf16_max_rel_err"] <= 3e-2, r
        assert r["images"] == 6 and r["fp32_images_per_s"] > 0 and r["bf16_images_per_s"] > 0
    for r in result["native"]:
        assert r["ok"] and r["fp32_max_rel_err"] < 1e-5 and r["images"] == 8, r
    assert "| xformers (block-diagonal) | " in md and "vit_n_rope2d_mixed on a packed batch" in md
    assert result["ok"]


def test_gpu_check_reports_a_failing_masked_backend_and_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no triton")

    monkeypatch.setattr(gpu_check.checks, "check_masked_backend", broken)
    rows = gpu_check.masked_attention(["flex", "sdpa"], "cpu")
    assert [r["ok"] for r in rows] == [False, False] and rows[0]["error"] == "RuntimeError: no triton"
    assert "| flex (block mask) | RuntimeError: no triton | - | False |" in "\n".join(gpu_check.format_native(rows, []))


def test_gpu_check_reports_an_xformers_build_for_another_torch(monkeypatch):
    _fake_xformers(monkeypatch, [])  # imports, but has no compiled `xformers._C`
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.34")
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: ["numpy", "torch==2.10.0"])
    status = xformers_status()
    assert status["xformers"] == "0.0.34" and status["xformers_requires_torch"] == "==2.10.0"
    assert status["ops_import"] and not status["compiled_ops"] and not status["usable"]
    assert "compiled ops do not load with torch" in status["reason"]


def test_cpu_memory_probe_runs_with_a_fixed_mmap_threshold(monkeypatch):
    # glibc's default threshold grows after large frees, and the resident set then keeps freed heap blocks (ViT-B
    # 1024 px iRPE read 463 MiB that way against 188 MiB live): the probe process must get the fixed threshold
    from visionpe.bench.perf import measure as memprobe

    seen = {}

    def fake_run(cmd, capture_output, text, env):
        seen.update(cmd=cmd, env=env)
        return types.SimpleNamespace(returncode=0, stdout="12.5\n", stderr="")

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(memprobe.subprocess, "run", fake_run)
    assert memprobe.peak_memory_mb("vit_n_ape", 32) == 12.5
    assert seen["env"]["MALLOC_MMAP_THRESHOLD_"] == str(256 * 1024)
    assert json.loads(seen["cmd"][-1])["name"] == "vit_n_ape"
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # a user's own setting is kept
    memprobe.peak_memory_mb("vit_n_ape", 32)
    assert seen["env"]["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_growth_fit_recovers_the_exponents_of_time_and_memory():
    """Rows whose time per item grows as N^1.5 and memory as N^2 (exact powers) give those exponents back; a model
    measured at one token count gets no fit."""
    from visionpe.bench.perf.speed_report import SpeedRow, format_markdown, scaling

    rows = [
        SpeedRow("m", r, tokens=n, infer_ips=1e6 / n**1.5, infer_mem_mb=n**2 / 1e3)
        for r, n in ((224, 196), (448, 784), (896, 3136))
    ]
    rows.append(SpeedRow("single", 224, tokens=196, infer_ips=1.0, infer_mem_mb=1.0))
    fit = scaling(rows)
    assert set(fit) == {"m"}
    assert fit["m"]["tokens"] == [196, 3136]
    assert abs(fit["m"]["time_exp"] - 1.5) < 1e-9 and abs(fit["m"]["memory_exp"] - 2.0) < 1e-9  # exact data: fp64 fit
    machine = dict(date="d", cpu="cpu", cores=2, threads=1, torch="t", timm="t")
    text = format_markdown(rows, machine, dict(rounds=5, batch=1, steps=2, clock="cpu"))
    assert "| m | 196 -> 3136 | 1.50 | 2.00 | - |" in text
