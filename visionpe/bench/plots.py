"""The extrapolation plot: top-1 against evaluation size (or clip length), one line per PE, one panel per protocol
and position mode (as in the RoPE-ViT paper's figure); a dotted line marks the training point, error bars are the
seed standard deviation. Non-square evaluation shapes (e.g. 28x56) get a panel of their own per protocol and mode,
one marker per PE and shape; the legend sits below the panels, clear of the data."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_extrapolation"]

_AXES = {
    "upsample": "evaluation resolution (px), content scaled",
    "fov": "canvas size (px), content at training scale",
    "frames": "clip length (frames)",
}


def plot_extrapolation(summary: dict, path: Path) -> Path | None:
    """Draw summary.json's table to `path` (square sizes as lines, non-square shapes in their own panels); None when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the tables do not need it
        return None
    modes = summary["modes"]
    protocols = summary.get("protocols", ["upsample"])
    square = [(p, m) for p in protocols for m in modes]
    oblong = [(p, m) for p, m in square if p != "frames" and _oblong_shapes(summary["table"], p, m)]
    labels = _labels(summary["models"])
    n = len(square) + len(oblong)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.6), sharey=True, squeeze=False)
    for ax, (protocol, mode) in zip(axes[0][len(square) :], oblong):
        _oblong_panel(ax, summary, protocol, mode, labels, len(modes) > 1)
    for ax, (protocol, mode) in zip(axes[0], square):
        ticks: set[int] = set()
        for k, model in enumerate(summary["models"]):
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
            ax.errorbar(
                xs, ys, yerr=es if any(es) else None, marker="o", ms=4, capsize=2, label=labels[model], color=f"C{k}"
            )
        ax.axvline(summary.get("base_frames") if protocol == "frames" else summary["base"][0], color="grey", ls=":")
        if protocol == "frames":
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
            ax.minorticks_off()
        ax.set_title(f"{protocol}, {mode} positions" if len(modes) > 1 else protocol)
        ax.set_xlabel(_AXES[protocol])
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("top-1 accuracy (%)")
    handles, names = axes[0][0].get_legend_handles_labels()
    # below the panels, outside every axes: no curve is hidden behind it
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6) or 1, fontsize=8, frameon=False)
    seeds = len(summary["seeds"])
    fig.suptitle(
        f"{summary['dataset']}: trained at {summary['base'][0]} px"
        + (f", {summary['base_frames']} frames" if "frames" in protocols else "")
        + f", {seeds} seed{'s' if seeds > 1 else ''}",
        fontsize=11,
    )
    rows = -(-len(names) // 6) if names else 0
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))  # leave room for the legend's rows
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


def _oblong_shapes(table: list[dict], protocol: str, mode: str) -> list[tuple[int, int]]:
    """The non-square (height, width) shapes evaluated under `protocol` and `mode`, smallest first."""
    return sorted(
        {
            (r["height"], r["width"])
            for r in table
            if r["mode"] == mode and r.get("protocol", "upsample") == protocol and r["height"] != r["width"]
        },
        key=lambda hw: (hw[0] * hw[1], hw),
    )


def _oblong_panel(ax, summary: dict, protocol: str, mode: str, labels: dict, name_mode: bool) -> None:
    """Top-1 at each non-square shape: shapes on a categorical axis, one marker (with seed error bar) per PE."""
    shapes = _oblong_shapes(summary["table"], protocol, mode)
    models = summary["models"]
    width = 0.8 / max(len(models), 1)
    for k, model in enumerate(models):
        pts = [
            (shapes.index((r["height"], r["width"])), r["mean"], r["std"])
            for r in summary["table"]
            if r["model"] == model
            and r["mode"] == mode
            and r.get("protocol", "upsample") == protocol
            and r["height"] != r["width"]
        ]
        if not pts:
            continue
        xs, ys, es = zip(*sorted(pts))
        offset = (k - (len(models) - 1) / 2) * width  # side by side within a shape: markers do not overlap
        color = f"C{k}"  # the same colour as the model's line in the square panels (same order)
        ax.errorbar([x + offset for x in xs], ys, yerr=es if any(es) else None, fmt="s", ms=4, capsize=2, color=color)
    ax.set_xticks(range(len(shapes)), [f"{h}x{w}" for h, w in shapes])
    ax.set_xlim(-0.6, len(shapes) - 0.4)
    ax.set_title(f"{protocol}, {mode} positions, non-square" if name_mode else f"{protocol}, non-square")
    ax.set_xlabel("evaluation shape (height x width, px)")
    ax.grid(alpha=0.3, axis="y")
