"""The native-resolution part of `visionpe-bench gpu-check`: masked attention (the block-diagonal mask of a packed
batch) per backend against the math reference, and a ViT on a packed batch against each image alone
(visionpe/native_check.py does the measuring; this module picks the backends, catches failures and writes tables)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attn_mask import flex_available
from ..native_check import MODEL_TOLERANCE, TOLERANCE, check_masked_backend, check_native_model
from ..zoo import create_model
from .report import md_table

MASKED_BACKENDS = {"flex": "flex (block mask)", "xformers": "xformers (block-diagonal)", "sdpa": "sdpa (bool mask)"}
NATIVE_MODEL = "vit_b_rope2d_mixed"  # a rotary PE: auto sends its masked calls to flex on CUDA


def masked_backends(xformers_usable: bool) -> list[str]:
    """The masked backends this machine can run, in MASKED_BACKENDS order."""
    can = dict(flex=flex_available(), xformers=xformers_usable, sdpa=True)
    return [b for b in MASKED_BACKENDS if can[b]]


def _ok(row: dict) -> bool:
    return all(row[k] for k in row if k.endswith("_ok"))


def _failed(backend: str, device: str, error: Exception) -> dict:
    return dict(backend=backend, device=str(device), error=f"{type(error).__name__}: {str(error)[:200]}", ok=False)


def masked_attention(backends: list[str], device: str, **shape) -> list[dict]:
    """One row per backend: `check_masked_backend` (fp32 and bf16 against math, images/s, peak MiB on CUDA);
    `shape`: its rows, length, images_per_row, heads, head_dim, reps."""
    rows = []
    for backend in backends:
        try:
            row = check_masked_backend(backend, device, **shape)
        except Exception as e:  # reported, not raised: the check goes on to the next backend
            rows.append(_failed(backend, device, e))
            continue
        rows.append(dict(row, ok=_ok(row)))
    return rows


def native_model(
    backends: list[str], device: str, name: str = NATIVE_MODEL, build: Callable[[str], torch.nn.Module] = create_model
) -> list[dict]:
    """One row per backend: `check_native_model` of model `name` on a packed batch of 8 aspect ratios (1:3 to 3:1)."""
    torch.manual_seed(0)
    model = build(name)
    rows = []
    for backend in backends:
        try:
            row = check_native_model(model, backend, device)
        except Exception as e:  # reported, not raised
            rows.append(dict(_failed(backend, device, e), model=name))
            continue
        rows.append(dict(row, model=name, ok=_ok(row)))
    model.cpu()
    return rows


def _num(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "-"


def format_native(masked: list[dict], native: list[dict]) -> list[str]:
    """The Markdown lines of both checks (empty when neither ran)."""
    lines = []
    if masked:
        r0 = next((r for r in masked if "rows" in r), {})
        lines += [
            "",
            f"Masked attention of a packed batch ({r0.get('rows', '?')} rows of {r0.get('length', '?')} tokens, "
            f"{r0.get('images', '?')} images) against math; tolerance fp32 {TOLERANCE[torch.float32]:.0e}, "
            f"bf16 {TOLERANCE[torch.bfloat16]:.0e} (max error relative to the output's scale):",
            "",
        ]
        rows = [[MASKED_BACKENDS.get(r["backend"], r["backend"]), *_cells(r, ("fp32", "bf16"), peak=True)]
                for r in masked]  # fmt: skip
        heads = ["backend", "fp32 rel. err", "bf16 rel. err", "ok", "fp32 images/s", "bf16 images/s", "fp32 MiB",
                 "bf16 MiB"]  # fmt: skip
        lines += md_table(heads, "lrrlrrrr", rows)
    if native:
        lines += [
            "",
            f"{native[0]['model']} on a packed batch (8 images, aspect ratios 1:3 to 3:1, two per row) against each "
            f"image alone on math in fp32; tolerance fp32 {MODEL_TOLERANCE[torch.float32]:.0e}, bf16 "
            f"{MODEL_TOLERANCE[torch.bfloat16]:.0e} (logits):",
            "",
        ]
        rows = [[r["backend"], *_cells(r, ("fp32", "bf16"), peak=False)] for r in native]
        lines += md_table(["backend", "fp32 rel. err", "bf16 rel. err", "ok", "fp32 images/s", "bf16 images/s"],
                          "lrrlrr", rows)  # fmt: skip
    return lines


def _cells(row: dict, dtypes: tuple[str, ...], peak: bool) -> list:
    if "error" in row:
        return [row["error"], "-", False, "-", "-", *(["-", "-"] if peak else [])]
    cells = [_num(row, f"{d}_max_rel_err", ".2e") for d in dtypes] + [row["ok"]]
    cells += [_num(row, f"{d}_images_per_s", ".1f") for d in dtypes]
    return cells + ([_num(row, f"{d}_peak_mib", ".0f") for d in dtypes] if peak else [])
