"""`visionpe-bench gpu-check`: versions (torch, CUDA, xformers), attention backends against the math backend per
PE in fp32 and bf16, ViT-B/16 images/s and memory per backend, and the masked attention of native-resolution
batches per backend (flex, xformers block-diagonal, sdpa; fp32/bf16 against math, images/s, memory) with a ViT on
a packed batch against each image alone (docs/benchmark.md, docs/native_resolution.md)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe import attn_backend

from ...attention.masks import flex_available
from ...engine.cli import positive_int
from ...zoo.registry import create_model, family_of
from ..report import check_files, md_table, write_files
from ..settings import check_sizes
from . import backend_check as checks
from .measure import Clock, Spread, cuda_peak_mb, interleave, model_step, paired_ratios, spread

MASKED_BACKENDS = {"flex": "flex (block mask)", "xformers": "xformers (block-diagonal)", "sdpa": "sdpa (bool mask)"}
NATIVE_MODEL = "vit_b_rope2d_mixed"  # a rotary PE: auto sends its masked calls to flex on CUDA

AGREEMENT_MODELS = {
    "rotary (RoPE-2D)": "vit_n_rope2d_mixed",
    "bias (iRPE contextual)": "vit_n_irpe",
    "bias (Swin RPB + shift mask)": "swin_n_rpb",
    "value (iRPE on q, k, v)": "vit_n_irpe_qkv",
}
# the tables: (head, key of the row's value, its format; right-aligned where there is one)
AGREEMENT_COLUMNS = [("PE", "pe", ""), ("model", "model", ""), ("dtype", "dtype", ""), ("backend", "backend", ""),
                     ("max rel. error vs math", "rel_err", ".2e"), ("tolerance", "tol", ".0e"),
                     ("ok", "ok", "")]  # fmt: skip
THROUGHPUT_COLUMNS = [("model", "model", ""), ("px", "resolution", "d"), ("backend", "backend", ""),
                      ("images/s", "median", ".1f"), ("vs", "vs", ""), ("ratio", "ratio_text", "s"),
                      ("peak MiB", "peak_mb", ".0f")]  # fmt: skip
NATIVE_COLUMNS = [("backend", "backend", ""), ("fp32 rel. err", "fp32_max_rel_err", ".2e"),
                  ("bf16 rel. err", "bf16_max_rel_err", ".2e"), ("ok", "ok", ""),
                  ("fp32 images/s", "fp32_images_per_s", ".1f"),
                  ("bf16 images/s", "bf16_images_per_s", ".1f")]  # fmt: skip
MASKED_COLUMNS = [*NATIVE_COLUMNS, ("fp32 MiB", "fp32_peak_mib", ".0f"), ("bf16 MiB", "bf16_peak_mib", ".0f")]


def _attempt(row: dict, check: Callable[..., dict], *args, **kwargs) -> dict:
    """`row` with the fields `check(*args, **kwargs)` returns and `ok` (all its `*_ok` fields), or with its error:
    reported, not raised, so the check goes on to the next backend."""
    try:
        out = check(*args, **kwargs)
    except Exception as e:
        return dict(row, error=checks.error_text(e), ok=False)
    return dict(row, **out, ok=all(out[k] for k in out if k.endswith("_ok")))


def agreement(backends: list[str], dtypes: list[torch.dtype], device: str, batch: int = 2) -> list[dict]:
    """Per PE model (tiny, 32 px), dtype and backend: its logits against the math backend's."""
    rows = []
    for kind, name in AGREEMENT_MODELS.items():
        torch.manual_seed(0)
        model = create_model(name, **family_of(name).tiny).eval().to(device)
        x = torch.randn(batch, 3, 32, 32, device=device)
        rows += [dict(pe=kind, model=name, **r) for r in checks.check_model_backends(model, x, backends, dtypes)]
        model.cpu()
    return rows


def throughput(backends: list[str], device: str, name: str, resolutions: tuple[int, ...], batch: int) -> list[dict]:
    """Images/s in bf16 (backends interleaved per resolution over 3 rounds, ratio against sdpa per round) and peak
    memory of one step."""
    rows = []
    model = create_model(name).eval().to(device, torch.bfloat16)
    for res in resolutions:
        x = torch.randn(batch, 3, res, res, device=device, dtype=torch.bfloat16)
        step = model_step(model, x, train=False)

        def run(b: str, step=step) -> int:
            with attn_backend(b):
                return step()

        tasks = {b: (lambda b=b: run(b)) for b in backends}
        rates = interleave(tasks, Clock("wall", device), rounds=3, steps=1)
        base = "sdpa" if "sdpa" in rates else backends[0]
        ratios = paired_ratios(rates, base)
        for b in backends:
            row = dict(model=name, resolution=res, backend=b, images_per_s=spread(rates[b]).as_dict(), vs=base)
            rows.append(dict(row, ratio=spread(ratios[b]).as_dict(), peak_mb=cuda_peak_mb(lambda b=b: run(b), device)))
    return rows


def masked_attention(backends: list[str], device: str, **shape) -> list[dict]:
    """One row per backend: check_masked_backend (fp32 and bf16 against math, images/s, peak MiB on CUDA); `shape`:
    its rows, length, images_per_row, heads, head_dim, reps."""
    return [_attempt(dict(backend=b, device=device), checks.check_masked_backend, b, device, **shape) for b in backends]


def run_check(
    device: str | None = None,
    throughput_model: str = "vit_b_ape",
    resolutions=(224, 512, 1024),
    batch: int = 8,
    native: str = NATIVE_MODEL,
    native_build: Callable[[str], torch.nn.Module] = create_model,
    masked_shape: dict | None = None,
) -> dict:
    """Everything the command reports, as one dict (the CUDA-only parts run where torch.cuda.is_available()).
    native / native_build: the model of the packed-batch check; masked_shape: masked_attention's sizes."""
    cuda = torch.cuda.is_available()
    device = device or ("cuda" if cuda else "cpu")
    status = checks.xformers_status()
    backends = ["sdpa"] + (["xformers"] if status["usable"] else [])
    dtypes = [torch.float32] + ([torch.bfloat16] if cuda else [])
    result: dict = dict(versions=status, device=device, backends=backends, skipped=[])
    result.update(throughput=[], masked=[], native=[])
    if not status["usable"]:
        result["skipped"].append(f"xformers: {status['reason']}")
    if not cuda:
        result["skipped"] += [
            "bf16 agreement: no CUDA device (bf16 on CPU is not what this check is about)",
            "throughput and peak memory of ViT-B/16: no CUDA device",
            "masked attention of native-resolution batches (flex, xformers block-diagonal, sdpa): no CUDA device "
            "(on CPU masked calls take sdpa with a boolean mask, tested by tests/test_native_attention.py)",
        ]
    result["agreement"] = agreement(backends, dtypes, device)
    if cuda:
        result["gpu"] = torch.cuda.get_device_name(device)
        result["throughput"] = throughput(["math", *backends], device, throughput_model, tuple(resolutions), batch)
        can = dict(flex=flex_available(), xformers=status["usable"], sdpa=True)
        masked = [b for b in MASKED_BACKENDS if can[b]]
        result["masked"] = masked_attention(masked, device, **(masked_shape or {}))
        torch.manual_seed(0)
        model = native_build(native)  # on a packed batch of 8 aspect ratios (1:3 to 3:1) against each image alone
        row = dict(device=device, model=native)
        result["native"] = [_attempt(dict(row, backend=b), checks.check_native_model, model, b, device) for b in masked]
        model.cpu()
    result["ok"] = all(r["ok"] for r in result["agreement"] + result["masked"] + result["native"])
    return result


def _table(columns: list[tuple[str, str, str]], rows: list[dict]) -> list[str]:
    """The Markdown table of dict rows; a missing value is '-', but a failed check's error fills the first one."""
    cells = []
    for r in rows:
        cells.append([format(r[key], spec) if key in r else "-" for _, key, spec in columns])
        missing = [i for i, (_, key, _) in enumerate(columns) if key not in r]
        if "error" in r and missing:
            cells[-1][missing[0]] = r["error"]
    return md_table([head for head, _, _ in columns], "".join("r" if spec else "l" for *_, spec in columns), cells)


def format_native(masked: list[dict], native: list[dict]) -> list[str]:
    """The Markdown lines of the native-resolution checks (empty when neither ran)."""
    lines = []
    if masked:
        r0, tol = next((r for r in masked if "rows" in r), {}), checks.TOLERANCE
        lines += ["", f"Masked attention of a packed batch ({r0.get('rows', '?')} rows of {r0.get('length', '?')} "
                  f"tokens, {r0.get('images', '?')} images) against math; tolerance fp32 {tol[torch.float32]:.0e}, "
                  f"bf16 {tol[torch.bfloat16]:.0e} (max error relative to the output's scale):", ""]  # fmt: skip
        lines += _table(
            MASKED_COLUMNS, [dict(r, backend=MASKED_BACKENDS.get(r["backend"], r["backend"])) for r in masked]
        )
    if native:
        tol = checks.MODEL_TOLERANCE
        lines += ["", f"{native[0]['model']} on a packed batch (8 images, aspect ratios 1:3 to 3:1, two per row) "
                  f"against each image alone on math in fp32; tolerance fp32 {tol[torch.float32]:.0e}, bf16 "
                  f"{tol[torch.bfloat16]:.0e} (logits):", "", *_table(NATIVE_COLUMNS, native)]  # fmt: skip
    return lines


def format_markdown(result: dict) -> str:
    v = result["versions"]
    built_for = f" (built for torch{v['xformers_requires_torch']})" if v.get("xformers_requires_torch") else ""
    usable = "yes" if v["usable"] else f"no ({v['reason']})"
    lines = [
        f"# GPU check ({time.strftime('%Y-%m-%d')})",
        "",
        f"Device {result.get('gpu', result['device'])}; torch {v['torch']} (CUDA {v['cuda']}); xformers "
        f"{v.get('xformers') or 'not installed'}{built_for}; xformers usable: {usable}.",
        "",
        *_table(AGREEMENT_COLUMNS, result["agreement"]),
    ]
    if result["throughput"]:
        rows = [dict(r, median=r["images_per_s"]["median"], ratio_text=Spread(**r["ratio"]).text())
                for r in result["throughput"]]  # fmt: skip
        lines += ["", *_table(THROUGHPUT_COLUMNS, rows)]
    lines += format_native(result["masked"], result["native"])
    if result["skipped"]:
        lines += ["", "Skipped:", *[f"- {s}" for s in result["skipped"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench gpu-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="vit_b_ape", help="model of the throughput rows (default ViT-B/16, APE)")
    ap.add_argument("--resolutions", nargs="+", type=positive_int, default=[224, 512, 1024])
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--native-model", default=NATIVE_MODEL, help=f"model of the packed-batch check ({NATIVE_MODEL})")
    ap.add_argument("--out", default="results/gpu_check", help="output path without suffix (.json and .md)")
    args = ap.parse_args(argv)
    check_sizes(args.resolutions, "--resolutions")
    check_files(Path(args.out))  # before the check, which a bad --out would otherwise lose
    result = run_check(None, args.model, args.resolutions, args.batch, args.native_model)
    md = format_markdown(result)
    print(md)  # first: a disk that fills up now loses the files, not the numbers
    print("wrote " + " and ".join(map(str, write_files(Path(args.out), result, md))))
    return 0 if result["ok"] else 1
