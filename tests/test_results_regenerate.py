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
