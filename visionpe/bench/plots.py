"""The extrapolation plot: top-1 against evaluation size (or clip length), one line per PE, one panel per protocol
and position mode (as in the RoPE-ViT paper's figure); a dotted line marks the training point, error bars are the
seed standard deviation."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_extrapolation"]

_AXES = {
    "upsample": "evaluation resolution (px), content scaled",
    "fov": "canvas size (px), content at training scale",
    "frames": "clip length (frames)",
}


def plot_extrapolation(summary: dict, path: Path) -> Path | None:
    """Draw summary.json's table (square sizes only) to `path`; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the tables do not need it
        return None
    modes = summary["modes"]
    protocols = summary.get("protocols", ["upsample"])
    panels = [(p, m) for p in protocols for m in modes]
    labels = _labels(summary["models"])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), sharey=True, squeeze=False)
    for ax, (protocol, mode) in zip(axes[0], panels):
        ticks: set[int] = set()
        for model in summary["models"]:
            pts = sorted(
                (r["frames"] if protocol == "frames" else r["height"], r["mean"], r["std"])
                for r in summary["table"]
                if r["model"] == model
                and r["mode"] == mode
                and r.get("protocol", "upsample") == protocol
                and r["height"] == r["width"]
            )
            if not pts:
                continue
            xs, ys, es = zip(*pts)
            ticks.update(xs)
            ax.errorbar(xs, ys, yerr=es if any(es) else None, marker="o", ms=4, capsize=2, label=labels[model])
        ax.axvline(summary.get("base_frames") if protocol == "frames" else summary["base"][0], color="grey", ls=":")
        if protocol == "frames":
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
            ax.minorticks_off()
        ax.set_title(f"{protocol}, {mode} positions" if len(modes) > 1 else protocol)
        ax.set_xlabel(_AXES[protocol])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("top-1 accuracy (%)")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    seeds = len(summary["seeds"])
    fig.suptitle(
        f"{summary['dataset']}: trained at {summary['base'][0]} px"
        + (f", {summary['base_frames']} frames" if "frames" in protocols else "")
        + f", {seeds} seed{'s' if seeds > 1 else ''}",
        fontsize=11,
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
