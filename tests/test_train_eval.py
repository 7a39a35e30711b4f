"""train.py / eval.py end to end on generated data: results, exact resume after a kill, DDP, bad input."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from tiny_runs import tiny_run

from visionpe.attention.backends import attn_backend
from visionpe.engine import (
    CheckpointError,
    ConfigError,
    evaluate_checkpoint,
    evaluate_model,
    load_checkpoint,
    load_config,
    train,
)
from visionpe.engine.checkpoint import find_checkpoint, load_weights, write_checkpoint
from visionpe.engine.cli import eval_main, train_main
from visionpe.engine.config import config_keys, format_config_help
from visionpe.engine.trainer import SkippedImagesWarning

REPO = Path(__file__).resolve().parents[1]


def tiny(out: Path, *extra: str) -> list[str]:
    """Overrides for a run of a few seconds: a one-block 32-wide ViT on 16 px synthetic shapes."""
    data = ["data.name=synthetic-shapes", "data.options.num_train=64", "data.options.num_val=32", "data.batch_size=16"]
    return tiny_run(out, data, "train.run_name=run", "eval.resolutions=16,24", *extra)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_weights(find_checkpoint(run_dir).weights)[0]


def run_train(overrides: list[str], **kwargs) -> Path:
    with attn_backend("sdpa"):  # the same kernels in every process of a comparison
        return train(None, overrides, **kwargs)


# ------------------------------------------------------------------------------------------------------ end to end


def test_train_then_eval_end_to_end(tmp_path, capsys):
    run = run_train(tiny(tmp_path, "data.train_resolutions=16,24", "train.ema=true"))
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "metrics.jsonl", "checkpoint.json", "results.json"}
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["name"] == "vit_n_ape" and saved["model"]["img_size"] == 16  # the resolved config
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [ln for ln in lines if ln["kind"] == "eval"]
    assert len(evals) == 2 * 2 * 2  # epochs x resolutions x (model, EMA)
    assert {ln["resolution"] for ln in lines if ln["kind"] == "train"} <= {16, 24}
    pointer = json.loads((run / "checkpoint.json").read_text())
    assert pointer["finished"] and pointer["epoch"] == 2 and pointer["global_step"] == 8
    assert (run / pointer["ema"]).is_file()

    out = capsys.readouterr().out
    assert "resolution    top1" in out  # the final table

    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    assert eval_main(["--checkpoint", str(run), "--resolutions", "16,20,32", "--json", str(js), "--csv", str(cs)]) == 0
    rows = json.loads(js.read_text())
    assert [r["resolution"] for r in rows] == [16, 20, 32]
    for r in rows:
        assert set(r) == {"resolution", "top1", "top5", "loss", "images"}
        assert r["images"] == 32 and 0 <= r["top1"] <= r["top5"] <= 100 and r["loss"] > 0
    with open(cs) as f:
        assert list(csv.DictReader(f))[2]["resolution"] == "32"
    # eval of the run's final checkpoint reproduces the numbers training logged (same weights and batches; approx's
    # rel 1e-6, ~8 fp32 eps, leaves room only for another summation order of the loss over 32 images)
    final = {r["resolution"]: r for r in json.loads((run / "results.json").read_text())}
    assert rows[0]["top1"] == pytest.approx(final[16]["top1"]) and rows[0]["loss"] == pytest.approx(final[16]["loss"])
    assert "resolution    top1" in capsys.readouterr().out
    ema_rows = evaluate_checkpoint(run, [16], ema=True)
    assert ema_rows[0]["images"] == 32
    model, cfg, meta = load_checkpoint(run)  # the programmatic path the benchmarks use
    again = evaluate_model(model, cfg, [16])[0]
    assert meta["model"] == "vit_n_ape" and again["skipped"] == 0 and {k: again[k] for k in rows[0]} == rows[0]


def test_training_learns(tmp_path):
    """100 steps on 32 images: the model must fit its training set far above chance (1/16; about 75% measured)."""
    run = run_train(
        tiny(
            tmp_path,
            "data.options.num_train=32",
            "data.options.num_val=32",
            "data.val_split=train",
            "data.batch_size=8",
            "train.epochs=25",
            "optim.lr=3e-3",
            "optim.sched=none",
            "optim.weight_decay=0",
            "eval.resolutions=16",
            "eval.every_epochs=25",
            "model.kwargs.embed_dim=64",
        )
    )
    top1 = json.loads((run / "results.json").read_text())[0]["top1"]
    assert top1 >= 50, top1


# ---------------------------------------------------------------------------------------------------------- resume

KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from visionpe.engine import trainer as engine

    kill_at = int(sys.argv[1])
    step = engine.Trainer.step

    def step_then_die(self, net, batch):
        if self.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no final checkpoint: as hard as a kill gets
        return step(self, net, batch)

    engine.Trainer.step = step_then_die
    engine.train(None, sys.argv[2:])
    """
)


def run_killed_at(step: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """A training run in a subprocess, killed with SIGKILL at `step` (KILLER), on this checkout's visionpe (not an
    installed one) with the sdpa backend."""
    repo = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "VISIONPE_ATTN": "sdpa",
        "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run([sys.executable, "-c", KILLER, str(step), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    common = tiny(
        tmp_path,
        "train.epochs=3",
        "train.ckpt_every_steps=3",
        "model.kwargs.drop_path_rate=0.1",
        "aug.mixup=0.4",
        "train.ema=true",
    )  # RNG-dependent parts: drop path and mixup
    reference = run_train([*common, "train.run_name=reference"])

    killed = run_killed_at(7, [*common, "train.run_name=killed"], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    run = tmp_path / "killed"
    assert json.loads((run / "checkpoint.json").read_text())["global_step"] == 6  # mid-epoch 2, step 7 was lost

    with pytest.raises(CheckpointError, match="--resume"):
        run_train([*common, "train.run_name=killed"])  # not resuming a run that exists is refused
    # what the run cost counts its attempts: say the killed attempt had taken 1000 s (200 s of CPU) to step 6
    state_path = find_checkpoint(run).state
    state = torch.load(state_path, weights_only=True)
    torch.save(dict(state, spent=(1000.0, 200.0)), state_path)
    t0, c0 = time.perf_counter(), time.process_time()
    run_train([*common, "train.run_name=killed"], resume=True)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    info = find_checkpoint(run).info
    assert 1000 < info["seconds"] <= 1000 + wall + 0.1 and 200 < info["cpu_seconds"] <= 200 + cpu + 0.1

    for key, value in weights(reference).items():
        assert torch.equal(value, weights(run)[key]), key
    ema_a = load_weights(find_checkpoint(reference).ema)[0]
    ema_b = load_weights(find_checkpoint(run).ema)[0]
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    assert json.loads((reference / "results.json").read_text()) == json.loads((run / "results.json").read_text())
    evals = [[ln for ln in (d / "metrics.jsonl").read_text().splitlines() if '"eval"' in ln] for d in (reference, run)]
    assert len(evals[0]) == 3 * 2 * 2 and evals[0] == evals[1]  # the resumed history: no duplicates, same numbers


def test_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    model = {"w": torch.ones(3)}
    write_checkpoint(tmp_path, "a", model, {"model": "m"}, {"step": 1}, info={"global_step": 1})

    def broken_save(obj, f):
        Path(f).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        write_checkpoint(tmp_path, "b", {"w": torch.zeros(3)}, {"model": "m"}, {"step": 2}, info={"global_step": 2})
    ref = find_checkpoint(tmp_path)
    assert ref.info["global_step"] == 1 and torch.equal(load_weights(ref.weights)[0]["w"], torch.ones(3))
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".tmp" in p.name]


# ------------------------------------------------------------------------------------------------------------- DDP


def test_ddp_two_processes_match_one_process_with_the_global_batch(tmp_path):
    common = tiny(tmp_path, "train.epochs=2", "train.threads=1")
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "train.py"),
        *common,
        "data.batch_size=8",
        "train.run_name=ddp",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("resolution    top1") == 1  # only rank 0 prints
    single = run_train([*common, "data.batch_size=16", "train.run_name=single"])
    ddp = tmp_path / "ddp"
    a, b = weights(single), weights(ddp)
    # DDP sums the gradient over two half batches, one process over the whole batch: the same numbers up to fp32
    # rounding order. AdamW divides by the gradient's RMS, so weights differ by what that rounding does to the
    # normalised steps, at most lr per step and per element (|m_hat / sqrt(v_hat)| <= 1 for a steady gradient; 3.2 =
    # (1 - beta1) / sqrt(1 - beta2) for any gradient sequence). The key bias's true gradient is exactly zero (softmax
    # ignores a constant added to every logit of a query), so its steps are normalised rounding noise: only the
    # worst-case bound holds there. Elsewhere gradients stand far above rounding (relative error ~1e-6) and the
    # weights agree to a 1e-2 fraction of the distance lr * steps any weight can move.
    lr, steps, dim = 1e-3, 2 * 64 // 16, 32  # optim.lr's default; 2 epochs of 64 items in batches of 16; embed_dim
    for k in a:
        diff = (a[k] - b[k]).abs()
        if k.endswith("attn.qkv.bias"):
            assert diff[dim : 2 * dim].max() <= 3.2 * lr * steps, k
            diff = torch.cat([diff[:dim], diff[2 * dim :]])
        assert diff.max() <= 1e-2 * lr * steps, k
    evals = [json.loads(ln) for ln in (ddp / "metrics.jsonl").read_text().splitlines() if '"eval"' in ln]
    assert len(evals) == 2 * 2 and all(r["images"] == 32 for r in evals)  # one writer; all 32 images counted once
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (single, ddp))
    for r, q in zip(ra, rb):  # near-equal weights: at most a near-tie image of the 32 changes its prediction
        assert abs(r["top1"] - q["top1"]) <= 100 / 32 + 1e-9 and r["images"] == q["images"] == 32


# --------------------------------------------------------------------------------------------------- image folders


def test_corrupt_image_in_a_folder_is_skipped_with_one_warning(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(8):
                Image.fromarray(rng.integers(0, 256, (18, 18, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / c / f"{i}.png"
                )
    (tmp_path / "data" / "train" / "a" / "3.png").write_bytes(b"\x89PNG garbage")
    (tmp_path / "data" / "train" / "b" / "5.png").write_bytes(b"")
    (tmp_path / "data" / "val" / "b" / "2.png").write_bytes(b"GIF89a truncated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = run_train(
            tiny(
                tmp_path,
                "data.name=imagefolder",
                "data.options={}",
                f"data.root={tmp_path / 'data'}",
                "train.epochs=1",
                "data.batch_size=4",
            )
        )
    skips = [str(w.message) for w in caught if issubclass(w.category, SkippedImagesWarning)]
    assert [m for m in skips if m.startswith("epoch")] == [m for m in skips if "epoch 1: skipped 2 unreadable" in m]
    assert len([m for m in skips if m.startswith("epoch")]) == 1  # one warning for the epoch, counting both files
    left_out = [m for m in skips if m.startswith("evaluation of ") and "left out 1 unreadable" in m]
    assert len(left_out) == 2 and all("15 of 16 evaluated" in m for m in left_out)  # one per evaluated resolution
    assert json.loads((run / "results.json").read_text())[0]["images"] == 15  # the broken file is not counted
    meta = load_weights(find_checkpoint(run).weights)[1]
    assert json.loads(meta["class_map"]) == {"a": 0, "b": 1}


# ---------------------------------------------------------------------------------------------------- config errors


def test_unknown_keys_name_the_nearest_valid_key(tmp_path):
    with pytest.raises(ConfigError, match="'train.epoch'.*did you mean 'train.epochs'"):
        load_config(None, ["train.epoch=3"])
    with pytest.raises(ConfigError, match="did you mean 'train.epochs'"):
        load_config(None, ["optim.epochs=3"])  # right name, wrong section
    with pytest.raises(ConfigError, match="did you mean 'data.resolution'"):
        load_config(None, ["data.resolutoin=3"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  nmae: vit_n_ape\n")
    with pytest.raises(ConfigError, match=f"'model.nmae' in {bad}.*did you mean 'model.name'"):
        load_config(bad)


def test_values_are_converted_or_rejected():
    cfg = load_config(
        None,
        [
            "optim.lr=1e-3",
            "eval.resolutions=28,42,56",
            "train.ema=yes",
            "model.kwargs.depth=2",
            "optim.clip_grad=null",
            "train.run_name=007",
        ],
    )
    assert cfg.optim.lr == 1e-3 and cfg.eval.resolutions == [28, 42, 56] and cfg.train.ema is True
    assert cfg.model.kwargs == {"depth": 2} and cfg.optim.clip_grad is None and cfg.train.run_name == "007"
    with pytest.raises(ConfigError, match="train.epochs expects int, got 'ten'"):
        load_config(None, ["train.epochs=ten"])
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(None, ["train.epochs"])


def test_help_lists_every_key_with_its_default(capsys):
    with pytest.raises(SystemExit):
        train_main(["--help"])
    out = capsys.readouterr().out
    for key, _default, _, _ in config_keys():
        assert f"{key} = " in out, key
    assert "train.epochs = 10" in out and "data.name = synthetic-shapes" in format_config_help()


def test_every_recipe_loads_and_has_a_header():
    import timm

    recipes = sorted((REPO / "visionpe" / "configs").glob("*.yaml"))
    assert len(recipes) >= 5
    unregistered = []
    for path in recipes:
        head = path.read_text().split("\n\n")[0]
        for word in ("command:", "time:", "expected:"):
            assert word in head, f"{path.name} header lacks {word!r}"
        cfg = load_config(path)  # every key valid, every value of the right type
        if not timm.is_model(cfg.model.name):
            unregistered.append(cfg.model.name)
    if unregistered:
        pytest.skip(f"recipes name models not registered in this checkout: {unregistered}")


# ------------------------------------------------------------------------------------------------------- bad input


def test_bad_input_fails_before_any_work(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_train(tiny(tmp_path, "data.name=imagefolder", "data.options={}", f"data.root={tmp_path / 'nowhere'}"))
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="holds no images"):
        run_train(tiny(tmp_path, "data.name=imagefolder", "data.options={}", f"data.root={tmp_path / 'empty'}"))
    with pytest.raises(ValueError, match="cannot take resolution 2"):
        run_train(tiny(tmp_path, "eval.resolutions=16,2"))
    with pytest.raises(ValueError, match="nearest"):
        run_train(tiny(tmp_path, "model.name=vit_n_apee"))
    with pytest.raises(CheckpointError, match="nothing to resume"):
        run_train(tiny(tmp_path), resume=True)
    assert not (tmp_path / "run").exists()  # none of these wrote anything

    run = run_train(tiny(tmp_path, "train.epochs=1"))
    with pytest.raises(CheckpointError, match="holds weights of model 'vit_n_ape', not 'vit_n_rope2d'"):
        evaluate_checkpoint(run, [16], ["model.name=vit_n_rope2d"])
    with pytest.raises(CheckpointError, match="of another shape"):
        evaluate_checkpoint(run, [16], ["model.kwargs.embed_dim=64"])
    assert eval_main(["--checkpoint", str(run), "--resolutions", "2"]) == 2
    assert "cannot take resolution 2" in capsys.readouterr().err
    assert train_main(["-c", str(tmp_path / "missing.yaml")]) == 2


def test_imagenet_recipe_runs_small(tmp_path):
    """The DeiT recipe's machinery (RandAugment, random erasing, mixup/cutmix, label smoothing, EMA, lr scaling,
    cooldown) on a tiny image folder with a shrunken ViT-S."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b", "c"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (40, 36, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / c / f"{i}.jpg"
                )
    overrides = [
        "data.name=imagefolder",
        f"data.root={tmp_path / 'data'}",
        "data.resolution=32",
        "data.batch_size=4",
        "data.eval_batch_size=6",
        "data.workers=0",
        "model.kwargs={depth: 1, embed_dim: 32, num_heads: 2, patch_size: 8}",
        "train.epochs=1",
        "train.threads=1",
        "train.progress=false",
        f"train.output_dir={tmp_path}",
        "eval.resolutions=32,48",
        "eval.every_epochs=1",
    ]
    with attn_backend("sdpa"):
        run = train(REPO / "visionpe" / "configs" / "imagenet_deit_s.yaml", overrides)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert run.name == "imagenet_deit_s-vit_s_ape" and cfg["aug"]["mixup"] == 0.8
    rows = json.loads((run / "results.json").read_text())
    assert [r["resolution"] for r in rows] == [32, 48] and all(r["images"] == 12 for r in rows)
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == 11  # 1 epoch + 10 cooldown epochs
