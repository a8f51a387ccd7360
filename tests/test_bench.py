"""Smoke test of the benchmark: the quick mode runs and writes well-formed results.

No timing is asserted; only the structure and the values the workload fixes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rbzarr import bench
from rbzarr.trajectory import validate

STATS = {"calls", "rows_s", "mb_s", "p50_ms", "p99_ms"}


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


def test_quick_run_writes_json_and_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sampling.json"
    argv = ["--quick", "--workloads", "state,image,atari", "--out", str(out)]
    argv += ["--workdir", str(tmp_path)]
    assert bench.main(argv) == 0
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "targets:" in capsys.readouterr().out

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
    names = {target["target"] for target in document["targets"]}
    assert "image: hot within 1.5x of memory bandwidth" in names
    assert all(isinstance(target["met"], bool) for target in document["targets"])
