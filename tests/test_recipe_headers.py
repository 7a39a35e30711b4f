"""Every packaged recipe and benchmark file opens with a short header: its command, its time and its result."""

from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "visionpe" / "configs"
NOTES = Path(__file__).resolve().parents[1] / "docs" / "benchmark_notes.md"


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_header_says_command_time_and_expected_in_15_lines(path):
    lines = path.read_text().splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if line and not line.startswith("#"))]
    comments = [line for line in header if line.startswith("#")]
    assert 3 <= len(comments) <= 15, f"{path.name}: {len(comments)} header comment lines"
    for word in ("command:", "time:", "expected:"):
        assert any(word in line for line in comments), f"{path.name} header lacks {word!r}"


def test_every_benchmark_file_has_its_notes():
    sections = {line[3:].strip() for line in NOTES.read_text().splitlines() if line.startswith("## ")}
    assert {p.stem for p in (CONFIGS / "bench").glob("*.yaml")} <= sections
