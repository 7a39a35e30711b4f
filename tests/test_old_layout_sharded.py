"""A sharded run (train.strategy=fsdp) written by the release before each attention layer owned its PE state still
resumes: its DCP entries under `model.pe.encodings.<kind>.` are read whole, placed under each block and checked as a
plain checkpoint's (visionpe.engine.fsdp.load_full_checked); the optimizer's moments start again."""

from __future__ import annotations

import json

import pytest
import torch.distributed.checkpoint as dcp
from test_old_layout_runs import _args, _to_old_layout

from visionpe.attention.backends import attn_backend
from visionpe.engine import load_checkpoint, train
from visionpe.engine.dcp_reader import read_dcp_metadata
from visionpe.engine.sharded_checkpoint import load_sharded_weights
from visionpe.engine.trainer import OldLayoutResumeWarning


def test_a_sharded_run_directory_of_the_old_layout_resumes(tmp_path):
    args = _args(tmp_path, "train.strategy=fsdp", "train.ema=true")
    with attn_backend("sdpa"):
        run = train(None, args)
    results = json.loads((run / "results.json").read_text())
    model, _, _ = load_checkpoint(run)
    old = {"model": _to_old_layout(model, load_sharded_weights(run)[0])}
    old["ema"] = _to_old_layout(model, load_sharded_weights(run, ema=True)[0])
    folder = run / json.loads((run / "checkpoint.json").read_text())["sharded"]
    for p in folder.iterdir():  # DCP's own files go; meta.json and the ranks' training states stay
        if p.name != "meta.json" and not p.name.endswith(".state.pt"):
            p.unlink()
    dcp.save(old, checkpoint_id=folder, no_dist=True)  # the folder as the previous release wrote it
    assert "model.pe.encodings.irpe.tables.k.1" in read_dcp_metadata(folder).state_dict_metadata

    (run / "results.json").unlink()
    with pytest.warns(OldLayoutResumeWarning, match="optimizer's moments start again"), attn_backend("sdpa"):
        train(None, args, resume=True)  # a finished run: its weights evaluated again
    assert json.loads((run / "results.json").read_text()) == results  # the same weights: the same results
