"""The figure tables of README.md and docs/benchmarks.md, rendered from benchmarks/results.

Each table sits between ``<!-- figures:NAME -->`` and ``<!-- /figures -->``; its rows are the
targets of the committed results (value, goal, met) with a link to the JSON they come from.
After a committed run, rewrite them from the repository root::

    .venv/bin/python -m benchmarks.figures            # README.md and docs/benchmarks.md

``tests/test_readme_figures.py`` checks that every row matches the JSON it cites.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"
SUITES = (
    "sampling",
    "s3",
    "training",
    "sequences",
    "distributed",
    "scale",
    "images",
    "lifecycle",
)
# The front page's figures: (suite, target) in the order shown.
HEADLINES = (
    ("sampling", "image: hot within 1.5x of one index_select"),
    ("sampling", "state: warm disk rows/s >= TorchRL LazyMemmapStorage"),
    ("sampling", "image: warm disk rows/s >= TorchRL LazyMemmapStorage"),
    ("sampling", "image: warm disk rows/s >= 10x whole-file .pt"),
    ("sampling", "embodied: truly cold rows/s >= 10x whole-file .pt"),
    ("sampling", "embodied: truly cold bytes read <= 1.5x needed"),
    ("sampling", "state: writer >= 200 MB/s raw"),
    ("s3", "s3+cache: steady rows/s >= 0.8x the same store local and warm"),
    ("s3", "s3, no cache: steady rows/s >= 10x today (36.6)"),
    ("training", "training: 10 ms step with prefetch, S3 steps/s >= 0.9x local"),
    ("sequences", "sequences: rows/s >= TorchRL SliceSampler"),
    ("distributed", "Ray actor add+sample >= TorchRL RayReplayBuffer"),
    ("scale", "ms per tiny trajectory at 100,000 vs at 1k, local"),
    ("scale", "resume at 1,000,000 trajectories, local, s"),
    ("scale", "open_buffer + the first sample(256), window 100, s"),
)
BLOCK = re.compile(r"(<!-- figures:(\w+) -->\n)(.*?)(<!-- /figures -->)", re.DOTALL)
# Where each page links the results from.
PAGES = {"README.md": "", "docs/benchmarks.md": "../"}


def results(suite: str, root: Path = ROOT) -> dict[str, Any]:
    """The committed results document of one suite."""
    document: dict[str, Any] = json.loads((root / RESULTS / f"{suite}.json").read_text())
    return document


def number(value: Any) -> str:
    """A figure as the tables print it (thousands separated, as stored)."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int | float) else str(value)


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[met]


def rows(wanted: list[tuple[str, str]], link: str, root: Path = ROOT) -> list[str]:
    """The table rows of ``wanted`` targets, each linking its suite's JSON."""
    documents = {suite: results(suite, root) for suite in dict.fromkeys(s for s, _ in wanted)}
    out = []
    for suite, name in wanted:
        (found,) = (t for t in documents[suite]["targets"] if t["target"] == name)
        source = f"[{suite}.json]({link}{RESULTS}/{suite}.json)"
        out.append(
            f"| {name} | {number(found['value'])} | {number(found['threshold'])} "
            f"| {_met(found['met'])} | {source} |"
        )
    return out


def table(name: str, link: str, root: Path = ROOT) -> str:
    """The markdown table of block ``name``: ``headlines`` or one suite's targets."""
    if name == "headlines":
        wanted = list(HEADLINES)
    else:
        wanted = [(name, t["target"]) for t in results(name, root)["targets"]]
    header = ["| target | value | goal | met | results |", "| --- | ---: | ---: | --- | --- |"]
    return "\n".join([*header, *rows(wanted, link, root)]) + "\n"


def rendered(text: str, link: str, root: Path = ROOT) -> str:
    """``text`` with every figures block rewritten from the results."""
    return BLOCK.sub(lambda m: m[1] + table(m[2], link, root) + m[4], text)


def main() -> None:
    """Rewrite the figure blocks of README.md and docs/benchmarks.md."""
    for page, link in PAGES.items():
        path = ROOT / page
        path.write_text(rendered(path.read_text(), link))
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
