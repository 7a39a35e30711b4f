"""The papers' claims (visionpe/papers.py) judged on a benchmark's per-seed top-1: each (better PE, worse PE)
pair compared at every point and mode the claim covers with Welch's test, Holm-corrected per claim, and given a
verdict (VERDICTS); the verdicts tallied in words, and the smallest difference a benchmark's seeds can detect
(docs/benchmark.md, "The papers' claims")."""

from __future__ import annotations

import statistics

from ..data.registry import get_dataset_info
from ..papers import CLAIMS
from .protocols import CLIP_PROTOCOLS, point_fields, point_label
from .stats import ALPHA, detectable_difference, holm, mean_std, welch
from .templates import template

T = template("results_template.md")  # its no_point and no_pair blocks: why a claim was not measured


def chance_level(dataset: str) -> float | None:
    """Top-1 (%) of guessing on a registered dataset; None when its number of classes is not known."""
    try:
        classes = get_dataset_info(dataset).num_classes
    except ValueError:  # a dataset not registered here
        return None
    return 100.0 / classes if classes else None  # image folders know their classes only from the data


def detectable(stats: dict, protocols: list[str]) -> dict:
    """Per protocol: the seeds per model, the median seed spread of its cells and the smallest difference that
    spread and seed count can detect (stats.detectable_difference); {} for a protocol run with one seed."""
    out = {}
    for protocol in protocols:
        cells = [st for (_, _, point), st in stats.items() if point.protocol == protocol and st["n"] > 1]
        if cells:
            n, spread = min(st["n"] for st in cells), statistics.median(st["std"] for st in cells)
            out[protocol] = dict(seeds=n, std=spread, difference=detectable_difference(spread, n))
    return out


VERDICTS = ("holds", "does not hold", "within noise", "uninformative", "one seed")
CHANCE_MARGIN = 5.0  # points above chance a model must reach at a point for a comparison there to count


def is_beyond(point, base) -> bool:
    """Whether a point lies beyond its protocol's training point `base` (where a claim 'beyond' is judged)."""
    if point.protocol == "native":  # a larger budget, or an aspect ratio other than square
        return point.tokens > base.tokens or point.height != point.width
    if point.protocol in CLIP_PROTOCOLS:
        return point.frames > base.frames
    if point.protocol == "patch":  # another patch size: a token grid the model was not trained on, larger or smaller
        return point.patch != base.patch
    return point.height * point.width > base.height * base.width


def _compare(claim, good: str, bad: str, values: dict, repeats: set, points: list, modes: list[str], base_of) -> list:
    """The comparisons of one model pair at every point and mode the claim covers; a cell pair that repeats
    another's evaluations (both rows copied from another mode or protocol) is left out, so it counts once."""
    out = []
    for mode in modes:
        for point in points:
            a, b = values.get((good, mode, point)), values.get((bad, mode, point))
            base = base_of(point.protocol)
            where = {"base": point == base, "beyond": is_beyond(point, base)}.get(claim.where, True)
            copied = (good, mode, point) in repeats and (bad, mode, point) in repeats
            if (not claim.protocols or point.protocol in claim.protocols) and a and b and where and not copied:
                out.append(dict(claim=claim.text, protocol=point.protocol, point=point_label(point), mode=mode,
                                **{k: v for k, v in point_fields(point).items() if k != "protocol"}, a=good, b=bad,
                                a_values=list(a), b_values=list(b), a_stat=mean_std(a), b_stat=mean_std(b),
                                diff=statistics.fmean(a) - statistics.fmean(b)))  # fmt: skip
    return out


def judge(comparisons: list[dict], chance: float | None) -> list[dict]:
    """Each comparison's Welch test (a above b), its 95% interval, Holm's correction over the comparisons that
    count (both sides with two seeds or more, not both within CHANCE_MARGIN of chance) and its verdict."""
    counted = []
    for c in comparisons:
        near = chance is not None and max(c["a_stat"]["mean"], c["b_stat"]["mean"]) < chance + CHANCE_MARGIN
        if min(len(c["a_values"]), len(c["b_values"])) < 2:
            c.update(ci95=None, p=None, p_holm=None, verdict="one seed")
        elif near:
            c.update(ci95=None, p=None, p_holm=None, verdict="uninformative")
        else:
            w = welch(c["a_values"], c["b_values"])
            c.update(ci95=w["ci95"], p=w["p"])
            counted.append(c)
    ahead = holm([c["p"] for c in counted])
    behind = holm([1 - c["p"] for c in counted])  # the reverse claim, b above a
    for c, p_a, p_b in zip(counted, ahead, behind):
        c["p_holm"] = p_a
        c["verdict"] = "holds" if p_a < ALPHA else "does not hold" if p_b < ALPHA else "within noise"
    return comparisons


def judge_claims(values: dict, records: list[dict], points: list, modes: list[str], base_of,
                 chance: float | None = None, repeats: frozenset = frozenset()) -> list[dict]:  # fmt: skip
    """Every claim judged at each point and mode with both models of a pair (one backbone). values: (model, mode,
    point) -> per-seed top-1; base_of: a protocol's training point; repeats: cells whose rows copy another's."""
    by_pe: dict[str, dict[str, dict]] = {}
    for rec in records:
        by_pe.setdefault(rec["pe"], {}).setdefault(rec["model"], rec)
    out = []
    for claim in CLAIMS:
        present = [[ra["model"], rb["model"]] for good, bad in claim.pairs for ra in by_pe.get(good, {}).values()
                   for rb in by_pe.get(bad, {}).values()
                   if (ra["family"], ra["size"]) == (rb["family"], rb["size"])]  # fmt: skip
        found = [c for a, b in present for c in _compare(claim, a, b, values, repeats, points, modes, base_of)]
        comparisons = judge(found, chance)
        out.append(dict(
            claim=claim.text, source=claim.source, pairs=[list(p) for p in claim.pairs],
            present=present,  # the (better, worse) model pairs the benchmark has, compared or not
            where=claim.where + (f" ({', '.join(claim.protocols)})" if claim.protocols else ""),
            comparisons=comparisons, tally={v: sum(c["verdict"] == v for c in comparisons) for v in VERDICTS},
            detectable_holm=detectable_after_holm(comparisons),
        ))  # fmt: skip
    return out


def detectable_after_holm(comparisons: list[dict]) -> dict | None:
    """What a claim's family costs: the difference its seeds detect (80% power) at Holm's first step, one-sided
    p < ALPHA / m over its m counted comparisons, at the median seed spread of their cells; None when none counts."""
    counted = [c for c in comparisons if c["p"] is not None]
    if not counted:
        return None
    spread = statistics.median(st["std"] for c in counted for st in (c["a_stat"], c["b_stat"]))
    n = min(min(len(c["a_values"]), len(c["b_values"])) for c in counted)
    return dict(m=len(counted), seeds=n, std=spread, difference=detectable_difference(spread, n, ALPHA / len(counted)))


def tally_text(judged: dict) -> str:
    """'upsample: holds at 5 of 8 comparisons, within noise at 3; fov: ...' or why nothing was compared."""
    comparisons = judged["comparisons"]
    if not comparisons and judged["present"]:
        return T["no_point"].format(models="; ".join(" and ".join(p) for p in judged["present"]), where=judged["where"])
    if not comparisons:
        return T["no_pair"].format(pes=", ".join(sorted({pe for pair in judged["pairs"] for pe in pair})))
    parts = []
    for protocol in dict.fromkeys(c["protocol"] for c in comparisons):
        mine = [c for c in comparisons if c["protocol"] == protocol]
        verdicts = [c["verdict"] for c in mine]
        counts = ", ".join(f"{v} at {verdicts.count(v)}" for v in VERDICTS if v in verdicts)
        ahead = sum(c["diff"] > 0 for c in mine if c["verdict"] == "one seed")
        signs = f" (the claimed-better PE ahead at {ahead})" if "one seed" in verdicts else ""
        parts.append(f"{protocol}: {counts}{signs} of {len(mine)} comparison(s)")
    return "; ".join(parts)
