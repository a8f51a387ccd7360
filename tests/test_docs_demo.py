"""docs/training.md quotes the documented demo run exactly as its data file records it."""

from __future__ import annotations

import json
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _quoted_evaluations(text: str) -> list[tuple[int, float]]:
    """The (env steps, greedy return) pairs of the page's ``env steps`` / ``return`` lines."""
    steps = [
        int(value.replace(",", ""))
        for line in re.findall(r"^    env steps (.*)$", text, re.MULTILINE)
        for value in line.split()
    ]
    returns = [
        float(value)
        for line in re.findall(r"^    return (.*)$", text, re.MULTILINE)
        for value in line.split()
    ]
    assert len(steps) == len(returns)
    return list(zip(steps, returns, strict=True))


def test_the_training_page_quotes_the_documented_run() -> None:
    text = (DOCS / "training.md").read_text()
    run = json.loads((DOCS / "demo-run.json").read_text())
    assert _quoted_evaluations(text) == [
        (e["env_steps"], e["greedy_return"]) for e in run["evaluations"]
    ]
    summary = (
        f"{run['env_steps']:,} env steps, {run['rows_sampled']:,} rows sampled, "
        f"{run['written_mb']} MB written,\n{run['elapsed_s']} s"
    )
    assert summary in text
    for picture in ("demo-learning-curve.png", "demo-plot.png"):
        assert f"]({picture})" in text
        assert (DOCS / picture).read_bytes().startswith(b"\x89PNG")
