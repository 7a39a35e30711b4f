"""iRPE and the attention routes trace into one graph: no graph break (the bucket-id cache is skipped while
compiling) and one compilation for every layer of a model."""

import pytest
import timm
import torch

import visionpe  # noqa: F401
import visionpe.pos.irpe as irpe_module
from visionpe.zoo.vit_family import VIT


@pytest.mark.parametrize(
    "name, kwargs, separable",
    [
        ("vit_n_irpe", dict(VIT.tiny), False),
        ("vit_n_irpe_qkv", dict(VIT.tiny), False),
        ("vit_n_irpe_qkv", dict(VIT.tiny), True),
        ("swin_n_rpb", {}, False),
    ],
)
def test_one_graph_and_no_graph_break(name, kwargs, separable, monkeypatch):
    if separable:  # the per-axis bucket ids large grids use (product mapping), traced on this small grid
        monkeypatch.setattr(irpe_module, "SMALL_GRID_PAIRS", 0)
    model = timm.create_model(name, **kwargs).eval()
    size = model.pretrained_cfg["input_size"][-1] if not kwargs else kwargs["img_size"]
    x = torch.randn(1, 3, size, size)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    reasons = [b.reason for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, reasons
