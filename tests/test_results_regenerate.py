"""Every committed benchmark table is what the committed evaluations give: results/<name>/results.md, results.csv
and summary.json regenerate byte for byte from results/<name>/evals/*.json with the file's own recipe (a report
writer changed without regenerating, or an evaluation edited by hand, fails here)."""

import json
import shutil
from pathlib import Path

import pytest

from visionpe.bench.extrapolate import load_bench, make_plan, read_record
from visionpe.bench.report import write_report

RESULTS = Path(__file__).resolve().parents[1] / "results"
BENCHMARKS = sorted(p.parent.name for p in RESULTS.glob("*/summary.json") if (p.parent / "bench.yaml").is_file())


def test_every_extrapolation_result_is_covered():
    assert {"quick", "fashion-mnist-canvas", "video-length", "image-text-tokens"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_committed_tables_regenerate_from_the_committed_evaluations(name, tmp_path):
    folder = tmp_path / name
    shutil.copytree(RESULTS / name, folder)
    bench, cfg = load_bench(folder / "bench.yaml", [f"bench.output_dir={folder}", "bench.device=cpu"])
    plan = make_plan(bench, cfg)
    records = [read_record(j.record_path) for j in plan.jobs if j.record_path.is_file()]
    assert records, f"results/{name}/evals holds no evaluation of its plan"
    last = json.loads((folder / "summary.json").read_text())
    written = write_report(records, plan, folder, float(last["seconds"]), dict(last["machine"]))
    assert {p.name for p in written} >= {"results.md", "results.csv", "summary.json"}
    for file in ("results.md", "results.csv", "summary.json"):
        regenerated, committed = (folder / file).read_bytes(), (RESULTS / name / file).read_bytes()
        assert regenerated == committed, f"results/{name}/{file} differs from what its evals/ give"


def test_report_only_writes_the_tables_from_the_evaluations_present_and_trains_nothing(tmp_path, monkeypatch):
    """`visionpe-bench extrapolate --report-only`: the committed tables from the committed evaluations, byte for
    byte; with a run's evaluation removed, the tables of the rest (that run not trained)."""
    from visionpe.bench import extrapolate

    def no_training(*args, **kwargs):
        raise AssertionError("--report-only ran a job")

    monkeypatch.setattr(extrapolate, "run_job", no_training)
    folder = tmp_path / "quick"
    shutil.copytree(RESULTS / "quick", folder)
    args = ["-c", str(folder / "bench.yaml"), "--report-only", f"bench.output_dir={folder}", "bench.device=cpu"]
    assert extrapolate.main(args) == 0
    for file in ("results.md", "results.csv", "summary.json"):
        assert (folder / file).read_bytes() == (RESULTS / "quick" / file).read_bytes(), file
    dropped = sorted((folder / "evals").glob("*.json"))[0]
    dropped.unlink()
    assert extrapolate.main(args) == 0
    trained = json.loads((folder / "summary.json").read_text())["training"]  # a model per run: one seed each
    assert len(trained) == len(list((RESULTS / "quick" / "evals").glob("*.json"))) - 1
