"""Run under torchrun by test_fsdp.py (2 ranks, gloo, fp32): for each model name, the same start (one weights file),
the same per-rank batches and the same AdamW steps (with gradient clipping) under DDP, FSDP and FSDP with activation
checkpointing. Rank 0 writes {name: {"losses": {...}, "params": {...}}} to <out>/results.json; the full parameters
after the steps go to <out>/<name>-<variant>.safetensors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from timm.optim import create_optimizer_v2
from timm.utils import dispatch_clip_grad
from torch.nn.parallel import DistributedDataParallel

from visionpe.attention.backends import attn_backend
from visionpe.engine.checkpoint import save_weights
from visionpe.engine.config import load_config
from visionpe.engine.distributed import init_distributed
from visionpe.engine.fsdp import build_sharded_model, full_state_dict
from visionpe.engine.setup import build_model

STEPS, BATCH, RES, CLASSES = 3, 4, 32, 10


def config(name: str, out: Path, *extra: str):
    trunk = ["model.kwargs.depth=2"] if name.split("_")[0] in ("vit", "vivit") else []
    trunk.append("model.kwargs.drop_path_rate=0")  # no randomness in the forward
    return load_config(None, [f"model.name={name}", f"data.resolution={RES}", "train.amp=none", *trunk, *extra])


def batches(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(BATCH, 3, RES, RES, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def train(net, params_of, optimizer, data) -> list[float]:
    losses = []
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        dispatch_clip_grad(params_of.parameters(), 1.0, mode="norm")
        optimizer.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / dist.get_world_size())
    return losses


def run(name: str, out: Path, ctx) -> dict:
    start = out / f"{name}-start.safetensors"
    torch.manual_seed(0)
    reference = build_model(config(name, out), CLASSES, 3)
    if ctx.rank == 0:
        save_weights(start, reference.state_dict(), {"model": name})
    dist.barrier()
    data = batches(ctx.rank)
    ddp = DistributedDataParallel(reference)
    results = {"ddp": train(ddp, reference, create_optimizer_v2(reference, "adamw", lr=1e-3), data)}
    finals = {"ddp": {k: v.detach() for k, v in reference.state_dict().items()}}
    for variant, extra in (("fsdp", []), ("fsdp_ac", ["train.activation_checkpointing=true"])):
        load = ["model.kwargs.pretrained=true", f"model.kwargs.pretrained_cfg_overlay.file={start}"]
        model = build_sharded_model(config(name, out, *load, *extra), CLASSES, 3, ctx, None)
        results[variant] = train(model, model, create_optimizer_v2(model, "adamw", lr=1e-3), data)
        finals[variant] = full_state_dict(model)
    if ctx.rank == 0:
        for variant, state in finals.items():
            save_file({k: v.contiguous() for k, v in state.items()}, str(out / f"{name}-{variant}.safetensors"))
    return results


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    ctx = init_distributed("cpu")
    torch.set_num_threads(1)
    with attn_backend("sdpa"):
        results = {name: run(name, out, ctx) for name in names}
    if ctx.rank == 0:
        (out / "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
