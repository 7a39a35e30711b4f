"""Training at a patch size drawn per batch (data.patch_sizes, FlexiViT): each size is seen, the loss is finite,
the draw follows the seed (a killed and resumed run ends with the uninterrupted run's weights), and models that
cannot are refused before any work."""

from __future__ import annotations

import copy
import json

import pytest
import timm
import torch
from test_train_eval import run_killed_at, run_train, tiny, weights

import visionpe  # noqa: F401  (registers the models)
from visionpe.data.multires import patch_size_of_batch
from visionpe.engine import ConfigError
from visionpe.engine import trainer as engine
from visionpe.models.flexi_patch import at_patch_size
from visionpe.zoo.vit_family import VIT

SWIN = ["model.name=swin_n_rpb", "model.kwargs={embed_dim: 16, depths: [2, 2], num_heads: [1, 2], window_size: 2}"]


def _recording(monkeypatch) -> list[int]:
    """The kernel size each training step's stem ran with."""
    seen, original = [], engine.at_patch_size

    def spy(model, p):
        inner = original(model, p)

        class Record:
            def __enter__(self):
                inner.__enter__()
                seen.append(model.patch_embed.proj.weight.shape[-1])

            def __exit__(self, *exc):
                return inner.__exit__(*exc)

        return Record()

    monkeypatch.setattr(engine, "at_patch_size", spy)
    return seen


@pytest.mark.parametrize("model, sizes", [([], (2, 4, 8)), (SWIN, (2, 4))])
def test_a_short_run_trains_at_each_patch_size_with_a_finite_loss(tmp_path, monkeypatch, model, sizes):
    seen = _recording(monkeypatch)
    patch = f"data.patch_sizes={','.join(map(str, sizes))}"
    run = run_train(tiny(tmp_path, patch, "eval.resolutions=16", "train.seed=1", *model))  # 2 epochs x 4 steps
    assert sorted(set(seen)) == list(sizes) and len(seen) == 8
    want = [patch_size_of_batch(sizes, 1, e, b) for e in range(2) for b in range(4)]
    assert seen == want
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in lines if r.get("kind") in ("train", "eval")]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


def test_a_killed_run_resumes_to_the_same_weights(tmp_path):
    common = tiny(tmp_path, "data.patch_sizes=2,4,8", "train.ckpt_every_steps=3", "eval.resolutions=16")
    reference = run_train([*common, "train.run_name=reference"])
    killed = run_killed_at(5, [*common, "train.run_name=killed"], tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    run_train([*common, "train.run_name=killed"], resume=True)
    ref, got = weights(reference), weights(tmp_path / "killed")
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_the_draw_is_a_function_of_seed_epoch_and_batch():
    sizes = (8, 16, 24, 32)
    draws = [patch_size_of_batch(sizes, 0, 0, b) for b in range(400)]
    assert draws == [patch_size_of_batch(sizes, 0, 0, b) for b in range(400)]
    assert draws != [patch_size_of_batch(sizes, 1, 0, b) for b in range(400)]
    counts = torch.bincount(torch.tensor([sizes.index(d) for d in draws]), minlength=4)
    assert counts.min() > 60  # uniform: 100 each expected, sd 8.7; below 60 is a 4.6-sigma event


def test_at_patch_size_is_the_resized_model_and_trains_the_one_kernel():
    torch.manual_seed(0)
    model = timm.create_model("vit_n_rope2d_mixed_ape", **VIT.tiny).eval()
    resized = copy.deepcopy(model)
    resized.set_input_size(patch_size=4)
    x = torch.randn(2, 3, 32, 32)
    with at_patch_size(model, 4):
        got = model(x)
    assert torch.equal(got, resized(x))
    assert model.patch_embed.proj.kernel_size == (8, 8) and model.patch_embed.patch_size == (8, 8)  # restored
    with at_patch_size(model, 4):
        model(x).sum().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0 and list(model.state_dict()) == list(resized.state_dict())


@pytest.mark.parametrize(
    "extra, match",
    [
        (["model.name=cvt_n"], "cvt_n cannot train at a patch size per batch: its first embedding is an overlapping"),
        (["model.kwargs.token_merger=1"], "its token merger"),
        (["data.patch_sizes=4,32"], "patches larger than the 16 px images"),
        (["data.native.max_tokens=16"], "does not apply with data.native"),
    ],
)
def test_what_cannot_train_at_a_patch_size_per_batch_is_refused(tmp_path, extra, match):
    base = tiny(tmp_path, "data.patch_sizes=2,4")
    if extra[0].startswith("model.name=cvt"):
        base = [o for o in base if not o.startswith("model.kwargs")]
    with pytest.raises(ConfigError, match=match):
        run_train([*base, *extra])
