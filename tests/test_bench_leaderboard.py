"""The leaderboard: scores beyond the training point, ranks with ties from Welch's test, and the committed file and
README head are what the committed results give."""

import csv
import io
import statistics
from pathlib import Path

import pytest

from visionpe.bench.leaderboard import leaderboard, ranked, scores, with_head

REPO = Path(__file__).resolve().parents[1]


def _cell(values):
    return dict(pe="x", seeds=values, base={}, train_cpu_seconds=None)


def test_ranks_share_a_place_only_when_welch_cannot_separate_them():
    got = ranked({
        "a": _cell([80.0, 81.0, 82.0]),
        "b": _cell([79.5, 80.5, 81.5]),  # 0.5 below a: not separable
        "c": _cell([60.0, 61.0, 62.0]),  # 19.5 below b: its own rank
        "d": _cell([40.0, 41.0, 42.0]),
    })  # fmt: skip
    assert [(rank, model) for rank, model, _ in got] == [("=1", "a"), ("=1", "b"), ("3", "c"), ("4", "d")]


def test_scores_average_the_points_beyond_training_per_seed():
    summary = dict(base=[24, 24], base_frames=0, base_tokens=0)
    heads = "model,family,size,pe,seed,protocol,mode,height,width,frames,tokens,top1,train_seconds,train_cpu_seconds"
    lines = [heads]
    for seed, (base, at36, at48) in enumerate([(80, 60, 40), (82, 64, 44)]):
        for size, top1 in ((24, base), (36, at36), (48, at48)):
            lines.append(f"vit_n_ape,vit,n,ape,{seed},upsample,extrapolate,{size},{size},0,0,{top1},130,100")
    lines.append("vivit_n_ape,vivit,n,ape,0,upsample,extrapolate,36,36,0,0,99,130,100")  # not an image family
    got = scores(summary, list(csv.DictReader(io.StringIO("\n".join(lines)))))
    (key,) = got
    assert key == ("upsample", "extrapolate", "vit_n")
    cell = got[key]["vit_n_ape"]
    assert (
        cell["seeds"] == [50.0, 54.0] and cell["base"] == {0: 80.0, 1: 82.0} and cell["train_cpu_seconds"] == 100.0
    )  # CPU, not wall (130)
    assert statistics.fmean(cell["seeds"]) == 52.0


def test_committed_leaderboard_and_readme_head_are_what_the_results_give():
    text, head = leaderboard(REPO / "results")
    committed = (REPO / "results" / "leaderboard.md").read_text()
    assert committed == text, "results/leaderboard.md is stale: run `visionpe-bench leaderboard --readme README.md`"
    readme = (REPO / "README.md").read_text()
    assert with_head(readme, head) == readme, "the README's leaderboard head is stale"
    assert "fashion-mnist-canvas" in head and head.count("\n| ") >= 5


def test_a_readme_without_marks_is_refused_by_name():
    with pytest.raises(ValueError, match="no leaderboard marks"):
        with_head("# a README\n", "table")
