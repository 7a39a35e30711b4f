"""The orderings PE papers claim, judged on a benchmark's own numbers.

Each claim is a list of (better PE, worse PE) pairs and where it is meant to hold (beyond the training size or clip
length, at the training point, or everywhere). At each evaluation point and position mode where a benchmark has both
models of a pair (same backbone), the difference of their mean top-1 over seeds is compared with its standard error
sqrt(s_a^2 / n_a + s_b^2 / n_b): 'holds' when the better PE leads by at least twice that, 'does not hold' when it
trails by as much, 'within noise' otherwise, and 'one seed' when a spread cannot be estimated.
"""

from __future__ import annotations

import math

from ..papers import CLAIMS, Claim

__all__ = ["Claim", "CLAIMS", "VERDICTS", "standard_error", "verdict", "judge_claims", "tally_text"]

VERDICTS = ("holds", "does not hold", "within noise", "one seed")


def standard_error(a: dict, b: dict) -> float:
    """Standard error of mean_a - mean_b from each side's sample std and number of seeds."""
    return math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])


def verdict(a: dict, b: dict) -> str:
    """Whether 'a above b' holds on {'mean', 'std', 'n'} statistics (see the module docstring)."""
    if a["n"] < 2 or b["n"] < 2:
        return "one seed"
    diff, se = a["mean"] - b["mean"], standard_error(a, b)
    if abs(diff) < 2 * se or diff == 0:
        return "within noise"
    return "holds" if diff > 0 else "does not hold"


def _is_beyond(point, base) -> bool:
    if point.protocol == "frames":
        return point.frames > base.frames
    return point.height * point.width > base.height * base.width


def _selected(point, base, where: str) -> bool:
    if where == "base":
        return point == base
    if where == "beyond":
        return _is_beyond(point, base)
    return True


def judge_claims(stats: dict, records: list[dict], points: list, modes: list[str], base_of) -> list[dict]:
    """Every claim judged at every point and mode where the benchmark has both models of a pair.

    stats: (model, mode, point) -> {'mean', 'std', 'n'}; records: per-run records (model, family, size, pe);
    base_of(protocol) -> the training point of that protocol."""
    by_pe: dict[str, list[dict]] = {}
    for rec in records:
        by_pe.setdefault(rec.get("pe"), [])
        if all(r["model"] != rec["model"] for r in by_pe[rec.get("pe")]):
            by_pe[rec.get("pe")].append(rec)
    out = []
    for claim in CLAIMS:
        comparisons, present = [], []
        for good, bad in claim.pairs:
            for ra in by_pe.get(good, []):
                for rb in by_pe.get(bad, []):
                    if (ra.get("family"), ra.get("size")) != (rb.get("family"), rb.get("size")):
                        continue
                    present.append([ra["model"], rb["model"]])
                    for mode in modes:
                        for point in points:
                            if claim.protocols and point.protocol not in claim.protocols:
                                continue
                            if not _selected(point, base_of(point.protocol), claim.where):
                                continue
                            a, b = stats.get((ra["model"], mode, point)), stats.get((rb["model"], mode, point))
                            if a is None or b is None:
                                continue
                            comparisons.append(
                                dict(
                                    better=ra["model"],
                                    worse=rb["model"],
                                    protocol=point.protocol,
                                    mode=mode,
                                    height=point.height,
                                    width=point.width,
                                    frames=point.frames,
                                    a=dict(a),
                                    b=dict(b),
                                    diff=a["mean"] - b["mean"],
                                    se=standard_error(a, b),
                                    verdict=verdict(a, b),
                                )
                            )
        tally = {v: sum(c["verdict"] == v for c in comparisons) for v in VERDICTS}
        out.append(
            dict(
                claim=claim.text,
                source=claim.source,
                pairs=[list(p) for p in claim.pairs],
                present=present,  # the (better, worse) model pairs the benchmark has, compared or not
                where=claim.where + (f" ({', '.join(claim.protocols)})" if claim.protocols else ""),
                comparisons=comparisons,
                tally=tally,
            )
        )
    return out


def tally_text(judged: dict) -> str:
    """'upsample: holds at 5 of 8 comparisons, within noise at 3; fov: ...' or why nothing was compared."""
    comparisons = judged["comparisons"]
    if not comparisons and judged.get("present"):
        models = "; ".join(" and ".join(pair) for pair in judged["present"])
        where = judged["where"]
        return f"not measured: this benchmark has {models}, but no evaluation point where the claim applies ({where})"
    if not comparisons:
        pes = sorted({pe for pair in judged["pairs"] for pe in pair})
        return f"not measured: this benchmark lacks models with the PEs {', '.join(pes)} on one backbone"
    parts = []
    for protocol in dict.fromkeys(c["protocol"] for c in comparisons):
        rows = [c for c in comparisons if c["protocol"] == protocol]
        mine = [c["verdict"] for c in rows]
        counts = ", ".join(f"{v} at {mine.count(v)}" for v in VERDICTS if v in mine)
        ahead = sum(c["diff"] > 0 for c in rows if c["verdict"] == "one seed")
        signs = f" (the claimed-better PE ahead at {ahead})" if "one seed" in mine else ""
        parts.append(f"{protocol}: {counts}{signs} of {len(mine)} comparison(s)")
    return "; ".join(parts)
