"""`visionpe-bench gpu-check`: versions (torch, CUDA, xformers), attention backends against the math backend per
PE in fp32 and bf16, ViT-B/16 images/s and memory per backend, and the masked attention of native-resolution
batches per backend (flex, xformers block-diagonal, sdpa; fp32/bf16 against math, images/s, memory) with a ViT on
a packed batch against each image alone (docs/benchmark.md, docs/native_resolution.md)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

import visionpe  # noqa: F401  (registers the models)
from visionpe import attn_backend

from ..attn_mask import flex_available
from ..native_check import MODEL_TOLERANCE, check_masked_backend, check_native_model
from ..native_check import TOLERANCE as NATIVE_TOLERANCE
from ..zoo import create_model, family_of
from .measure import Clock, Spread, cuda_peak_mb, interleave, model_step, paired_ratios, spread
from .report import md_table

MASKED_BACKENDS = {"flex": "flex (block mask)", "xformers": "xformers (block-diagonal)", "sdpa": "sdpa (bool mask)"}
NATIVE_MODEL = "vit_b_rope2d_mixed"  # a rotary PE: auto sends its masked calls to flex on CUDA

AGREEMENT_MODELS = {
    "rotary (RoPE-2D)": "vit_n_rope2d_mixed",
    "bias (iRPE contextual)": "vit_n_irpe",
    "bias (Swin RPB + shift mask)": "swin_n_rpb",
    "value (iRPE on q, k, v)": "vit_n_irpe_qkv",
}
# Largest |backend - math| relative to max |math| that passes. fp32: unit roundoff 6e-8, and the two backends order
# the sums of a few hundred products per dot product and softmax row differently, through 2 blocks: ~1e-6 expected,
# 1e-4 leaves room for TF32-free reordering on any kernel. bf16: unit roundoff 3.9e-3 on every stored activation,
# several roundings per block, 2 blocks: a few 1e-2 expected.
TOLERANCE = {"float32": 1e-4, "bfloat16": 6e-2}
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


def xformers_status() -> dict:
    """Installed versions and whether xformers' compiled ops load (and run, on CUDA)."""
    info: dict = dict(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    try:
        info["xformers"] = importlib.metadata.version("xformers")
    except importlib.metadata.PackageNotFoundError:
        return dict(info, xformers=None, usable=False, reason="xformers is not installed (pip install '.[xformers]')")
    reqs = importlib.metadata.requires("xformers") or []
    info["xformers_requires_torch"] = next((r.split(";")[0][5:].strip() for r in reqs if r.startswith("torch")), None)
    try:
        import xformers.ops as xops

        info["ops_import"] = True
    except Exception as e:  # a build for another torch can fail here with an undefined-symbol or version error
        return dict(info, ops_import=False, usable=False, reason=f"import xformers.ops: {type(e).__name__}: {e}")
    try:  # a build for another torch imports with a warning, but its compiled extension does not load
        importlib.import_module("xformers._C")
        info["compiled_ops"] = True
    except (ImportError, OSError) as e:
        why = f"xformers' compiled ops do not load with torch {torch.__version__}: {str(e)[:160]}"
        return dict(info, compiled_ops=False, usable=False, reason=why)
    if not torch.cuda.is_available():
        return dict(info, usable=False, reason="xformers' kernels run on CUDA only")
    try:
        q = torch.randn(1, 16, 2, 32, device="cuda", dtype=torch.float16)
        xops.memory_efficient_attention(q, q, q)
    except Exception as e:
        return dict(info, usable=False, reason=f"memory_efficient_attention failed: {type(e).__name__}: {e}")
    return dict(info, usable=True, reason="")


def _tiny(name: str) -> torch.nn.Module:
    return create_model(name, **family_of(name).tiny)


def _forward(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype, backend: str) -> torch.Tensor:
    mixed = torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), mixed, attn_backend(backend):
        return model(x).float()


def _attempt(row: dict, check: Callable[..., dict], *args, **kwargs) -> dict:
    """`row` with the fields `check(*args, **kwargs)` returns and `ok` (all its `*_ok` fields), or with its error:
    reported, not raised, so the check goes on to the next backend."""
    try:
        out = check(*args, **kwargs)
    except Exception as e:
        return dict(row, error=_error(e), ok=False)
    ok = out.pop("ok") if "ok" in out else all(out[k] for k in out if k.endswith("_ok"))
    return dict(row, **out, ok=ok)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


def _against(ref: torch.Tensor, label: str, model, x, dtype, backend: str) -> dict:
    rel = ((_forward(model, x, dtype, backend) - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    return dict(rel_err=rel, tol=TOLERANCE[label], ok=rel <= TOLERANCE[label])


def agreement(backends: list[str], dtypes: list[torch.dtype], device: str, batch: int = 2) -> list[dict]:
    """Per PE model, dtype and backend: max |backend - math| / max |math| of the logits, and pass/fail. bf16 runs
    under autocast (fp32 weights), as mixed-precision training and inference do."""
    rows = []
    for kind, name in AGREEMENT_MODELS.items():
        torch.manual_seed(0)
        model = _tiny(name).eval().to(device)
        x = torch.randn(batch, 3, 32, 32, device=device)
        for dtype in dtypes:
            label = str(dtype).removeprefix("torch.")
            try:
                ref = _forward(model, x, dtype, "math")
            except Exception as e:  # every backend's row says so, and the check goes on
                err = f"math reference: {_error(e)}"
                rows += [dict(pe=kind, model=name, dtype=label, backend=b, error=err, ok=False) for b in backends]
                continue
            for backend in backends:
                row = dict(pe=kind, model=name, dtype=label, backend=backend)
                rows.append(_attempt(row, _against, ref, label, model, x, dtype, backend))
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
    native / native_build: the model of the packed-batch check; masked_shape: check_masked_backend's sizes."""
    cuda = torch.cuda.is_available()
    device = device or ("cuda" if cuda else "cpu")
    status = xformers_status()
    backends = ["sdpa"] + (["xformers"] if status["usable"] else [])
    dtypes = [torch.float32] + ([torch.bfloat16] if cuda else [])
    result: dict = dict(versions=status, device=device, backends=backends, skipped=[])
    if not status["usable"]:
        result["skipped"].append(f"xformers: {status['reason']}")
    if not cuda:
        result["skipped"].append("bf16 agreement: no CUDA device (bf16 on CPU is not what this check is about)")
    result["agreement"] = agreement(backends, dtypes, device)
    if cuda:
        result["gpu"] = torch.cuda.get_device_name(device)
        result["throughput"] = throughput(["math", *backends], device, throughput_model, tuple(resolutions), batch)
        masked = masked_backends(status["usable"])
        result["masked"] = masked_attention(masked, device, **(masked_shape or {}))
        result["native"] = native_model(masked, device, native, native_build)
    else:
        result["throughput"], result["masked"], result["native"] = [], [], []
        result["skipped"].append("throughput and peak memory of ViT-B/16: no CUDA device")
        result["skipped"].append(
            "masked attention of native-resolution batches (flex, xformers block-diagonal, sdpa): no CUDA device "
            "(on CPU masked calls take sdpa with a boolean mask, tested by tests/test_native_attention.py)"
        )
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
    lines += format_native(result.get("masked", []), result.get("native", []))
    if result["skipped"]:
        lines += ["", "Skipped:", *[f"- {s}" for s in result["skipped"]]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="visionpe-bench gpu-check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="vit_b_ape", help="model of the throughput rows (default ViT-B/16, APE)")
    ap.add_argument("--resolutions", nargs="+", type=int, default=[224, 512, 1024])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--native-model", default=NATIVE_MODEL, help=f"model of the packed-batch check ({NATIVE_MODEL})")
    ap.add_argument("--out", default="results/gpu_check", help="output path without suffix (.json and .md)")
    args = ap.parse_args(argv)
    if args.batch <= 0 or any(r <= 0 for r in args.resolutions):
        ap.error("--batch and --resolutions must be positive")
    result = run_check(None, args.model, args.resolutions, args.batch, args.native_model)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    md = format_markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0 if result["ok"] else 1


# ----------------------------------------------------------------- native-resolution batches (masked attention)


def masked_backends(xformers_usable: bool) -> list[str]:
    """The masked backends this machine can run, in MASKED_BACKENDS order."""
    can = dict(flex=flex_available(), xformers=xformers_usable, sdpa=True)
    return [b for b in MASKED_BACKENDS if can[b]]


def masked_attention(backends: list[str], device: str, **shape) -> list[dict]:
    """One row per backend: `check_masked_backend` (fp32 and bf16 against math, images/s, peak MiB on CUDA);
    `shape`: its rows, length, images_per_row, heads, head_dim, reps."""
    return [_attempt(dict(backend=b, device=str(device)), check_masked_backend, b, device, **shape) for b in backends]


def native_model(
    backends: list[str], device: str, name: str = NATIVE_MODEL, build: Callable[[str], torch.nn.Module] = create_model
) -> list[dict]:
    """One row per backend: `check_native_model` of model `name` on a packed batch of 8 aspect ratios (1:3 to 3:1)."""
    torch.manual_seed(0)
    model = build(name)
    rows = [
        _attempt(dict(backend=b, device=str(device), model=name), check_native_model, model, b, device)
        for b in backends
    ]
    model.cpu()
    return rows


def format_native(masked: list[dict], native: list[dict]) -> list[str]:
    """The Markdown lines of both checks (empty when neither ran)."""
    lines = []
    if masked:
        r0 = next((r for r in masked if "rows" in r), {})
        intro = (
            f"Masked attention of a packed batch ({r0.get('rows', '?')} rows of {r0.get('length', '?')} tokens, "
            f"{r0.get('images', '?')} images) against math; tolerance fp32 {NATIVE_TOLERANCE[torch.float32]:.0e}, "
            f"bf16 {NATIVE_TOLERANCE[torch.bfloat16]:.0e} (max error relative to the output's scale):"
        )
        rows = [dict(r, backend=MASKED_BACKENDS.get(r["backend"], r["backend"])) for r in masked]
        lines += ["", intro, "", *_table(MASKED_COLUMNS, rows)]
    if native:
        intro = (
            f"{native[0]['model']} on a packed batch (8 images, aspect ratios 1:3 to 3:1, two per row) against each "
            f"image alone on math in fp32; tolerance fp32 {MODEL_TOLERANCE[torch.float32]:.0e}, bf16 "
            f"{MODEL_TOLERANCE[torch.bfloat16]:.0e} (logits):"
        )
        lines += ["", intro, "", *_table(NATIVE_COLUMNS, native)]
    return lines
