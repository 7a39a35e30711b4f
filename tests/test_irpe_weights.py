"""The iRPE authors' DeiT checkpoints (microsoft/Cream iRPE, keys `blocks.{i}.attn.rpe_{q,k,v}.lookup_table_weight`)
load into vit_*_irpe / vit_*_irpe_qkv and give the logits of an independent reference written from the official
formulas (random weights stand in for the release; nothing is downloaded)."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

import visionpe  # noqa: F401
from visionpe.attention.backends import attn_backend
from visionpe.pos import CheckpointMismatch

DEPTH, HEADS, DIM, GRID, BUCKETS = 2, 6, 384, 14, 50  # DeiT-S, two blocks; 50 = 7 x 7 product buckets + CLS


def _official_checkpoint(targets: str, tables: bool = True) -> dict:
    """Random weights in the official DeiT-with-iRPE key layout (timm 0.3 DeiT + rpe_{q,k,v} per block)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    d = DIM // HEADS
    sd = {
        "cls_token": r(1, 1, DIM),
        "pos_embed": r(1, GRID * GRID + 1, DIM),
        "patch_embed.proj.weight": r(DIM, 3, 16, 16) * 0.2,
        "patch_embed.proj.bias": r(DIM),
        "norm.weight": 1 + r(DIM),
        "norm.bias": r(DIM),
        "head.weight": r(1000, DIM),
        "head.bias": r(1000),
    }
    for i in range(DEPTH):
        p = f"blocks.{i}."
        sd |= {
            p + "norm1.weight": 1 + r(DIM),
            p + "norm1.bias": r(DIM),
            p + "attn.qkv.weight": r(3 * DIM, DIM),
            p + "attn.qkv.bias": r(3 * DIM),
            p + "attn.proj.weight": r(DIM, DIM),
            p + "attn.proj.bias": r(DIM),
            p + "norm2.weight": 1 + r(DIM),
            p + "norm2.bias": r(DIM),
            p + "mlp.fc1.weight": r(4 * DIM, DIM),
            p + "mlp.fc1.bias": r(4 * DIM),
            p + "mlp.fc2.weight": r(DIM, 4 * DIM),
            p + "mlp.fc2.bias": r(DIM),
        }
        if tables:
            for t in targets:  # q/k: [1, d, buckets] (transposed), v: [1, buckets, d]; shared by the heads
                shape = (1, BUCKETS, d) if t == "v" else (1, d, BUCKETS)
                sd[p + f"attn.rpe_{t}.lookup_table_weight"] = torch.randn(*shape, generator=g)
    return {"model": sd}  # the release wraps the weights in a training checkpoint


def _official_buckets() -> torch.Tensor:
    """Official product buckets with ratio 1.9 and skip=1: piecewise index of the row and column offsets (positions
    as (row, col)), r * 7 + c, and bucket 49 for every pair with the CLS token."""
    alpha, beta, gamma = 1.9, 3.8, 15.2
    rows, cols = torch.meshgrid(torch.arange(GRID), torch.arange(GRID), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], 1).float()
    diff = pos[:, None] - pos[None]

    def index(x):
        far = torch.sign(x) * (alpha + torch.log(x.abs() / alpha) / math.log(gamma / alpha) * (beta - alpha))
        return torch.where(x.abs() <= alpha, x.round(), far.round().clip(-beta, beta)).long()

    ids = (index(diff[..., 0]) + 3) * 7 + index(diff[..., 1]) + 3
    full = torch.full((GRID * GRID + 1,) * 2, 49, dtype=torch.long)
    full[1:, 1:] = ids
    return full


def _reference_logits(sd: dict, x: torch.Tensor) -> torch.Tensor:
    """DeiT with iRPE as the official RPEAttention computes it: q scaled first, attn += rpe_k(q) + rpe_q(k * s)^T,
    out += rpe_v(attn), written with einsums over per-pair tables."""
    sd = sd["model"]
    ids = _official_buckets()
    t = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=16).flatten(2).transpose(1, 2)
    t = torch.cat([sd["cls_token"].expand(len(x), -1, -1), t], 1) + sd["pos_embed"]
    b, n, _ = t.shape
    for i in range(DEPTH):
        p = f"blocks.{i}."
        h = F.layer_norm(t, (DIM,), sd[p + "norm1.weight"], sd[p + "norm1.bias"])
        qkv = F.linear(h, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]).reshape(b, n, 3, HEADS, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q = q * q.shape[-1] ** -0.5
        attn = q @ k.transpose(-1, -2)
        if p + "attn.rpe_k.lookup_table_weight" in sd:  # attn_ij += q_i . rK[b(i, j)]
            rk = sd[p + "attn.rpe_k.lookup_table_weight"][0].t()[ids]  # [N, N, d]
            attn = attn + torch.einsum("bhid,ijd->bhij", q, rk)
        if p + "attn.rpe_q.lookup_table_weight" in sd:  # attn_ij += (k_j * s) . rQ[b(j, i)]
            rq = sd[p + "attn.rpe_q.lookup_table_weight"][0].t()[ids]  # [N(j), N(i), d]
            attn = attn + torch.einsum("bhjd,jid->bhij", k * q.shape[-1] ** -0.5, rq)
        attn = attn.softmax(-1)
        out = attn @ v
        if p + "attn.rpe_v.lookup_table_weight" in sd:  # out_i += sum_j a_ij rV[b(i, j)]
            rv = sd[p + "attn.rpe_v.lookup_table_weight"][0][ids]  # [N, N, d]
            out = out + torch.einsum("bhij,ijd->bhid", attn, rv)
        out = out.transpose(1, 2).reshape(b, n, DIM)
        t = t + F.linear(out, sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"])
        h = F.layer_norm(t, (DIM,), sd[p + "norm2.weight"], sd[p + "norm2.bias"])
        h = F.linear(F.gelu(F.linear(h, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])), sd[p + "mlp.fc2.weight"])
        t = t + h + sd[p + "mlp.fc2.bias"]
    t = F.layer_norm(t, (DIM,), sd["norm.weight"], sd["norm.bias"])
    return F.linear(t[:, 0], sd["head.weight"], sd["head.bias"])


@pytest.mark.parametrize("name, targets", [("vit_s_irpe", "k"), ("vit_s_irpe_qkv", "qkv")])
@pytest.mark.parametrize("backend", ["math", "auto"])
def test_official_checkpoint_gives_the_reference_logits(name, targets, backend, tmp_path):
    ckpt = _official_checkpoint(targets)
    path = tmp_path / "irpe.pth"
    torch.save(ckpt, path)
    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), depth=DEPTH).eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), attn_backend(backend):
        ours = model(x)
    ref = _reference_logits(ckpt, x)
    # fp32 through two blocks of width 384 (reductions of 384-1536 terms, eps 1.2e-7), logits of size ~10: 1e-4
    # absolute is ~100 eps x |logit|; a wrong bucket, scale or mirrored q table moves them by > 0.1
    assert (ours - ref).abs().max() < 1e-4 * max(1.0, ref.abs().max().item())


def test_official_checkpoint_on_the_wrong_preset_names_the_fix(tmp_path):
    path = tmp_path / "irpe.pth"
    torch.save(_official_checkpoint("qkv"), path)
    with pytest.raises(CheckpointMismatch, match="irpe_qkv"):
        timm.create_model("vit_s_irpe", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), depth=DEPTH)


def test_release_urls_are_registered():
    for name, file in [
        ("vit_t_irpe", "tiny_patch16_224_ctx_product_50_shared_k"),
        ("vit_b_irpe_qkv", "base_patch16_224_ctx_product_50_shared_qkv"),
    ]:
        cfg = timm.models.get_pretrained_cfg(f"{name}.ms_in1k")
        assert cfg.url.endswith(f"deit_{file}.pth")
