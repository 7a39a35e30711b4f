"""train.strategy=fsdp: FSDP2 against DDP on 2 gloo ranks (fp32), meta-device construction, activation checkpointing,
sharded checkpoints (round trip, a kill at each write phase then a bit-identical resume, another world size refused),
evaluation and export of a sharded run."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file
from tiny_runs import group_of_one, tiny_run
from torch import nn
from torch.distributed.checkpoint import filesystem

from visionpe.attention.backends import attn_backend
from visionpe.engine import CheckpointError, ConfigError, evaluate_checkpoint, load_config, train
from visionpe.engine import checkpoint as sc  # the write counter of the fault points
from visionpe.engine.checkpoint import KILL_AT_ENV, load_weights
from visionpe.engine.cli import train_main
from visionpe.engine.distributed import DistContext
from visionpe.engine.export import export_main
from visionpe.engine.fsdp import build_sharded_model, check_strategy, full_state_dict, sharding_units
from visionpe.engine.trainer import CorruptCheckpointWarning, Trainer
from visionpe.layout.batch import pack_images

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
COMPARED = (
    "vit_n_rope2d_mixed",
    "vit_n_irpe",
    "vit_n_cpe",
    "vit_n_lepe",
    "vit_n_liere",
    "swin_n_rpb",
    "swin_n_lepe",
    "cvt_n_cpe",
    "cvt_n_rope2d_mixed",
)
STEPS, LR = 3, 1e-3  # as in fsdp_worker.py


def torchrun(args: list[str], cwd: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, **(extra_env or {})}
    return subprocess.run([*TORCHRUN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# ------------------------------------------------------------------------------------------------ FSDP against DDP


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_vs_ddp")
    proc = torchrun([str(REPO / "tests" / "fsdp_worker.py"), str(out), *COMPARED], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", COMPARED)
def test_fsdp_gives_ddps_losses_and_parameters(compared, name):
    losses = json.loads((compared / "results.json").read_text())[name]
    ddp, start = load_file(compared / f"{name}-ddp.safetensors"), load_file(compared / f"{name}-start.safetensors")
    # parameters (BatchNorm running statistics aside: a recomputed forward updates them twice, with or without fsdp)
    params = [k for k, v in ddp.items() if v.is_floating_point() and "running_" not in k]
    for variant in ("fsdp", "fsdp_ac"):
        # fp32, the same sums in another order: the losses agree to fp32 rounding
        assert losses[variant] == pytest.approx(losses["ddp"], rel=1e-5, abs=1e-6)
        got = load_file(compared / f"{name}-{variant}.safetensors")
        assert set(got) == set(ddp)
        # AdamW's step m / sqrt(v) is scale-free: a rounding-level change in a near-zero gradient can move that
        # element by a fraction of lr per step, so 1% of the largest possible movement (lr x steps) is allowed
        for k in params:
            assert torch.allclose(got[k], ddp[k], rtol=0, atol=0.01 * LR * STEPS), (variant, k)
    moved = max(float((ddp[k] - start[k]).abs().max()) for k in params)
    assert moved > 0.5 * LR * STEPS  # the steps did train


# ------------------------------------------------------------------------------------------------- construction


NANO = sorted(n for n in timm.list_models("*_n_*") if n.split("_")[0] in ("vit", "swin", "cvt", "vivit", "mm"))


def _one_rank() -> DistContext:
    return DistContext(0, 1, 0, torch.device("cpu"))


@pytest.mark.parametrize("name", NANO)
def test_meta_construction_matches_normal_construction(name):
    """Built on meta, sharded and initialised: constants (norms, biases, zero tokens) as built normally, drawn
    tensors with the same spread, buffers equal; with the normal model's weights loaded, the same logits."""
    cfg = load_config(None, [f"model.name={name}", "data.resolution=32", "train.amp=none"])
    torch.manual_seed(1)
    other = timm.create_model(name, num_classes=10, img_size=32).state_dict()  # what a seed changes is drawn
    torch.manual_seed(0)
    normal = timm.create_model(name, num_classes=10, img_size=32).eval()
    sharded = build_sharded_model(cfg, 10, 3, _one_rank(), None).eval()
    got, want = full_state_dict(sharded), normal.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        w = got[k]
        assert torch.isfinite(w).all(), k
        if torch.equal(v, other[k]):  # a constant (norms, zero biases, fixed tables): the same value
            assert torch.equal(w, v), k
        elif v.numel() >= 2048:  # the sample std of n draws is within 5 / sqrt(2n) of the true one
            assert abs(float(w.std() / v.std()) - 1) < 5 / (2 * v.numel()) ** 0.5 + 1e-3, k
    for (k, b), (_, b2) in zip(normal.named_buffers(), sharded.named_buffers()):
        assert torch.equal(b, b2), k
    sharded_loaded = build_sharded_model(cfg, 10, 3, _one_rank(), None).eval()
    with torch.no_grad():
        for k, v in sharded_loaded.state_dict().items():
            v.to_local().copy_(want[k]) if hasattr(v, "to_local") else v.copy_(want[k])
        x = _inputs(name)
        torch.testing.assert_close(_call(sharded_loaded, x), _call(normal, x), rtol=1e-5, atol=1e-5)


def _inputs(name: str):
    torch.manual_seed(1)
    if name.startswith("vivit"):
        return torch.randn(2, 3, 4, 32, 32)
    if name.startswith("mm"):
        return {"pixels": torch.randn(2, 3, 32, 32), "text_ids": torch.randint(0, 512, (2, 5))}
    return torch.randn(2, 3, 32, 32)


def _call(model, x):
    with torch.no_grad():
        return model(**x) if isinstance(x, dict) else model(x)


# ---------------------------------------------------------------------------------------------- sharding groups


def _group_names(model: nn.Module, unit: nn.Module) -> set[str]:
    """The parameter names FSDP holds in unit's group."""
    held = {id(fp.sharded_param) for fp in unit._get_fsdp_state()._fsdp_param_group.fsdp_params}
    return {n for n, p in model.named_parameters() if id(p) in held}


def _sharded_copy(name: str) -> tuple[nn.Module, nn.Module]:
    """(a model built normally, the same weights in a sharded model on one rank)."""
    cfg = load_config(
        None, [f"model.name={name}", "data.resolution=32", "train.amp=none", "model.kwargs.drop_path_rate=0"]
    )
    torch.manual_seed(0)
    normal = timm.create_model(name, num_classes=10, img_size=32, drop_path_rate=0.0)
    sharded = build_sharded_model(cfg, 10, 3, _one_rank(), None)
    with torch.no_grad():
        for k, v in sharded.state_dict().items():
            v.to_local().copy_(normal.state_dict()[k]) if hasattr(v, "to_local") else v.copy_(normal.state_dict()[k])
    return normal, sharded


# the PE parameters of layer i (under its block's names): they shard with block i
PER_LAYER = {
    "vit_n_lepe": ("attn.pos.lepe.weight", "attn.pos.lepe.bias"),
    "swin_n_lepe": ("attn.pos.lepe.weight", "attn.pos.lepe.bias"),
    "vit_n_irpe": ("attn.pos.irpe.k",),  # read by context()
    "vit_n_cpe": ("attn.pos.cpe.weight", "attn.pos.cpe.bias"),  # site 'block', layer 0 only
    "swin_n_rpb": ("attn.pos.irpe.bias_k",),
    "vit_n_liere": ("attn.pos.lie_rope.generators",),
    "cvt_n_rope2d_mixed": ("attn.pos.rope2d.freqs",),
}


@pytest.mark.parametrize("name", PER_LAYER)
def test_per_layer_pe_parameters_shard_with_their_block(name):
    """Block i's group holds block i's parameters, its layer's PE parameters among them, nothing else; the root
    holds the model-level PE; each group is freed before the next block starts; the gradients are the unsharded
    model's, for one grid and for a native batch of three grids (ViT: site 'block' runs per grid)."""
    normal, model = _sharded_copy(name)
    units = sharding_units(model)
    pe_names = {n for n, _ in model.named_parameters() if n.startswith("pe.")}
    layer_pe = 0
    for i, unit in enumerate(units):
        block = {n for n, p in model.named_parameters() if any(p is q for q in unit.parameters())}
        assert _group_names(model, unit) == block, i
        layer_pe += sum(any(n.endswith(k) for k in PER_LAYER[name]) for n in block)
    assert layer_pe >= 2  # the blocks do hold per-layer PE parameters
    assert {n for n in _group_names(model, model) if n.startswith("pe.")} == pe_names
    freed = []
    for i, unit in enumerate(units[1:], 1):
        state = units[i - 1]._get_fsdp_state()
        unit.register_forward_pre_hook(lambda *_, s=state: freed.append(s._fsdp_param_group.is_sharded))
    torch.manual_seed(1)
    images = [torch.randn(3, 32, 32), torch.randn(3, 16, 24), torch.randn(3, 24, 16)]
    for x in (torch.stack([images[0]] * 2), pack_images(images, 4)) if name.startswith("vit") else (images[0][None],):
        y = torch.arange(len(images) if isinstance(x, dict) else x.shape[0])
        for m in (normal, model):
            m.zero_grad()
            with attn_backend("sdpa"):
                nn.functional.cross_entropy(_call_train(m, x), y).backward()
        got = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        for n, p in normal.named_parameters():  # the same arithmetic, gathered
            torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-6)
    assert freed and all(freed)


@pytest.mark.parametrize("name", ["vit_n_irpe", "swin_n_rpb", "cvt_n_rope2d_mixed"])
def test_forward_intermediates_of_a_sharded_model(name):
    """Per-block (ViT) and per-stage (Swin, CvT) features of the sharded model are the normal model's."""
    normal, model = _sharded_copy(name)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), attn_backend("sdpa"):
        want = normal.eval().forward_intermediates(x, intermediates_only=True)
        got = model.eval().forward_intermediates(x, intermediates_only=True)
    assert len(got) == len(want) >= 3
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_model_level_pe_parameters_stay_with_the_root():
    _, model = _sharded_copy("vit_n_rope2d_mixed_ape")  # APE's table at the root, RoPE-Mixed's per layer
    root = _group_names(model, model)
    assert "pe.encodings.ape.pos_embed" in root and not any(".attn.pos." in n for n in root)
    assert "blocks.1.attn.pos.rope2d.freqs" in _group_names(model, sharding_units(model)[1])
    _, model = _sharded_copy("vit_n_fire2d")  # one MLP for every layer of its stage
    assert {n for n, _ in model.named_parameters() if n.startswith("pe.")} <= _group_names(model, model)


def _call_train(model, x):
    model.train()
    return model(x)


# ------------------------------------------------------------------------------------------ activation checkpointing


@pytest.mark.parametrize("name", ["vit_n_rope2d_mixed", "swin_n_rpb", "cvt_n_cpe"])
def test_activation_checkpointing_gives_the_same_gradients(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, img_size=32, drop_path_rate=0.0).train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    grads = []
    for on in (False, True):
        model.set_grad_checkpointing(on)
        model.zero_grad()
        with attn_backend("sdpa"):
            nn.functional.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, g in grads[0].items():  # the recomputed forward is the same arithmetic
        torch.testing.assert_close(grads[1][n], g, rtol=1e-5, atol=1e-7)


# -------------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.strategy=zero"], "train.strategy must be one of ddp, fsdp"),
        (["train.strategy=fsdp", "train.amp=fp16"], "use train.amp=bf16"),
        (
            ["train.strategy=fsdp", "train.fsdp.reshard=false"],
            "unknown config key train.fsdp.reshard; did you mean train.fsdp.reshard_after_forward",
        ),
        (["train.strategy=fsdp", "train.fsdp.reshard_after_forward=2"], "expects bool"),
        (["train.fsdp.reshard_after_forward=false"], "applies to train.strategy=fsdp"),
        (["train.strategy=fsdp", "optim.clip_grad=1", "optim.clip_mode=agc"], "use norm or value"),
    ],
)
def test_bad_strategy_settings_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_strategy(load_config(None, overrides))


# --------------------------------------------------------------------------------------------- sharded checkpoints


def tiny(out: Path, *extra: str) -> list[str]:
    data = ["data.options.num_train=64", "data.options.num_val=16", "data.batch_size=16"]
    fsdp = ["train.strategy=fsdp", "train.ema=true", "optim.clip_grad=1.0", "train.ckpt_every_steps=2"]
    return tiny_run(out, data, "eval.resolutions=16", "model.name=vit_n_rope2d_mixed", *fsdp, *extra)


def run(overrides: list[str], **kwargs) -> Path:
    with attn_backend("sdpa"):
        return train(None, overrides, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[str], Path]:
    out = tmp_path_factory.mktemp("fsdp_ref")
    common = tiny(out, "model.kwargs.drop_path_rate=0.1", "aug.mixup=0.4")
    return common, run([*common, "train.run_name=reference"])


def exported(run_dir: Path, out: Path, ema: bool = False) -> dict[str, torch.Tensor]:
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out), *(["--ema"] if ema else [])]) == 0
    return load_weights(out)[0]


def test_a_sharded_run_evaluates_and_exports_what_it_trained(reference, tmp_path):
    _, run_dir = reference
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    assert pointer["sharded"] == "checkpoints/e0002-b000000.dcp" and pointer["world_size"] == 1
    assert len(list((run_dir / "checkpoints").iterdir())) == 2  # keep_checkpoints=2, older ones pruned
    results = json.loads((run_dir / "results.json").read_text())
    with attn_backend("sdpa"):
        rows = evaluate_checkpoint(run_dir, ctx=_one_rank())
    assert rows[0]["loss"] == pytest.approx(results[0]["loss"], rel=1e-6)  # the run's own final evaluation
    weights = exported(run_dir, tmp_path / "w.safetensors")
    meta = load_weights(tmp_path / "w.safetensors")[1]
    assert meta["model"] == "vit_n_rope2d_mixed" and "world_size" not in meta
    with attn_backend("sdpa"):
        again = evaluate_checkpoint(tmp_path / "w.safetensors", ctx=_one_rank())
    assert again[0]["loss"] == pytest.approx(rows[0]["loss"], rel=1e-6)
    ema = exported(run_dir, tmp_path / "ema.safetensors", ema=True)
    assert any(not torch.equal(ema[k], weights[k]) for k in weights)
    overlay = dict(file=str(tmp_path / "w.safetensors"), num_classes=16)  # its head too (timm drops other heads)
    kwargs = dict(pretrained=True, pretrained_cfg_overlay=overlay)
    model = timm.create_model("vit_n_rope2d_mixed", num_classes=16, img_size=16, depth=1, embed_dim=32, num_heads=2,
                              **kwargs)  # fmt: skip
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def _train_then_die(overrides: list[str], phase: str) -> None:
    os.environ[KILL_AT_ENV] = f"{phase},3"  # the 3rd write (step 6 of 8) prunes the 1st: every phase is reached
    sc._writes = 0
    run(overrides)


@pytest.mark.parametrize("phase", ["sharded-tmp", "sharded", "pointer", "pruned"])
def test_kill_at_each_sharded_write_phase_then_resume_is_bit_identical(tmp_path, reference, phase):
    common, ref_dir = reference
    args = [*common, f"train.output_dir={tmp_path}", "train.run_name=killed"]
    # spawn, not fork: the parent has run autograd
    child = multiprocessing.get_context("spawn").Process(target=_train_then_die, args=(args, phase))
    child.start()
    child.join(120)
    assert child.exitcode == -9
    partial = list((tmp_path / "killed" / "checkpoints").glob(".partial-*"))
    assert bool(partial) == (phase == "sharded-tmp")  # killed before the rename: the pointer never saw it
    run(args, resume=True)
    assert not list((tmp_path / "killed" / "checkpoints").glob(".partial-*"))
    for ema in (False, True):
        want = exported(ref_dir, tmp_path / f"want{ema}.safetensors", ema)
        got = exported(tmp_path / "killed", tmp_path / f"got{ema}.safetensors", ema)
        assert all(torch.equal(got[k], v) for k, v in want.items())  # same data, RNG and arithmetic


def test_resuming_with_another_world_size_or_strategy_is_refused(reference, capsys):
    common, run_dir = reference
    cfg = load_config(None, [*common, "train.run_name=reference"])
    with group_of_one(), pytest.raises(CheckpointError, match="by 1 processes, this run has 2: resume with one"):
        Trainer(cfg, DistContext(0, 2, 0, torch.device("cpu")), resume=True)  # refused before any collective
    assert train_main(["--resume", str(run_dir), "train.strategy=ddp"]) == 2
    assert "trained with train.strategy=fsdp" in capsys.readouterr().err


def test_resume_falls_back_from_unreadable_sharded_checkpoints_with_a_warning(reference, tmp_path):
    common, ref_dir = reference
    run_dir = tmp_path / "c"
    shutil.copytree(ref_dir, run_dir)
    args = [*common, f"train.output_dir={tmp_path}", "train.run_name=c"]
    history = json.loads((run_dir / "checkpoint.json").read_text())["history"]
    newest, older = (run_dir / "checkpoints" / f"{t}.dcp" for t in history[::-1])
    for shard in newest.glob("*.distcp"):  # the shards: a torch.save zip per tensor
        shard.write_bytes(shard.read_bytes()[:64])
    with pytest.warns(CorruptCheckpointWarning, match=f"unreadable .*cannot read .*; resuming from .*{older.name}"):
        run(args, resume=True)  # the last 2 steps are trained again, exactly
    for ema in (False, True):
        want = exported(ref_dir, tmp_path / f"want{ema}.safetensors", ema)
        got = exported(run_dir, tmp_path / f"got{ema}.safetensors", ema)
        assert all(torch.equal(got[k], v) for k, v in want.items())
    (newest / ".metadata").unlink()  # an incomplete write
    with pytest.warns(CorruptCheckpointWarning, match=f"no DCP .metadata file.*resuming from .*{older.name}"):
        run(args, resume=True)


def test_disk_full_during_a_sharded_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    real = filesystem._write_item

    def fills_up(*args, **kwargs):
        if sc._writes > 1:  # the first checkpoint fits, the second does not
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(filesystem, "_write_item", fills_up)
    monkeypatch.setattr(sc, "_writes", 0)
    with attn_backend("sdpa"):
        assert train_main(tiny(tmp_path, "train.run_name=full")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("(set VISIONPE_DEBUG=1"), err
    assert err[0].startswith(f"error: disk full while writing checkpoint {tmp_path / 'full' / 'checkpoints'}")
    assert "e0000-b000002.dcp is intact (checkpoint.json still points to it)" in err[0]
    assert json.loads((tmp_path / "full" / "checkpoint.json").read_text())["global_step"] == 2
    assert not list((tmp_path / "full" / "checkpoints").glob(".partial-*"))  # the partial write is removed


@pytest.mark.slow  # three 2-process runs (~1 min on 2 busy cores); the 1-process tests above cover each piece
def test_two_ranks_killed_then_resumed_is_bit_identical(tmp_path):
    args = [str(REPO / "train.py"), *tiny(tmp_path)]
    assert torchrun([*args, "train.run_name=ref"], tmp_path).returncode == 0
    killed = torchrun([*args, "train.run_name=killed"], tmp_path, {KILL_AT_ENV: "sharded-tmp,2"})
    assert killed.returncode != 0
    pointer = json.loads((tmp_path / "killed" / "checkpoint.json").read_text())
    assert pointer["global_step"] == 2 and pointer["world_size"] == 2
    resumed = torchrun([*args, "train.run_name=killed", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for ema in (False, True):
        want = exported(tmp_path / "ref", tmp_path / f"want{ema}.safetensors", ema)
        got = exported(tmp_path / "killed", tmp_path / f"got{ema}.safetensors", ema)
        assert all(torch.equal(got[k], v) for k, v in want.items())
