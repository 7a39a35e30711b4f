"""The counts behind `visionpe-bench fsdp-memory`: bytes of parameters, gradients and AdamW state."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from visionpe.bench.perf.fsdp_memory import project_state, state_bytes


def _one_step(model: nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    return optimizer


def test_counts_params_grads_and_adamw_state_in_bytes():
    model = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 1, bias=False))
    assert state_bytes(model) == {"params": 4 * 72, "grads": 0, "optimizer": 0, "total": 4 * 72}
    counts = state_bytes(model, _one_step(model))
    # 72 fp32 values; AdamW: two moments per value and one fp32 step counter per parameter tensor (3 of them)
    assert counts == {"params": 288, "grads": 288, "optimizer": 2 * 288 + 3 * 4, "total": 4 * 288 + 12}
    model.half()
    assert state_bytes(model)["params"] == 2 * 72


def test_a_tied_parameter_counts_once():
    a, b = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    assert state_bytes(nn.Sequential(a, b))["params"] == 4 * 16


def test_a_sharded_model_counts_its_local_shards():
    own = not dist.is_initialized()  # (a one-rank group an earlier in-process test left behind serves as well)
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_world_size() == 1
    try:
        model = nn.Sequential(nn.Linear(10, 6), nn.Linear(6, 2))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        counts = state_bytes(model, _one_step(model))
        assert all(type(p).__name__ == "DTensor" for p in model.parameters())
        n = 4 * (66 + 14)  # one rank holds the whole of every shard
        assert counts == {"params": n, "grads": n, "optimizer": 2 * n + 4 * 4, "total": 4 * n + 16}
    finally:
        if own:
            dist.destroy_process_group()


def test_projected_state_divides_by_the_ranks():
    assert project_state(1000, 2, 8) == 250 and project_state(1000, 1, 1) == 1000
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        project_state(1000, 0, 8)
