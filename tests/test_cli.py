"""The ``rbzarr`` command, run as a real subprocess on stores built by the buffer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.view import open_buffer

TRAJECTORIES = [
    make_trajectory(4, 2, 0, epochs=2),
    make_trajectory(6, 2, 8),
    make_trajectory(4, 2, 20),
]


def rbzarr(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbzarr", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


def ok_json(*args: object):
    result = rbzarr(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def build(path: Path, fmt: str) -> Path:
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, trajectory_format=fmt) as b:
        b.add_trajectories(TRAJECTORIES)
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    return {fmt: build(root / fmt, fmt) for fmt in ("zarr", "pt")}


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def raw_bytes(key: str) -> int:
    return sum(t.tensors()[key].numel() * t.tensors()[key].element_size() for t in TRAJECTORIES)


def test_info_zarr(stores):
    root = stores["zarr"]
    first = TRAJECTORIES[0].tensors()
    keys = {}
    for key, value in first.items():
        keys[key] = {
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": list(value.shape),
            # Layout 2: one shard per array, small keys one uncompressed inner chunk.
            "chunks": list(value.shape),
            "shards": list(value.shape),
            "codec": f"sharding(chunks={list(value.shape)}, none)",
            "codec_spec": "raw",
            "raw_bytes": raw_bytes(key),
            "bytes_on_disk": sum(
                tree_bytes(root / "trajectories" / str(i) / key) for i in range(3)
            ),
        }
    raw = sum(raw_bytes(key) for key in first)
    disk = tree_bytes(root / "trajectories") - (root / "trajectories" / "zarr.json").stat().st_size
    files = [p for p in root.rglob("*") if p.is_file()]
    documents = [p for p in files if p.name.endswith(".json")]
    assert ok_json("info", root) == {
        "url": str(root),
        "format": "zarr",
        "layout_version": 2,
        "trajectories": 3,
        "total_samples": 28,
        "trajectory_counter": 3,
        "seed": 1234,
        "keys": keys,
        "raw_bytes": raw,
        "bytes_on_disk": disk,
        "stored_over_raw": pytest.approx(disk / raw),
        "store": {
            "files": len(files),
            "file_bytes": sum(f.stat().st_size for f in files),
            "json_files": len(documents),
            "json_bytes": sum(f.stat().st_size for f in documents),
            "disk_usage": sum(p.stat().st_blocks * 512 for p in [root, *root.rglob("*")]),
        },
    }
    result = rbzarr("info", root)
    text = result.stdout.splitlines()[3]
    assert text.startswith(f"store: {len(files)} files of ") and "JSON documents" in text


def test_info_and_ls_pt(stores):
    root = stores["pt"]
    report = ok_json("info", root)
    files = [root / f"trajectory_{i}_w.pt" for i in range(3)]
    assert report["format"] == "pt"
    assert report["keys"]["curr_obs/state"] == {
        "dtype": "float64",
        "shape": [4, 2, 3],
        "chunks": None,
        "shards": None,
        "codec": "torch.save",
        "raw_bytes": raw_bytes("curr_obs/state"),
        "bytes_on_disk": None,
    }
    assert report["bytes_on_disk"] == sum(f.stat().st_size for f in files)
    index = json.loads((root / "trajectory_index.json").read_text())["trajectory_index"]
    assert ok_json("ls", root) == [
        {
            "missing": False,
            "trajectory_id": i,
            "uuid": index[str(i)]["uuid"],
            "shape": list(TRAJECTORIES[i].prev_logprobs.shape),
            "num_samples": TRAJECTORIES[i].prev_logprobs.numel(),
            "model_weights_id": "w",
            "bytes": files[i].stat().st_size,
        }
        for i in range(3)
    ]


def test_ls_zarr_and_human_output(stores):
    root = stores["zarr"]
    rows = ok_json("ls", root)
    assert [(r["trajectory_id"], r["shape"], r["num_samples"]) for r in rows] == [
        (0, [4, 2], 8),
        (1, [6, 2], 12),
        (2, [4, 2], 8),
    ]
    assert [r["bytes"] for r in rows] == [
        tree_bytes(root / "trajectories" / str(i)) for i in range(3)
    ]
    text = rbzarr("--storage-option", "auto_mkdir=true", "ls", root)
    assert text.returncode == 0, text.stderr
    assert len(text.stdout.splitlines()) == 4 and rows[2]["uuid"] in text.stdout


def test_stats(stores):
    report = ok_json("stats", stores["zarr"], "--keys", "rewards,curr_obs/state")
    rewards = np.concatenate([t.rewards.reshape(-1).numpy() for t in TRAJECTORIES])
    state = np.concatenate([t.curr_obs["state"].reshape(-1).numpy() for t in TRAJECTORIES])
    # Oracle: step dones are the sample numbers (reset rows dropped), so only number 0 is
    # not a done; each episode's return sums its rewards (= its sample numbers).
    lengths, returns = [], []
    for t in TRAJECTORIES:
        n = t.prev_logprobs.numpy()
        for env in range(n.shape[1]):
            start = 0
            for step in range(n.shape[0]):
                if n[step, env] != 0:
                    lengths.append(step - start + 1)
                    returns.append(n[start : step + 1, env].sum())
                    start = step + 1

    def summary(values) -> dict:
        values = np.asarray(values, dtype=np.float64)
        return {
            "count": values.size,
            "nan": 0,
            "inf": 0,
            "mean": pytest.approx(values.mean(), rel=1e-12),
            "std": pytest.approx(values.std(), rel=1e-12),
            "min": values.min(),
            "max": values.max(),
        }

    assert report == {
        "trajectories": 3,
        "total_samples": 28,
        "keys": {"rewards": summary(rewards), "curr_obs/state": summary(state)},
        "episodes": {
            "complete": len(lengths),
            "incomplete": 0,
            "length": summary(lengths),
            "return": summary(returns),
        },
    }


def test_export_merge_split(stores, tmp_path):
    exported = tmp_path / "exported"
    result = rbzarr("export", stores["zarr"], exported, "--format", "pkl", "--last", "2")
    assert result.returncode == 0, result.stderr
    view = open_buffer(exported)
    assert (view.format, view.ids) == ("pkl", [1, 2])
    assert torch.equal(view.trajectory(2).dones, TRAJECTORIES[2].dones)

    merged = tmp_path / "merged"
    result = rbzarr("merge", merged, stores["pt"], exported)
    assert result.returncode == 0, result.stderr
    view = open_buffer(merged)
    assert (view.format, view.ids, view.metadata["trajectory_counter"]) == ("pt", list(range(5)), 5)
    assert view.metadata["merged_from"] == [
        {"source": str(stores["pt"]), "source_ids": [0, 1, 2]},
        {"source": str(exported), "source_ids": [1, 2]},
    ]
    source_uuids = [e["uuid"] for e in open_buffer(stores["pt"]).entries.values()]
    source_uuids += [e["uuid"] for e in open_buffer(exported).entries.values()]
    assert [e["uuid"] for e in view.entries.values()] == source_uuids
    for new_id, original in zip(view.ids, [*TRAJECTORIES, *TRAJECTORIES[1:]], strict=True):
        assert torch.equal(view.trajectory(new_id).prev_logprobs, original.prev_logprobs)

    again = rbzarr("merge", merged, stores["pt"])
    assert again.returncode == 1 and "already exists" in again.stderr

    result = rbzarr("split", stores["zarr"], tmp_path / "parts", "--count", "2")
    assert result.returncode == 0, result.stderr
    parts = [tmp_path / "parts" / f"part_{k}" for k in range(2)]
    assert result.stdout.split() == [str(p) for p in parts]
    assert [open_buffer(p).ids for p in parts] == [[0, 1], [2]]


def test_merge_refuses_a_store_with_its_own_export(stores, tmp_path):
    exported = tmp_path / "exported"
    assert (
        rbzarr("export", stores["zarr"], exported, "--format", "zarr", "--last", "2").returncode
        == 0
    )
    uuid = open_buffer(stores["zarr"]).entry(1)["uuid"]
    merged = tmp_path / "merged"
    result = rbzarr("merge", merged, stores["zarr"], exported)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot merge: ")
    assert f"trajectory {uuid} is id 1 of {stores['zarr']} and id 1 of {exported}" in result.stderr
    assert not merged.exists()


def test_plot_writes_a_png(stores, tmp_path):
    import matplotlib.image  # noqa: PLC0415

    output = tmp_path / "plot.png"
    result = rbzarr("plot", stores["pt"], "-o", output)
    assert result.returncode == 0, result.stderr
    assert matplotlib.image.imread(output).shape == (800, 1000, 4)


@pytest.mark.parametrize("suffix", [".jpg", ".JPEG"])
def test_plot_writes_a_jpeg_for_a_jpeg_suffix(stores, tmp_path, suffix):
    from PIL import Image  # noqa: PLC0415

    output = tmp_path / f"plot{suffix}"
    result = rbzarr("plot", stores["zarr"], "-o", output)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes()[:3] == b"\xff\xd8\xff"  # the JPEG start-of-image marker
    with Image.open(output) as image:
        assert (image.format, image.size) == ("JPEG", (1000, 800))


def test_plot_refuses_an_unknown_suffix_before_reading(stores, tmp_path):
    output = tmp_path / "plot.gif"
    result = rbzarr("plot", stores["zarr"], "-o", output)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and "'.gif'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not output.exists()


def test_python_dash_m_runs_the_cli(stores):
    result = rbzarr("--help")
    assert result.returncode == 0 and "Usage: rbzarr" in result.stdout
    assert [row["trajectory_id"] for row in ok_json("ls", stores["zarr"])] == [0, 1, 2]


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    store = tmp_path / "many"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format="pt") as b:
        b.add_trajectories([make_trajectory(1, 1, i) for i in range(40)])
    with subprocess.Popen(
        [sys.executable, "-m", "rbzarr", "ls", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the first line is written
        errors = process.stderr.read().decode()
        assert process.wait(timeout=60) == 1
    assert errors == ""


def test_progress_bars_only_on_a_terminal(stores):
    # stderr is a pipe here, as in a log file or CI: no progress bar may be drawn into it.
    for args in (["stats", stores["zarr"]], ["info", stores["pt"]]):
        result = rbzarr(*args)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""


@pytest.mark.parametrize(
    "case", ["missing path", "not a store", "bad protocol", "corrupt store", "bad storage option"]
)
def test_errors_are_one_line(stores, tmp_path, case):
    corrupt = tmp_path / "corrupt"
    if case == "corrupt store":
        build(corrupt, "zarr")
        (corrupt / "index" / "head.json").write_text('{"trajectory_format": ')
    args = {
        "missing path": ["info", tmp_path / "nothing"],
        "not a store": ["ls", tmp_path],
        "bad protocol": ["stats", "nosuchproto://bucket/x"],
        "corrupt store": ["info", corrupt],
        "bad storage option": ["--storage-option", "novalue", "info", stores["zarr"]],
    }[case]
    result = rbzarr(*args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 or case == "bad storage option"
    assert result.stdout == ""


def test_installed_console_script(stores):
    """The ``rbzarr`` entry point installed beside the interpreter runs the same CLI."""
    script = Path(sys.executable).with_name("rbzarr")
    assert script.exists(), f"console script missing at {script}: reinstall the package"
    result = subprocess.run(
        [str(script), "ls", stores["zarr"], "--json"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert [row["trajectory_id"] for row in json.loads(result.stdout)] == [0, 1, 2]
