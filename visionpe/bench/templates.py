"""The Markdown templates beside the benchmark's modules (results_template.md, card_template.md): the text of
results.md and the model cards, in named blocks the report and the cards fill."""

from __future__ import annotations

import re
from pathlib import Path


def template(file: str) -> dict[str, str]:
    """The named blocks of a template file next to this module: each `<!-- name -->` line opens one."""
    parts = re.split(r"^<!-- (\w+) -->\n", (Path(__file__).parent / file).read_text(), flags=re.M)
    return {name: text.rstrip("\n") for name, text in zip(parts[1::2], parts[2::2])}
