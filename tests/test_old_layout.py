"""State dicts of visionpe's layout before each attention layer owned its PE state (per-layer tables under
`pe.encodings.<kind>.`, tests/data/old_layout.json.gz) still load into every registered model and give the logits
the old code gave, with the same weights (drawn from the parameter names, tests/data/make_old_layout.py)."""

import gzip
import json
import sys
from pathlib import Path

import pytest
import timm
import torch

import visionpe
from visionpe.zoo.checkpoint_filters import checked_filter
from visionpe.zoo.family import FAMILIES

DATA = Path(__file__).with_name("data")
sys.path.insert(0, str(DATA))
from make_old_layout import drawn  # noqa: E402  (the fixture's weights, from the names)

FIXTURE = json.loads(gzip.decompress((DATA / "old_layout.json.gz").read_bytes()))
# a few hundred float32 ulps of the logits' scale: room for reassociated sums, not for a weight in the wrong place
EPS = torch.finfo(torch.float32).eps


def _family(name):
    return next(f for f in FAMILIES.values() if name.split("_")[0] == f.name)


def test_the_fixture_covers_every_registered_name():
    # names registered after the layout change (vit_*_seqpe) have no old layout: their entries were written from the
    # code that added them (make_old_layout.py --add-new-names), so for them this checks loading and logits only
    assert set(FIXTURE["models"]) == set(visionpe.list_visionpe_models())


@pytest.mark.parametrize("name", sorted(FIXTURE["models"]))
def test_an_old_layout_state_dict_loads_with_unchanged_logits(name):
    fam, entry = _family(name), FIXTURE["models"][name]
    model = timm.create_model(name, **fam.tiny).eval()
    own = model.state_dict()
    old = {k: drawn(k, own.get(k, torch.empty(shape)), param) for k, shape, param in FIXTURE["layouts"][entry["keys"]]}
    for name_, module in model.named_modules():  # qkv_bias='qv': the k third is unused, and a checkpoint's is zero
        if getattr(module, "qv_bias_only", False):
            b = old[f"{name_}.qkv.bias"]
            b[b.shape[0] // 3 : 2 * b.shape[0] // 3] = 0
    model.load_state_dict(checked_filter(fam.filter_fn)(old, model), strict=True)
    torch.manual_seed(1)
    inp = fam.example_input(fam.test_sizes[0], 1)
    with torch.no_grad():
        out = (model(**inp) if isinstance(inp, dict) else model(inp)).flatten()[: len(entry["logits"])]
    expect = torch.tensor(entry["logits"])
    tol = 256 * EPS * (1 + expect.abs().max())
    assert (out - expect).abs().max() <= tol
    # every PE tensor that serves one layer lives in that layer's block: none is left at the model level
    for kind, pe in model.pe.encodings.items():
        flat = {k.split(".", 3)[3]: v for k, v in model.state_dict().items() if k.startswith(f"pe.encodings.{kind}.")}
        assert not pe.layer_entries(flat)[1], f"{kind} keeps per-layer tensors at the model level"
    # and a state dict of today's layout passes the same filter unchanged (one whose PE state is all per layer too)
    current = model.state_dict()
    again = checked_filter(fam.filter_fn)(current, model)
    assert again.keys() == current.keys() and all(torch.equal(again[k], v) for k, v in current.items())
