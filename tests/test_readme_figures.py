"""Every benchmark figure README.md and docs/benchmarks.md quote is the committed result it cites.

The figure tables are rendered from ``benchmarks/results`` (``python -m benchmarks.figures``);
here each row is read back and compared with the target of the JSON document it links.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import figures

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(
    r"^\| (?P<target>[^|]+?) \| (?P<value>[^|]+?) \| (?P<goal>[^|]+?) \| (?P<met>[^|]+?) "
    r"\| \[(?P<file>[\w.]+)\]\((?P<path>[^)]+)\) \|$"
)
PAGES = ["README.md", "docs/benchmarks.md"]


def quoted(page: str) -> list[re.Match[str]]:
    """The figure rows of ``page``."""
    return [m for line in (ROOT / page).read_text().splitlines() if (m := ROW.match(line))]


@pytest.mark.parametrize("page", PAGES)
def test_each_quoted_figure_is_the_committed_result_it_cites(page: str) -> None:
    rows = quoted(page)
    assert rows, f"{page} quotes no figure"
    for row in rows:
        cited = (ROOT / page).parent / row["path"]
        assert cited.resolve().parent == ROOT / "benchmarks" / "results", row["path"]
        document = json.loads(cited.read_text())
        (target,) = [t for t in document["targets"] if t["target"] == row["target"]]
        assert row["value"] == f"{target['value']:,}", row["target"]
        assert row["goal"] == f"{target['threshold']:,}", row["target"]
        assert row["met"] == {True: "yes", False: "**no**", None: "n/a"}[target["met"]]


def test_docs_quote_every_target_of_every_suite() -> None:
    rows = {(m["file"], m["target"]) for m in quoted("docs/benchmarks.md")}
    for suite in figures.SUITES:
        for target in json.loads((ROOT / f"benchmarks/results/{suite}.json").read_text())[
            "targets"
        ]:
            assert (f"{suite}.json", target["target"]) in rows


@pytest.mark.parametrize("page", PAGES)
def test_the_tables_are_as_rendered_from_the_results(page: str) -> None:
    text = (ROOT / page).read_text()
    assert text == figures.rendered(text, figures.PAGES[page]), (
        f"{page}: run `python -m benchmarks.figures`"
    )
