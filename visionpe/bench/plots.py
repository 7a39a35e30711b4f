"""The extrapolation plot: top-1 against evaluation resolution, one line per PE, one panel per position mode (as in
the RoPE-ViT paper's figure); a dotted line marks the training resolution, error bars are the seed spread."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_extrapolation"]


def plot_extrapolation(summary: dict, path: Path) -> Path | None:
    """Draw summary.json's table (square sizes only) to `path`; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the tables do not need it
        return None
    modes = summary["modes"]
    labels = _labels(summary["models"])
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.2), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for model in summary["models"]:
            pts = sorted(
                (r["height"], r["mean"], r["std"])
                for r in summary["table"]
                if r["model"] == model and r["mode"] == mode and r["height"] == r["width"]
            )
            if not pts:
                continue
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=es if any(es) else None, marker="o", ms=4, capsize=2, label=labels[model])
        ax.axvline(summary["base"][0], color="grey", ls=":", lw=1)
        ax.set_title(f"{mode} positions")
        ax.set_xlabel("evaluation resolution (px)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("top-1 accuracy (%)")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    seeds = len(summary["seeds"])
    fig.suptitle(
        f"{summary['dataset']}: trained at {summary['base'][0]} px, {seeds} seed{'s' if seeds > 1 else ''}", fontsize=11
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _labels(models: list[str]) -> dict[str, str]:
    """PE names when all models share a backbone prefix (vit_n_ape -> ape), full names otherwise."""
    from .plan import split_name

    parts = {m: split_name(m) for m in models}
    backbones = {(f, s) for f, s, _ in parts.values()}
    if len(backbones) == 1:
        return {m: p[2] for m, p in parts.items()}
    return {m: m for m in models}
