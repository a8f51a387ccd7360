"""Store consistency checks and the orphan-only repair."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from rbzarr import CheckpointNotFoundError, TrajectoryReplayBuffer
from rbzarr.analysis.verify import verify_store
from rbzarr.cli.main import main


def build(path: Path, fmt: str, count: int = 3) -> Path:
    """``count`` trajectories, each in its own group for zarr (no pack: the cases damage one
    trajectory's files; test_packs verifies packs)."""
    options = {"layout_options": {"pack_bytes": 0}} if fmt == "zarr" else {}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, trajectory_format=fmt, **options
    ) as b:
        b.add_trajectories([make_trajectory(4, 2, 8 * i, epochs=2) for i in range(count)])
    return path


def hashes(root: Path, below: str = "") -> dict[str, str]:
    base = root / below
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


def kinds(report) -> list[tuple[str, str, int | None]]:
    return [(p.kind, p.path, p.trajectory_id) for p in report.problems]


@pytest.mark.parametrize("fmt", ["zarr", "pt", "pkl"])
def test_clean_store_is_ok(tmp_path, fmt):
    report = verify_store(build(tmp_path / "s", fmt))
    assert report.ok and report.trajectories == 3 and report.format == fmt
    assert report.to_dict()["problems"] == []


def damage_array_document(group: Path, key: str) -> None:
    """Garble an array's document: its copy in the group's consolidated document."""
    document = json.loads((group / "zarr.json").read_bytes())
    document["consolidated_metadata"]["metadata"][key] = {"node_type": "array", "shape": "?"}
    (group / "zarr.json").write_text(json.dumps(document))


def test_zarr_damage_is_found_and_only_orphans_are_repaired(tmp_path):
    root = build(tmp_path / "s", "zarr")
    trajectories = root / "trajectories"
    (trajectories / "0" / "rewards" / "c.0.0.0").unlink()  # a removed chunk
    damage_array_document(trajectories / "1", "actions")
    shutil.copytree(trajectories / "2", trajectories / "7")  # an orphan group
    (root / "metadata.json.tmp-0123456789abcdef0123456789abcdef").write_bytes(b"{")
    report = verify_store(root)
    assert kinds(report) == [
        ("missing_chunks", "trajectories/0", 0),
        ("unreadable_data", "trajectories/1", 1),
        ("temp_file", "metadata.json.tmp-0123456789abcdef0123456789abcdef", None),
        ("orphan", "trajectories/7", 7),
    ]
    assert "array 'rewards' stores 0 of 1 chunks" in report.problems[0].message

    committed = {k: v for k, v in hashes(root).items() if not k.startswith("trajectories/7")}
    committed.pop("metadata.json.tmp-0123456789abcdef0123456789abcdef")
    result = subprocess.run(
        [sys.executable, "-m", "rbzarr", "verify", str(root), "--repair", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stderr  # the damaged data remains
    document = json.loads(result.stdout)
    assert [p["kind"] for p in document["repaired"]] == ["temp_file", "orphan"]
    assert [p["kind"] for p in document["problems"]] == ["missing_chunks", "unreadable_data"]
    assert document["ok"] is False
    assert not (trajectories / "7").exists()
    assert hashes(root) == committed  # committed data untouched, byte for byte


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_file_layout_damage(tmp_path, fmt):
    root = build(tmp_path / "s", fmt)
    first = root / f"trajectory_0_w.{fmt}"
    first.write_bytes(first.read_bytes()[:100])
    (root / f"trajectory_1_w.{fmt}").unlink()
    shutil.copy(root / f"trajectory_2_w.{fmt}", root / f"trajectory_2_other.{fmt}")
    report = verify_store(root, repair=True)
    assert kinds(report) == [
        ("unreadable_data", f"trajectory_0_w.{fmt}", 0),
        ("missing_data", f"trajectory_1_w.{fmt}", 1),
    ]
    assert [(p.kind, p.path) for p in report.repaired] == [("orphan", f"trajectory_2_other.{fmt}")]
    assert sorted(os.listdir(root)) == sorted(
        ["metadata.json", "trajectory_index.json", f"trajectory_0_w.{fmt}", f"trajectory_2_w.{fmt}"]
    )


def test_truncated_index_and_stale_metadata(tmp_path):
    # RLinf's format: its documents are the index (a zarr store's is its log, see below).
    root = build(tmp_path / "s", "pt")
    index = root / "trajectory_index.json"
    original = index.read_bytes()
    index.write_bytes(original[:50])
    report = verify_store(root, repair=True)
    assert [(p.kind, p.path) for p in report.problems] == [("unreadable_document", "")]
    assert "trajectory_index.json is not valid JSON" in report.problems[0].message
    assert report.repaired == [] and len(list(root.glob("trajectory_2_*"))) == 1

    index.write_bytes(original)
    metadata = json.loads((root / "metadata.json").read_text())
    metadata["size"] = 5
    (root / "metadata.json").write_text(json.dumps(metadata))
    assert [(p.kind, p.path) for p in verify_store(root).problems] == [
        ("metadata_mismatch", "metadata.json"),
    ]


def test_not_a_store(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="not an rbzarr or RLinf store"):
        verify_store(tmp_path)


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
def test_drop_damaged_removes_only_unreadable_entries(tmp_path, fmt):
    root = build(tmp_path / "s", fmt, count=4)
    if fmt == "zarr":
        (root / "trajectories" / "0" / "rewards" / "c.0.0.0").unlink()
        damage_array_document(root / "trajectories" / "2", "actions")
    else:
        (root / "trajectory_0_w.pt").unlink()
        damaged = root / "trajectory_2_w.pt"
        damaged.write_bytes(damaged.read_bytes()[:100])
    (root / "notes.txt").write_text("the user's own file")
    before = hashes(root)
    healthy = {path: digest for path, digest in before.items() if "_1_" in path or "/1/" in path}

    result = subprocess.run(
        [sys.executable, "-m", "rbzarr", "verify", str(root), "--repair", "--drop-damaged"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dropped from the index: ids [0, 2]" in result.stdout

    index = json.loads((root / "trajectory_index.json").read_text())
    metadata = json.loads((root / "metadata.json").read_text())
    assert index["trajectory_id_list"] == [1, 3]
    assert sorted(index["trajectory_index"]) == ["1", "3"]
    assert (metadata["size"], metadata["trajectory_counter"]) == (2, 4)  # ids are never reused
    after = hashes(root)
    assert {path: after[path] for path in healthy} == healthy  # healthy data untouched
    assert after["notes.txt"] == before["notes.txt"]
    # The dropped trajectories' data is gone with them (it was rbzarr's only), so a plain
    # verify that follows is clean (issue 23); the user's file stays.
    dropped_prefixes = ("trajectories/0/", "trajectories/2/", "trajectory_0_", "trajectory_2_")
    assert not [p for p in after if p.startswith(dropped_prefixes)]

    with TrajectoryReplayBuffer() as restored:
        restored.load_checkpoint(root)
        assert len(restored) == 2 and restored.sample(4)["rewards"].shape[0] == 4
    clean = verify_store(root)
    assert clean.ok and clean.problems == []


def test_drop_damaged_needs_repair(tmp_path):
    root = build(tmp_path / "s", "zarr")
    with pytest.raises(ValueError, match="drop_damaged needs repair"):
        verify_store(root, drop_damaged=True)
    result = subprocess.run(
        [sys.executable, "-m", "rbzarr", "verify", str(root), "--drop-damaged"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "use it with --repair" in result.stderr


@pytest.mark.parametrize("fmt", ["zarr", "pt", "pkl"])
def test_repair_never_deletes_a_users_file_that_looks_like_an_orphan(tmp_path, fmt):
    root = build(tmp_path / "s", fmt)
    if fmt == "zarr":
        mine = root / "trajectories" / "99" / "my.txt"
        mine.parent.mkdir()
        shutil.copytree(root / "trajectories" / "2", root / "trajectories" / "98")
        (root / "trajectories" / "98" / "notes.md").write_text("mine too")
        yours = [mine, root / "trajectories" / "98" / "notes.md"]
    else:
        mine = root / f"trajectory_77_x.{fmt}"
        yours = [mine]
    mine.write_text("mine")
    before = {path: path.read_bytes() for path in yours}
    report = verify_store(root, repair=True)
    assert all(path.read_bytes() == data for path, data in before.items())
    assert report.repaired == []
    left = {p.path: p for p in report.problems}
    assert all(p.kind == "orphan" and not p.repairable for p in left.values())
    assert all("rbzarr did not write" in p.message for p in left.values())
    expected = {"trajectories/98", "trajectories/99"} if fmt == "zarr" else {mine.name}
    assert set(left) == expected


# A writer that appends until interrupted; each committed id is printed after its flush.
_WRITER = """
import sys
from conftest import make_trajectory
from rbzarr import TrajectoryReplayBuffer
buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=sys.argv[1])
for i in range(10_000):
    buffer.add_trajectories([make_trajectory(3, 2, 100 * i)])
    buffer.flush()
    print(i, flush=True)
"""


def test_a_writer_stopped_by_sigint_leaves_a_store_verify_calls_clean(tmp_path):
    store = tmp_path / "run"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path])},
    )
    assert writer.stdout is not None
    committed = [int(writer.stdout.readline()) for _ in range(3)]
    writer.send_signal(signal.SIGINT)
    rest, errors = writer.communicate(timeout=120)
    assert writer.returncode != 0 and "KeyboardInterrupt" in errors
    committed += [int(line) for line in rest.split()]
    report = verify_store(str(store))
    assert report.ok and report.problems == []
    assert [note.kind for note in report.notes] == ["root_attrs_unwritten"]
    assert "the next writer to commit writes them when it closes" in report.notes[0].message
    result = CliRunner().invoke(main, ["verify", str(store)])
    assert result.exit_code == 0 and "note      root_attrs_unwritten" in result.output
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(store))
    buffer.load_checkpoint(str(store))
    assert buffer.trajectory_ids[: len(committed)] == committed  # nothing lost
    buffer.add_trajectories([make_trajectory(3, 2, 0)])
    buffer.close()
    after = verify_store(str(store))
    assert after.ok and after.notes == []
