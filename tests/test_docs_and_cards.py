"""The documentation links only to files in the repository, and the model cards follow the Hugging Face convention."""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from visionpe.bench.cards import write_cards
from visionpe.papers import PAPERS
from visionpe.zoo.registry import FAMILIES

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _local_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


DOCS = [
    "README.md",
    *sorted(p.relative_to(REPO).as_posix() for p in [*REPO.glob("docs/*.md"), *REPO.glob("model_cards/*.md")]),
]


@pytest.mark.parametrize("doc", DOCS)
def test_docs_link_only_to_files_in_the_repository(doc):
    path = REPO / doc
    for target in _local_links(path):
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(REPO), f"{doc} links outside the repository: {target}"
        assert resolved.exists(), f"{doc} links to a missing file: {target}"


def test_docs_cover_the_design_the_pes_and_timm_usage():
    pes = (REPO / "docs" / "pes.md").read_text()
    for kind in ("ape", "sincos", "rope2d", "rope2d_mixed", "irpe", "rpb", "cpe", "lepe", "fuzzy", "mrope", "vrope"):
        assert f"(`{kind}" in pes, f"docs/pes.md lacks a section for {kind}"
    usage = (REPO / "docs" / "using_with_timm.md").read_text()
    assert "--device-modules visionpe" in usage and "import visionpe" in usage
    design = (REPO / "docs" / "design.md").read_text()
    assert all(site in design for site in ("| tokens |", "| qk |", "| logits |", "| values |", "| block |"))


@pytest.fixture(scope="module")
def cards(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("cards")
    return {p.stem: p.read_text() for p in write_cards(REPO / "results", out)}


def test_committed_cards_are_what_the_committed_results_generate(tmp_path):
    # a result rerun (or a card writer changed) without `visionpe-bench cards` leaves a stale card: it fails here
    shutil.copytree(REPO / "results", tmp_path / "results")  # the cards' relative links as from the repository root
    for path in write_cards(tmp_path / "results", tmp_path / "model_cards"):
        family, text = path.stem, path.read_text()
        committed = (REPO / "model_cards" / f"{family}.md").read_text()
        assert committed == text, f"model_cards/{family}.md is stale: run `visionpe-bench cards`"


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n"), "a Hugging Face card opens with a YAML block"
    return yaml.safe_load(text.split("---\n")[1])


def test_every_family_card_has_hub_metadata_and_the_sections(cards):
    assert set(cards) == set(FAMILIES)
    for name, text in cards.items():
        meta = _front_matter(text)
        assert meta["library_name"] == "timm" and meta["license"] == "apache-2.0", name
        assert "timm" in meta["tags"] and meta["metrics"] == ["accuracy"] and meta["pipeline_tag"], name
        for section in ("## Model details", "## How to use", "## Intended use", "## Training data and recipe",
                        "## Evaluation results", "## Limitations", "## Citation"):  # fmt: skip
            assert f"\n{section}\n" in text, f"{name} card lacks {section}"


def test_cards_cite_every_paper_of_the_family_in_bibtex(cards):
    for name, fam in FAMILIES.items():
        ids = {c["paper_ids"] for c in [fam.cfg, *fam.pe_cfg.values()] if c.get("paper_ids")}
        for paper in ids:
            key = PAPERS[paper.removeprefix("arXiv:")].key
            assert f"@misc{{{key}," in cards[name], f"{name} card lacks the BibTeX of {paper}"


def test_cards_report_the_seed_spread_of_every_committed_result(cards):
    for summary in REPO.glob("results/*/summary.json"):
        data = yaml.safe_load(summary.read_text())  # JSON is YAML
        if len(data["seeds"]) < 2:
            continue
        families = {m.split("_")[0] for m in data["models"]}
        for fam in families:
            section = cards[fam].split("## Evaluation results")[1].split("\n## ")[0]
            assert f"### {data['name']}:" in section, f"{fam} card lacks results/{data['name']}"
            assert " ± " in section, f"{fam} card gives means without their spread"


def test_the_usage_code_of_every_card_runs(cards):
    for name, text in cards.items():
        code = text.split("## How to use")[1].split("```python\n")[1].split("```")[0]
        scope: dict = {}
        exec(compile(code, f"<{name} card>", "exec"), scope)  # noqa: S102  (our own generated snippet)
        assert scope["logits"].shape == (2, 10), name


def test_multi_seed_video_benchmark_feeds_the_card(tmp_path):
    """The extrapolation benchmark covers video models over seeds (what a separate seeds command once did)."""
    from visionpe.bench.extrapolate import load_bench, run_benchmark
    from visionpe.recipes import resolve_recipe

    recipe = yaml.safe_load(resolve_recipe("video_shapes_vivit_n").read_text())
    recipe["data"].update(batch_size=4, options=dict(num_samples=8, frames=2))
    recipe["train"].update(epochs=1)
    recipe["model"]["kwargs"] = dict(depth=1)
    bench = dict(name="tiny", models=["vivit_n_ape"], seeds=[0, 1], resolutions=[24], protocols=["upsample"],
                 position_modes=["extrapolate"], output_dir=str(tmp_path / "results" / "{name}"),
                 runs_dir=str(tmp_path / "runs"))  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(bench=bench, **recipe)))
    out = run_benchmark(*load_bench(path), log=lambda *_: None)
    data = yaml.safe_load((out / "summary.json").read_text())  # JSON is YAML
    assert data["seeds"] == [0, 1] and [tuple(s) for s in data["sizes"]] == [(24, 24), (32, 32)]
    evals = [yaml.safe_load(p.read_text()) for p in sorted(out.glob("evals/*.json"))]
    assert [e["seed"] for e in evals] == [0, 1]
    keys = ("protocol", "mode", "frames", "height", "width")
    assert len({(r["model"], *(r[k] for k in keys)) for r in data["table"]}) == len(data["table"]) == 2
    for row in data["table"]:  # the summary's mean and spread are those of the two runs at that point
        top1 = [r["top1"] for e in evals for r in e["rows"] if all(r[k] == row[k] for k in keys)]
        assert row["n"] == 2 and len(top1) == 2 and abs(row["mean"] - sum(top1) / 2) < 1e-9  # mean of two: 1 ulp
        assert abs(row["std"] - abs(top1[0] - top1[1]) / 2**0.5) < 1e-9  # sample std of two values
    (card,) = write_cards(tmp_path / "results", tmp_path / "cards", ["vivit"])
    text = card.read_text()
    assert (
        "### tiny: trained at 32 px, 2 seeds" in text
        and "visionpe-bench extrapolate -c results/tiny/bench.yaml" in text
    )


def test_card_metadata_is_the_yaml_huggingface_hub_writes_for_the_same_keys():
    hub = pytest.importorskip("huggingface_hub")
    from visionpe.bench.cards import card_metadata

    summaries = [(p, json.loads(p.read_text())) for p in sorted(REPO.glob("results/*/summary.json"))]
    for fam in FAMILIES.values():  # the families with a benchmark of theirs get a `datasets` key too
        text = card_metadata(fam, summaries)
        meta = _front_matter(text)
        assert text == f"---\n{hub.ModelCardData(**meta).to_yaml()}\n---\n", fam.name
        assert meta["pipeline_tag"] in ("image-classification", "video-classification", "visual-question-answering")


def test_cards_show_per_pe_cost_ratios_with_their_spread_from_any_speed_file(tmp_path):
    from visionpe.bench.perf.measure import Spread
    from visionpe.bench.perf.speed import main as speed_main

    out = tmp_path / "results" / "speed" / "irpe"
    args = ["--models", "vit_n_ape", "vit_n_irpe", "--resolutions", "32", "--infer", "--mode", "time"]
    assert speed_main([*args, "--rounds", "2", "--steps", "1", "--batch", "2", "--no-timm", "--out", str(out)]) == 0
    row = next(r for r in yaml.safe_load(out.with_suffix(".json").read_text())["rows"] if r["model"] == "vit_n_irpe")
    (card,) = write_cards(tmp_path / "results", tmp_path / "cards", ["vit"])
    section = card.read_text().split("### Cost against a baseline: irpe")[1].split("\n## ")[0]
    ratio = Spread(
        **row["infer_vs_base"]
    ).text()  # median [min-max] of the per-round ratios, as the speed file has them
    assert f"| vit_n_irpe | 32 | - | vit_n_ape | {ratio} |" in section and "| vit_n_ape | 32 |" not in section


def test_cards_show_memory_only_speed_files_against_their_baseline(tmp_path):
    import json

    def row(model, mb):
        return dict(model=model, resolution=1024, tokens=4096, params_m=1.0, infer_mem_mb=mb, baseline="vit_b_ape")

    speed = tmp_path / "results" / "speed"
    speed.mkdir(parents=True)
    machine = dict(cpu="test cpu", cores=2, threads=1, torch="x", timm="y", device="cpu", date="2026-01-01")
    data = dict(
        machine=machine,
        settings=dict(batch=1, rounds=3, mode="memory"),
        rows=[row("vit_b_ape", 200.0), row("vit_b_irpe", 230.0)],
    )
    (speed / "vit_b_memory.json").write_text(json.dumps(data))
    (card,) = write_cards(tmp_path / "results", tmp_path / "cards", ["vit"])
    section = card.read_text().split("### Cost against a baseline: vit_b_memory")[1].split("\n## ")[0]
    assert "| vit_b_irpe | 1024 | - | vit_b_ape | - | - | 1.15 / - |" in section  # 230 / 200 MiB


def _measured_models() -> set[str]:
    """Every model with a committed accuracy or speed result (read from the results files directly)."""
    found = set()
    for summary in REPO.glob("results/*/summary.json"):
        found |= set(yaml.safe_load(summary.read_text())["models"])
    for speed in REPO.glob("results/speed/*.json"):
        found |= {r["model"] for r in yaml.safe_load(speed.read_text()).get("rows", [])}
    return found


def test_cards_list_every_pe_of_the_zoo_and_say_which_have_no_results(cards):
    measured = _measured_models()
    for name, fam in FAMILIES.items():
        table = cards[name].split("### PE variants\n\n")[1].split("\n\n")[0].splitlines()[2:]
        rows = {r.split(" | ")[0].strip("| `"): r.rsplit(" | ", 1)[1].removesuffix(" |") for r in table}
        assert set(rows) == {pe or "(none)" for pe in fam.pes}, name
        for pe in fam.pes:
            models = {f"{name}_{size}" + (f"_{pe}" if pe else "") for size in fam.sizes}
            assert (rows[pe or "(none)"] == "none yet") == (not models & measured), (name, pe, rows[pe or "(none)"])
    assert "| `lookhere_45` |" in cards["vit"] and "| `hope` |" in cards["mm"]
