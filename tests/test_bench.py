"""Smoke test of the benchmark: the quick mode runs and writes well-formed results.

No timing is asserted; only the structure, the values the workload fixes exactly, and the
command line's promises (aligned table, ``--check`` exit status, where results go).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from rbzarr import bench
from rbzarr.bench.report import aligned, target
from rbzarr.cli import main
from rbzarr.trajectory import validate

STATS = {"calls", "rows_s", "mb_s", "p50_ms", "p99_ms"}


def run_bench(*args: str) -> Any:
    return CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)


def test_state_and_image_trajectories_have_the_documented_shapes() -> None:
    state, image = bench.state_trajectory(0), bench.image_trajectory(0)
    assert validate(state).shape == (64, 32)
    assert state.curr_obs["state"].shape == (64, 32, 42)
    assert state.dones.shape == (65, 32)
    assert state.actions.dtype == torch.float32 and state.actions.shape == (64, 32, 8)
    assert torch.equal(state.curr_obs["state"][1:], state.next_obs["state"][:-1])
    assert image.curr_obs["image"].shape == (32, 16, 3, 84, 84)
    assert image.curr_obs["image"].dtype == torch.uint8
    assert torch.equal(image.curr_obs["image"][1:], image.next_obs["image"][:-1])
    assert torch.equal(bench.image_trajectory(3).rewards, bench.image_trajectory(3).rewards)


def test_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'video'"):
        bench.workloads(["video"], 8, 8)
    result = CliRunner().invoke(main, ["bench", "--quick", "--workloads", "video"])
    assert result.exit_code == 1
    assert "unknown workload 'video'" in result.output


def test_bad_settings_are_refused_before_any_work(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--quick", "--cache", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "--cache must be positive, got 0" in result.output
    result = CliRunner().invoke(main, ["bench", "--chunk-sweep", "12:lz4", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "expected BYTES or BYTES:none, got '12:lz4'" in result.output
    assert not list(tmp_path.iterdir())


def test_quick_run_writes_json_chart_and_table(tmp_path: Path) -> None:
    result = run_bench(
        "--quick", "--workloads", "state,image,atari", "--out", str(tmp_path / "out"), "--check"
    )
    out = tmp_path / "out" / "sampling.json"
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {out}" in result.output
    assert "[state] hot" not in result.output  # progress only on a terminal
    # --check fails exactly when a measured target is missed.
    missed = [t["target"] for t in document["targets"] if t["met"] is False]
    assert result.exit_code == (1 if missed else 0)
    if missed:
        assert f"{len(missed)} target(s) not met" in result.output

    assert document["benchmark"] == "sampling"
    assert {"cpu_count", "platform"} <= set(document["machine"])
    assert {"python", "torch", "zarr", "numcodecs", "rbzarr"} <= set(document["versions"])
    settings = document["settings"]
    assert (settings["trajectories"], settings["window"], settings["cache"]) == (6, 5, 2)
    results = document["results"]
    assert set(results) >= {"state", "image"}
    if "atari" not in results:
        assert any(note.startswith("atari skipped") for note in document["notes"])

    state = results["state"]
    image = results["image"]
    assert (state["T"], state["B"], image["T"], image["B"]) == (64, 32, 32, 16)
    assert set(state["hot"]["per_row_loop"]) >= STATS
    row_bytes = (42 * 2 + 8 + 3) * 4 + 1  # obs, actions, rewards/logprobs/values, dones
    for workload, entry in results.items():
        for mode in ("limit", "rlinf_style", "buffer"):
            assert set(entry["hot"][mode]) >= STATS
        for fmt in ("zarr", "pt"):
            cold = entry[f"cold_{fmt}"]
            assert set(cold["buffer"]) >= STATS
            assert {"add_p50_ms", "memcpy_p50_ms", "add_vs_memcpy"} <= set(cold["add"])
            assert cold["write"]["raw_mb"] > 0
            assert cold["bytes_read_per_batch"] > 0
        # Every key of the zarr store is accounted for, and every needed chunk was read.
        cold = entry["cold_zarr"]
        assert cold["bytes_read_per_batch"] >= cold["needed_bytes_per_batch"] > 0
        assert set(cold["disk"]["ratio_per_key"]) == {
            "actions", "rewards", "dones", "prev_logprobs", "prev_values",
            f"curr_obs/{'state' if workload == 'state' else 'image'}",
            f"next_obs/{'state' if workload == 'state' else 'image'}",
        }  # fmt: skip
        assert set(cold["limit"]) >= STATS
    assert state["hot"]["row_bytes"] == row_bytes
    assert results["image"]["hot"]["row_bytes"] == 2 * 3 * 84 * 84 + row_bytes - 42 * 2 * 4
    names = {t["target"] for t in document["targets"]}
    assert "image: hot within 1.5x of memory bandwidth" in names
    for entry in document["targets"]:
        assert {"target", "meaning", "value", "threshold", "op", "met"} <= set(entry)
        assert isinstance(entry["met"], bool)
        assert entry["meaning"] in result.output  # the table says what each target means
        assert entry["target"] in result.output
    assert_aligned(result.output)


def assert_aligned(output: str) -> None:
    """In every table, each line has the column gap where the rule under the headers has it."""
    for block in output.split("\n\n"):
        lines = block.splitlines()
        if len(lines) < 3 or not set(lines[1]) <= {"-", " "}:
            continue
        starts = [
            i for i, c in enumerate(lines[1]) if c == "-" and (i == 0 or lines[1][i - 1] == " ")
        ]
        for line in (lines[0], *lines[2:]):
            padded = line.ljust(len(lines[1]))
            assert all(padded[start - 2 : start] == "  " for start in starts[1:]), line


def test_results_never_go_to_the_committed_folder_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = tmp_path / "benchmarks" / "results" / "sampling.json"
    committed.parent.mkdir(parents=True)
    committed.write_text("committed\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    result = run_bench("--quick", "--workloads", "state", "--no-plot")
    assert result.exit_code == 0
    assert committed.read_text() == "committed\n"
    written = list(scratch.glob("rbzarr-bench-*/sampling.json"))
    assert len(written) == 1
    assert f"wrote {written[0]}" in result.output
    assert json.loads(written[0].read_text())["settings"]["workloads"] == ["state"]


def test_targets_and_tables() -> None:
    assert target("t", "m", 2.0, 1.5, "<=")["met"] is False
    assert target("t", "m", 1.5, 1.5, "<=")["met"] is True
    assert target("t", "m", 3.0, 3.0, ">=")["met"] is True
    unmeasured = target("t", "m", None, 3.0, ">=", reason="torchrl is not installed")
    assert (unmeasured["met"], unmeasured["reason"]) == (None, "torchrl is not installed")
    with pytest.raises(ValueError, match="op must be"):
        target("t", "m", 1.0, 1.0, "==")
    documents = [{"targets": [target("a", "m", 1, 2, ">="), unmeasured]}]
    assert [t["target"] for t in bench.failed_targets(documents)] == ["a"]
    text = aligned(["name", "n"], [["a", "1"], ["long name", "1,000"]], [False, True])
    assert text.splitlines() == [
        "name           n",
        "---------  -----",
        "a              1",
        "long name  1,000",
    ]
