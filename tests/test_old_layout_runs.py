"""A run directory written by the release before each attention layer owned its PE state (PE tensors under
`pe.encodings.<kind>.`, the key list of tests/data/old_layout.json.gz) still evaluates and resumes: the engine maps
its weights under each block (visionpe.pos.checkpoint.place_flat_entries)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_runs import tiny_run

from visionpe.attention.backends import attn_backend
from visionpe.engine import evaluate_checkpoint, load_checkpoint, train
from visionpe.engine.checkpoint import find_checkpoint, load_weights
from visionpe.engine.trainer import OldLayoutResumeWarning
from visionpe.pos.checkpoint import place_flat_entries

FIXTURE = json.loads(gzip.decompress((Path(__file__).with_name("data") / "old_layout.json.gz").read_bytes()))
NAME = "vit_n_irpe"  # per-layer iRPE tables (`pe.encodings.irpe.tables.k.{i}` before) and a model-level APE


def _args(out: Path, *extra: str) -> list[str]:
    data = ["data.name=synthetic-shapes", "data.options.num_train=32", "data.options.num_val=16", "data.batch_size=16"]
    # the fixture's ViT (depth 2, two heads of 16): its old key list names this model's tensors
    model = [f"model.name={NAME}", "model.kwargs.depth=2"]
    return tiny_run(out, data, *model, "train.run_name=old", "train.epochs=1", "eval.resolutions=16", *extra)


def _to_old_layout(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` under the old release's names: every key of the fixture's old list, each holding the tensor that key
    maps to now (the mapping under test, checked to be one to one on this model)."""
    old_keys = [k for k, _, _ in FIXTURE["layouts"][FIXTURE["models"][NAME]["keys"]]]
    new_of = {k: next(iter(place_flat_entries(model, {k: torch.empty(0)}))) for k in old_keys}
    assert sorted(new_of.values()) == sorted(state), "the old key list names exactly the model's tensors"
    assert any(k != v for k, v in new_of.items()), "some of its tensors were at the model level"
    return {k: state[new_of[k]] for k in old_keys}


def test_a_run_directory_of_the_old_layout_evaluates_and_resumes(tmp_path):
    with attn_backend("sdpa"):
        run = train(None, _args(tmp_path))
    ref = find_checkpoint(run)
    trained, meta = load_weights(ref.weights)
    model, _, _ = load_checkpoint(run)
    expect = evaluate_checkpoint(run)
    old = _to_old_layout(model, trained)
    assert "pe.encodings.irpe.tables.k.1" in old and "blocks.1.attn.pos.irpe.k" not in old
    save_file(old, str(ref.weights), metadata=meta)  # the run directory as the previous release wrote it

    loaded, _, _ = load_checkpoint(run)  # `engine.load_checkpoint`, what visionpe-eval reads
    got = loaded.state_dict()
    assert got.keys() == trained.keys() and all(torch.equal(got[k], trained[k]) for k in trained)
    assert evaluate_checkpoint(run) == expect  # the same weights: the same results

    with pytest.warns(OldLayoutResumeWarning, match="optimizer's moments start again"), attn_backend("sdpa"):
        train(None, _args(tmp_path, "train.epochs=2"), resume=True, accept_changes=True)
    info = find_checkpoint(run).info
    assert info["finished"] and info["epoch"] == 2 and info["global_step"] == 4
    resumed = load_weights(find_checkpoint(run).weights)[0]
    assert resumed.keys() == trained.keys()  # written in the current layout
    assert not torch.equal(resumed["blocks.1.attn.pos.irpe.k"], trained["blocks.1.attn.pos.irpe.k"])  # trained on
