"""Smoke test of the benchmark: the quick mode runs and writes well-formed results.

No timing is asserted; only the structure, the values the workloads fix exactly, the byte
accounting against zarr's own shard writer, and the command line's promises (aligned
tables, ``--check`` exit status, where results go).  TorchRL is optional: where it is not
installed its figures are ``unavailable`` and the targets that need it ``met: null``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import fsspec
import imagecodecs
import numcodecs
import numpy as np
import pytest
import torch
import zarr
from click.testing import CliRunner
from zarr.codecs import ZstdCodec
from zarr.storage import LocalStore

import benchmarks as bench
from benchmarks.__main__ import main
from benchmarks.accounting import StoreGeometry, coalesce
from benchmarks.report import aligned, target
from benchmarks.torchrl_peer import torchrl_missing
from benchmarks.workloads import image_trajectory
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory.model import validate

STATS = {"calls", "rows_s", "mb_s", "p50_ms", "p99_ms"}
TORCHRL_TARGETS = {
    "state: warm disk rows/s >= TorchRL LazyMemmapStorage",
    "image: warm disk rows/s >= TorchRL LazyMemmapStorage",
}
SAMPLING_TARGETS = TORCHRL_TARGETS | {
    "state: warm disk rows/s >= 10x whole-file .pt",
    "image: warm disk rows/s >= 10x whole-file .pt",
    "image: truly cold rows/s >= 10x whole-file .pt",
    "embodied: truly cold rows/s >= 10x whole-file .pt",
    "image: truly cold bytes read <= 1.5x needed",
    "embodied: truly cold bytes read <= 1.5x needed",
    "image: writer >= 300 MB/s raw",
    "state: writer >= 200 MB/s raw",
    "state: on-disk size <= 1.2x raw",
    "state: add_trajectories <= 2x a clone",
    "image: add_trajectories <= 2x a clone",
    "image: hot within 1.5x of one index_select",
}
S3_TARGETS = {
    "s3: requests per batch <= distinct needed ranges",
    "s3: bytes <= 1.5x (needed + range_gap per request)",
    "s3: ms the delay adds to a batch <= 3 x delay x ceil(requests / concurrency)",
    "s3+cache: steady rows/s >= 0.8x the same store local and warm",
    "s3+cache: bytes fetched <= 1.2x the store's data, over many passes",
    "s3+cache: first 256-row batch, cold cache, <= 2 s",
    "s3, no cache: steady rows/s >= 10x today (36.6)",
    "s3+cache: GETs a writing buffer makes for its own misses = 0",
}


def run_bench(*args: str) -> Any:
    return CliRunner().invoke(main, [*args], catch_exceptions=False)


def test_trajectories_have_the_documented_shapes() -> None:
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
    embodied = bench.embodied_trajectory(0, T=4, B=2)
    for side in (embodied.curr_obs, embodied.next_obs):
        assert side["camera_0"].shape == side["camera_1"].shape == (4, 2, 3, 128, 128)
        assert side["camera_0"].dtype == torch.uint8
        assert side["state"].shape == (4, 2, 32)
    assert embodied.actions.shape == (4, 2, 8, 7)
    assert torch.equal(embodied.curr_obs["camera_1"][1:], embodied.next_obs["camera_1"][:-1])


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'video'"):
        bench.workloads(["video"], {})
    result = CliRunner().invoke(main, ["--quick", "--workloads", "video"])
    assert result.exit_code == 1
    assert "unknown workload ['video']" in result.output
    result = CliRunner().invoke(main, ["--quick", "--suites", "gpu"])
    assert result.exit_code == 1
    assert "unknown suite ['gpu']" in result.output


def test_bad_settings_are_refused_before_any_work(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--quick", "--cache", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "--cache must be positive, got 0" in result.output
    result = CliRunner().invoke(main, ["--warm-calls", "-1", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "--warm-calls must be positive, got -1" in result.output
    assert not list(tmp_path.iterdir())


def test_quick_run_writes_json_chart_and_tables(tmp_path: Path) -> None:
    result = run_bench(  # the training suite has its own smoke test (test_prefetch.py)
        "--quick",
        "--suites",
        "sampling,s3",
        "--workloads",
        "state,image,embodied",
        "--out",
        str(tmp_path),
    )
    assert result.exit_code == 0
    documents = {
        name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("sampling", "s3")
    }
    assert (tmp_path / "sampling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("sampling", "s3"):
        assert f"wrote {tmp_path / name}.json" in result.output
    assert "[state] hot" not in result.output  # progress only on a terminal
    assert_aligned(result.output)
    sampling, s3 = documents["sampling"], documents["s3"]
    for document in documents.values():
        assert {"cpu_count", "platform"} <= set(document["machine"])
        assert {"python", "torch", "zarr", "numcodecs", "rbzarr"} <= set(document["versions"])
        for entry in document["targets"]:
            assert {"target", "meaning", "value", "threshold", "op", "met"} <= set(entry)
            assert entry["target"] in result.output
            # The table says what each target means, or why it was not measured.
            assert (entry["meaning"] if entry["met"] is not None else entry["reason"]) in (
                result.output
            )
    assert {t["target"] for t in sampling["targets"]} == SAMPLING_TARGETS
    assert {t["target"] for t in s3["targets"]} == S3_TARGETS
    assert_sampling_results(sampling)
    assert_s3_results(s3)


def assert_sampling_results(document: dict[str, Any]) -> None:
    settings = document["settings"]
    assert (settings["trajectories"], settings["window"], settings["cache"]) == (6, 5, 2)
    results = document["results"]
    assert set(results) == {"state", "image", "embodied"}
    state, image, embodied = results["state"], results["image"], results["embodied"]
    assert (state["T"], state["B"], image["T"], image["B"]) == (64, 32, 32, 16)
    assert (embodied["T"], embodied["B"]) == (8, 4)
    row_bytes = (42 * 2 + 8 + 3) * 4 + 1  # obs, actions, rewards/logprobs/values, dones
    assert state["hot"]["row_bytes"] == row_bytes
    assert image["hot"]["row_bytes"] == 2 * 3 * 84 * 84 + row_bytes - 42 * 2 * 4
    assert set(state["hot"]["per_row_loop"]) >= STATS
    for name, entry in results.items():
        assert entry["same_rows"] is True  # both buffers returned exactly the drawn rows
        for mode, _, figures in bench.report.variants(entry):
            if "unavailable" in figures:
                assert figures["unavailable"] == torchrl_missing()
            else:
                assert set(figures) >= STATS, (name, mode)
                assert figures.get("same_rows", True) is True
        for key in ("writes", "writes_pt"):
            writes = entry[key]
            assert writes["writer"]["raw_mb"] > 0
            assert {"add_p50_ms", "memcpy_p50_ms", "add_vs_memcpy"} <= set(writes["add"])
        assert set(entry["writes"]["disk"]["ratio_per_key"]) == set(
            bench.workloads([name], {}, quick=True)[0][0].make(0).tensors()
        )
    assert {"hot", "warm"} <= set(state) and "cold" not in state
    assert {"hot", "warm", "cold"} <= set(image)
    assert "cold" in embodied and "warm" not in embodied
    for entry in (image, embodied):
        cold = entry["cold"]
        assert cold["evict_method"].startswith("posix_fadvise")  # quick: never the whole cache
        assert cold["needed"]["bytes_per_batch"] > 0
        assert cold["needed"]["ranges_per_batch"] <= cold["needed"]["chunks_per_batch"]
    missing = torchrl_missing()
    for entry in document["targets"]:
        if entry["target"] in TORCHRL_TARGETS and missing is not None:
            assert entry["met"] is None and entry["reason"] == missing
        else:
            assert isinstance(entry["met"], bool), entry


def assert_s3_results(document: dict[str, Any]) -> None:
    result = document["results"]["image"]
    assert (result["T"], result["B"], result["batch"], result["delay_s"]) == (8, 4, 32, 0.02)
    steady = result["steady_median"]
    assert steady["needed_ranges"] > 0 and steady["needed_bytes"] > 0
    assert steady["requests"] > 0 and steady["bytes"] > 0
    assert len(result["steady_batches"]) == 2
    assert result["undelayed_seconds"] > 0
    assert all(isinstance(t["met"], bool) for t in document["targets"])


def assert_aligned(output: str) -> None:
    """In every table, each line has the column gap where the rule under the headers has it."""
    tables = 0
    for block in output.split("\n\n"):
        notes = ("wrote", "s3:", "the same batches")
        lines = [line for line in block.splitlines() if not line.startswith(notes)]
        if len(lines) < 3 or not set(lines[1]) <= {"-", " "}:
            continue
        tables += 1
        starts = [i for i, c in enumerate(lines[1]) if c == "-" and lines[1][i - 1] == " "]
        for line in (lines[0], *lines[2:]):
            padded = line.ljust(len(lines[1]))
            assert all(padded[start - 2 : start] == "  " for start in starts), line
    assert tables >= 5


def test_check_fails_exactly_when_a_measured_target_is_missed(tmp_path: Path) -> None:
    result = run_bench(
        "--quick", "--suites", "sampling", "--workloads", "state", "--check", "--out", str(tmp_path)
    )
    document = json.loads((tmp_path / "sampling.json").read_text())
    missed = [t["target"] for t in document["targets"] if t["met"] is False]
    assert result.exit_code == (1 if missed else 0)
    if missed:
        assert f"{len(missed)} target(s) not met: {'; '.join(missed)}" in result.output
    unmeasured = [t for t in document["targets"] if t["met"] is None]
    assert {t["target"].split(":")[0] for t in unmeasured} >= {"image", "embodied"}
    documents = [{"targets": [target("a", "m", 1, 2, ">="), target("b", "m", 3, 2, ">=")]}]
    assert [t["target"] for t in bench.failed_targets(documents)] == ["a"]


def test_without_torchrl_its_figures_are_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchrl", None)  # import torchrl raises ImportError
    result = run_bench(
        "--quick", "--suites", "sampling", "--workloads", "state", "--out", str(tmp_path)
    )
    assert result.exit_code == 0
    state = json.loads((tmp_path / "sampling.json").read_text())["results"]["state"]
    reason = torchrl_missing()
    assert reason is not None and "torchrl is not installed" in reason
    assert state["hot"]["torchrl_tensor"] == {"unavailable": reason}
    assert state["warm"]["torchrl_memmap"] == {"unavailable": reason}
    targets = json.loads((tmp_path / "sampling.json").read_text())["targets"]
    (peer,) = [
        t for t in targets if t["target"] == "state: warm disk rows/s >= TorchRL LazyMemmapStorage"
    ]
    assert (peer["met"], peer["value"], peer["reason"]) == (None, None, reason)
    assert "n/a" in result.output


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
    result = run_bench("--quick", "--suites", "sampling", "--workloads", "state", "--no-plot")
    assert result.exit_code == 0
    assert committed.read_text() == "committed\n"
    written = list(scratch.glob("rbzarr-bench-*/sampling.json"))
    assert len(written) == 1
    assert f"wrote {written[0]}" in result.output
    assert json.loads(written[0].read_text())["settings"]["workloads"] == ["state"]


def one_shard(
    root: Path, name: str, data: np.ndarray, chunks: tuple[int, ...], compressors: Any
) -> None:
    """Write ``data`` as array ``name`` of a local store: one shard of ``chunks``."""
    array = zarr.create_array(
        LocalStore(root),
        name=name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=chunks,
        shards=data.shape,
        compressors=compressors,
    )
    array[...] = data


def test_needed_ranges_follow_zarrs_own_shard_index(tmp_path: Path) -> None:
    data = np.arange(6 * 4 * 3 * 2, dtype=np.uint8).reshape(6, 4, 3, 2)  # [T, B, 3, 2]
    one_shard(tmp_path, "trajectories/0/obs", data, (1, 2, 3, 2), ZstdCodec(level=1))
    geometry = StoreGeometry(fsspec.filesystem("file"), str(tmp_path), ["obs"], T=6, B=4)
    # Flat rows 0, 1, 5, 23 are (t, b) = (0, 0), (0, 1), (1, 1), (5, 3): three inner chunks.
    needed = geometry.needed({0: [0, 1, 5, 23]})
    assert needed.chunks == 3
    decoded = {}
    shard = tmp_path / "trajectories/0/obs/c/0/0/0/0"
    for key, start, stop in needed.ranges:
        assert key == "trajectories/0/obs/c/0/0/0/0"
        raw = numcodecs.Zstd().decode(shard.read_bytes()[start:stop])
        decoded[start] = np.frombuffer(raw, dtype=np.uint8).reshape(1, 2, 3, 2)
    expected = [data[0:1, 0:2], data[1:2, 0:2], data[5:6, 2:4]]
    assert sorted(b.tobytes() for b in decoded.values()) == sorted(e.tobytes() for e in expected)
    everything = geometry.needed({0: list(range(24))})
    assert everything.chunks == 12
    assert everything.bytes == shard.stat().st_size - (12 * 16 + 4)  # all but the index
    assert len(everything.coalesced()) == 1  # zarr writes inner chunks back to back


def test_pieces_of_uncompressed_shards_are_the_rows_own_bytes(tmp_path: Path) -> None:
    data = np.arange(4 * 3 * 2 * 5, dtype=np.float32).reshape(4, 3, 2, 5)  # [T, B, 2, 5]
    one_shard(tmp_path, "trajectories/1/a/b", data, data.shape, None)
    geometry = StoreGeometry(fsspec.filesystem("file"), str(tmp_path), ["a/b"], T=4, B=3)
    needed = geometry.needed({1: [4, 5, 11]})  # (t, b) = (1, 1), (1, 2), (3, 2)
    shard = (tmp_path / "trajectories/1/a/b/c/0/0/0/0").read_bytes()
    assert needed.chunks == 1 and needed.bytes == data.nbytes  # one inner chunk: the array
    assert sorted(shard[start:stop] for _, start, stop in needed.pieces) == sorted(
        data[t, b].tobytes() for t, b in ((1, 1), (1, 2), (3, 2))
    )
    assert needed.piece_bytes == 3 * 10 * 4
    assert len(needed.coalesced_pieces()) == 2  # rows (1, 1) and (1, 2) are adjacent
    assert needed.page_bytes == 4096  # all in the shard's first page


def test_needed_ranges_of_unsharded_arrays_are_whole_chunk_files(tmp_path: Path) -> None:
    data = np.arange(40, dtype=np.float32).reshape(4, 2, 5) + 1
    zarr.create_array(LocalStore(tmp_path), name="trajectories/3/x", data=data, chunks=(2, 2, 5))
    geometry = StoreGeometry(fsspec.filesystem("file"), str(tmp_path), ["x"], T=4, B=2)
    needed = geometry.needed({3: [0, 1, 7]})  # steps 0, 0, 3: chunks 0 and 1
    files = [tmp_path / "trajectories/3/x/c/0/0/0", tmp_path / "trajectories/3/x/c/1/0/0"]
    assert sorted(needed.ranges) == [
        (f"trajectories/3/x/c/{i}/0/0", 0, f.stat().st_size) for i, f in enumerate(files)
    ]


def test_coalesce_merges_adjacent_ranges_of_one_object() -> None:
    ranges = [("a", 10, 20), ("b", 0, 5), ("a", 0, 10), ("a", 30, 40), ("a", 0, 10)]
    assert coalesce(ranges) == [("a", 0, 20), ("a", 30, 40), ("b", 0, 5)]


def test_needed_rows_of_next_obs_stored_once_come_from_curr_obs(tmp_path: Path) -> None:
    T, B = 4, 2
    trajectory = image_trajectory(7, T=T, B=B)  # next[t] == curr[t + 1]
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path)) as buffer:
        buffer.add_trajectories([trajectory])
    fs = fsspec.filesystem("file")
    geometry = StoreGeometry(fs, str(tmp_path), ["next_obs/image"], T=T, B=B)
    # Row (0, 1): stored once, read from curr_obs (1, 1); row (3, 1), the last step: its own.
    for t, b, folder in ((0, 1, "curr_obs"), (T - 1, 1, "next_obs")):
        needed = geometry.needed({0: [t * B + b]})
        assert needed.chunks == 1
        ((key, start, stop),) = needed.ranges
        assert key.startswith(f"trajectories/0/{folder}/image/")
        frame = imagecodecs.qoi_decode(fs.cat_file(f"{tmp_path}/{key}", start=start, end=stop))
        assert torch.equal(
            torch.from_numpy(frame), trajectory.next_obs["image"][t, b].permute(1, 2, 0)
        )


def test_targets_and_tables() -> None:
    assert target("t", "m", 2.0, 1.5, "<=")["met"] is False
    assert target("t", "m", 1.5, 1.5, "<=")["met"] is True
    assert target("t", "m", 3.0, 3.0, ">=")["met"] is True
    unmeasured = target("t", "m", None, 3.0, ">=", reason="torchrl is not installed")
    assert (unmeasured["met"], unmeasured["reason"]) == (None, "torchrl is not installed")
    with pytest.raises(ValueError, match="op must be"):
        target("t", "m", 1.0, 1.0, "==")
    text = aligned(["name", "n"], [["a", "1"], ["long name", "1,000"]], [False, True])
    assert text.splitlines() == [
        "name           n",
        "---------  -----",
        "a              1",
        "long name  1,000",
    ]


@pytest.mark.skipif(torchrl_missing() is not None, reason="needs torchrl")
def test_compressed_list_peer_compresses_every_frame() -> None:
    """TorchRL's ``CompressedListStorage`` peer holds every tensor of a row compressed (rows
    with nested keys kept the frames as they were) and gives the rows back unchanged."""
    from benchmarks.torchrl_peer import TorchRLPeer  # noqa: PLC0415 (torchrl is optional)

    frames = torch.zeros(8, 32, 32, 3, dtype=torch.uint8)  # compressible
    frames[:, 0, 0, 0] = torch.arange(8, dtype=torch.uint8)
    flat = {"curr_obs/main_images": frames, "rewards": torch.arange(8.0)}
    peer = TorchRLPeer([flat], None, "CompressedListStorage")
    row = peer.storage.state_dict()["_storage"][3]
    assert set(row) == set(flat)
    stored = row["curr_obs/main_images"]
    assert isinstance(stored, torch.Tensor) and stored.dtype == torch.uint8
    assert stored.numel() < frames[3].numel() // 4, stored.numel()
    back = peer.get(torch.tensor([3, 6]))
    for key, value in flat.items():
        assert torch.equal(back[key], value[[3, 6]]), key
