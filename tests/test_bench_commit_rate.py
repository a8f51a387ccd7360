"""The quick commit-rate benchmark: rbzarr's tiny commits beside the floor of their files."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.commit_rate import main, rbzarr_commits
from benchmarks.limits import floor_commits, group_shape


def test_the_floor_makes_the_folders_and_files_of_a_committed_group(tmp_path: Path) -> None:
    rbzarr_commits(tmp_path / "store", 1, 2, pack_bytes=0)
    folders, files = group_shape(tmp_path / "store")
    # T=4, B=2, three keys, two of them zeros (no shard): the fullest group (trajectory 1,
    # rewards of ones) has a folder and a shard for rewards, and the group's zarr.json
    assert sorted(folders) == ["rewards"]
    shards = [f"{key}/c.0.0.0" for key in folders]
    assert sorted(name for name, _ in files) == sorted([*shards, "zarr.json"])
    floor_commits(tmp_path / "floor", (folders, files), 3)
    made = tmp_path / "floor" / "trajectories"
    for i in range(3):
        group = made / str(i)
        assert sorted(p.name for p in group.iterdir() if p.is_dir()) == sorted(folders)
        for name, size in files:
            assert (group / name).stat().st_size == size
        assert not [p for p in group.iterdir() if ".tmp-" in p.name]


def test_the_rounds_report_both_sides_and_their_ratio(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    argv = ["--trajectories", "3", "--warm", "2", "--rounds", "1"]
    assert main([*argv, "--workdir", str(tmp_path), "--json", str(out)]) == 0
    commits = json.loads(out.read_text())["commits"]
    assert commits["group"] == {"folders": 2, "files": 2}
    for side in ("rbzarr", "floor"):
        assert len(commits[side]["per_s"]["runs"]) == 1
        assert commits[side]["per_s"]["min"] > 0
    assert len(commits["ratio_to_floor"]["runs"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # the stores are removed
