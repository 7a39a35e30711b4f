"""Native-aspect training end to end (data.native): metrics, evaluation at token budgets, exact resume after a kill,
one-line errors for bad settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import torch
from tiny_runs import tiny_run

from visionpe.data import build_dataset
from visionpe.data.native.loader import build_native_train_loader, native_plan
from visionpe.data.native.timm_naflex import TimmResumeWarning
from visionpe.data.share import Share
from visionpe.engine import train
from visionpe.engine.changes import changed_keys
from visionpe.engine.checkpoint import find_checkpoint, load_weights
from visionpe.engine.config import ConfigError, NativeConfig, load_config
from visionpe.engine.distributed import DistContext
from visionpe.engine.evaluate import evaluate_checkpoint
from visionpe.engine.native_train import plan_for

NATIVE = [  # packed rows of 48 tokens, budgets of 8 and 16 patches of 4 px, evaluated at 16 and 32 tokens
    "data.native.max_tokens=16",
    "data.native.seq_lens=8,16",
    "data.native.row_tokens=48",
    "data.native.tokens_per_batch=192",
    "data.native.eval_tokens=16,32",
    "model.kwargs.patch_size=4",
]
DATA = [
    "data.name=fashion-mnist-native",
    "data.options.num_train=96",
    "data.options.num_val=32",
    "data.options.side=32",
    "data.options.item=16",
    *NATIVE,
]


@pytest.fixture
def common(tmp_path, fashion_root):
    """The overrides of a tiny native run on the test's Fashion-MNIST files, then `extra`."""
    return lambda *extra: tiny_run(tmp_path, [*DATA, f"data.root={fashion_root}"], "train.log_every=2", *extra)


def _lines(run, kind):
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


@pytest.mark.parametrize("mode", ["packed", "padded"])
def test_native_training_logs_batch_statistics_and_evaluates_at_budgets(common, mode):
    run = train(None, common(f"data.native.mode={mode}", f"train.run_name={mode}"))
    rows = _lines(run, "train")
    assert rows and all(0 <= r["padding"] < 0.5 and r["images_per_batch"] >= 1 for r in rows)
    assert all(r["tokens_per_batch"] <= 192 for r in rows)
    if mode == "packed":  # several images per row of 48 tokens: more images per batch than rows
        assert all(r["images_per_batch"] > 4 for r in rows)
    results = json.loads((run / "results.json").read_text())
    assert {r["resolution"] for r in results} == {16, "16tok", "32tok"}
    again = evaluate_checkpoint(run, ctx=DistContext())  # visionpe-eval: the same rows from the checkpoint
    assert [(r["resolution"], r["images"]) for r in again] == [(r["resolution"], r["images"]) for r in results]
    assert all(abs(r["loss"] - q["loss"]) < 1e-5 for r, q in zip(again, results))


def test_native_batches_are_the_same_with_loader_workers(fashion_root):
    ds = build_dataset(
        "fashion-mnist-native",
        "train",
        16,
        root=fashion_root,
        options=dict(num_train=64, side=32, item=16),
        training=True,
    )
    plan = native_plan(NativeConfig(seq_lens=[8, 16], row_tokens=48, tokens_per_batch=192), 4)
    a, b = (list(build_native_train_loader(ds, plan, 16, seed=1, share=Share(workers=w))) for w in (0, 1))
    assert len(a) == len(b) > 1
    for x, y in zip(a, b):
        assert all(torch.equal(x.inputs[k], y.inputs[k]) for k in x.inputs) and torch.equal(x.targets, y.targets)


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from visionpe.engine import trainer as engine

    kill_at = int(sys.argv[1])
    step = engine.Trainer.step

    def step_then_die(self, net, batch):
        if self.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self, net, batch)

    engine.Trainer.step = step_then_die
    engine.train(None, sys.argv[2:])
    """
)


def check_kill_and_resume(tmp_path, common: list[str]) -> None:
    """A run SIGKILLed mid-training and resumed ends with the uninterrupted run's weights and results, bit for bit."""
    reference = train(None, [*common, "train.run_name=reference"])
    steps = _lines(reference, "train")[-1]["global_step"]
    assert steps >= 4
    kill_at = steps // 2 + 1  # mid-epoch 2 when an epoch has few steps, else mid-epoch 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run(
        [sys.executable, "-c", KILLER, str(kill_at), *common, "train.run_name=killed"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    run = tmp_path / "killed"
    assert 0 < json.loads((run / "checkpoint.json").read_text())["global_step"] < steps
    train(None, [*common, "train.run_name=killed"], resume=True)
    a, b = load_weights(find_checkpoint(reference).weights)[0], load_weights(find_checkpoint(run).weights)[0]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((reference / "results.json").read_text()) == json.loads((run / "results.json").read_text())


def test_native_training_resumes_bit_identically_after_a_kill(tmp_path, common):
    args = common("train.epochs=2", "train.ckpt_every_steps=2", "model.kwargs.drop_path_rate=0.1")
    check_kill_and_resume(tmp_path, args)


def test_native_training_runs_under_ddp_each_rank_packing_its_own_rows(tmp_path, common):
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "VISIONPE_ATTN": "sdpa", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(repo / "train.py"), *common("train.epochs=1", "train.run_name=ddp")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "ddp"
    single = train(None, common("train.epochs=1", "train.run_name=single"))
    ddp_rows, one_rows = _lines(run, "train"), _lines(single, "train")
    # each rank packs half the images into the same number of batches of the same size: half the steps
    assert ddp_rows[-1]["global_step"] in (one_rows[-1]["global_step"] // 2, one_rows[-1]["global_step"] // 2 + 1)
    assert all(r["padding"] < 0.5 for r in ddp_rows)
    assert all(r["images"] == 32 for r in _lines(run, "eval"))  # each evaluated image counted once


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.native.row_tokens=8", "cannot hold an image at the largest budget"),
        ("data.native.patch_size=8", "has 4 px patches"),
        ("data.native.tokens_per_batch=16", "less than one row"),
        ("data.train_resolutions=16,24", "data.train_resolutions=16,24 does not apply with data.native"),
    ],
)
def test_bad_native_settings_are_one_line_errors(common, override, message):
    with pytest.raises(ConfigError, match=message) as e:
        train(None, common(override, "train.run_name=bad"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dataset", ["video-shapes", "image-text-shapes"])
def test_native_batches_of_a_dataset_that_is_not_images_are_one_line(dataset):
    cfg = load_config(None, [f"data.name={dataset}", "data.native.max_tokens=16"])
    with pytest.raises(ConfigError, match=f"data.native takes image datasets .*'{dataset}' is of kind"):
        plan_for(cfg, torch.nn.Identity())


def test_a_model_without_patches_is_told_the_setting_that_works():
    cvt = timm.create_model("cvt_13_cpe", num_classes=4, embed_dims=(16, 16, 16), depths=(1, 1, 1), num_heads=(1, 1, 1))
    cfg = load_config(None, ["model.name=cvt_13_cpe", "data.native.max_tokens=16"])
    with pytest.raises(ConfigError, match="set data.native.mode=buckets .* and data.native.patch_size=16 "):
        plan_for(cfg, cvt)
    cfg = load_config(None, ["model.name=cvt_13_cpe", "data.native.max_tokens=16", "data.native.mode=buckets"])
    with pytest.raises(ConfigError, match=r"; set data.native.patch_size=16 \(its total stride\)"):
        plan_for(cfg, cvt)
    cfg.data.native["patch_size"] = 16  # the setting named works
    assert plan_for(cfg, cvt).patch == 16


def test_timm_naflex_loader_trains_as_the_loader(common):
    run = train(
        None,
        common("data.native.mode=padded", "data.native.loader=timm", "aug.scale=0.5,1", "train.run_name=timm"),
    )
    rows = _lines(run, "train")
    assert rows and all(
        0 <= r["padding"] < 0.5 and 8 <= r["images_per_batch"] <= 24 for r in rows
    )  # timm: multiples of 8
    assert {r["resolution"] for r in json.loads((run / "results.json").read_text())} == {16, "16tok", "32tok"}
    # its workers draw their own crops: a resume refuses another worker count (data.workers is free elsewhere)
    args = common("data.native.mode=padded", "data.native.loader=timm", "aug.scale=0.5,1", "train.run_name=timm")
    with pytest.raises(ConfigError, match="data.workers 0 -> 1"):
        train(None, [*args, "data.workers=1"], resume=True)


def test_timm_loader_resumed_mid_epoch_warns_that_it_is_not_exact(fashion_root):
    ds = build_dataset("fashion-mnist-native", "train", 16, root=fashion_root, options=dict(num_train=32, item=16))
    plan = native_plan(NativeConfig(mode="padded", loader="timm", seq_lens=[8, 16], tokens_per_batch=64), 4)
    batches = build_native_train_loader(ds, plan, 16, seed=1)
    batches.start_at(0)  # an epoch from its start: no warning
    with pytest.warns(TimmResumeWarning, match="resumed at batch 2 of an epoch"):
        batches.start_at(2)
    assert changed_keys({"data.workers": 0}, {"data.workers": 2}) == {}  # free on visionpe's loader


def test_timm_loader_refuses_packing(common):
    with pytest.raises(ConfigError, match="mode=padded"):
        train(None, common("data.native.loader=timm", "train.run_name=bad"))
