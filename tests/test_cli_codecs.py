"""``rbzarr codecs``, ``rbzarr recode``, ``rbzarr import --codec`` and ``info``'s codec columns."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from faults import Faults

from rbzarr import RecodeWarning, StorageUnavailableError, Trajectory, TrajectoryReplayBuffer
from rbzarr.analysis.recode import plan_recode, recode_store
from rbzarr.cli.main import main

T, B, SIDE = 4, 2, 16


def frames(seed: int) -> torch.Tensor:
    """``[T + 1, B, 16, 16, 3]`` smooth frames drifting by one pixel a step, a little noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : SIDE + T + 1, 0:SIDE]
    base = np.stack([(8 * y) % 256, (8 * x) % 256, (4 * (x + y)) % 256], axis=-1)
    steps = [
        np.stack([base[t + b : t + b + SIDE] for b in range(B)])
        + rng.integers(0, 4, (B, SIDE, SIDE, 3))
        for t in range(T + 1)
    ]
    return torch.from_numpy(np.clip(np.stack(steps), 0, 255).astype(np.uint8))


def trajectory(seed: int) -> Trajectory:
    images = frames(seed)
    state = torch.arange((T + 1) * B * 3, dtype=torch.float32).reshape(T + 1, B, 3) + seed
    return Trajectory(
        max_episode_length=T,
        rewards=torch.full((T, B), float(seed)),
        dones=torch.zeros(T + 1, B, dtype=torch.bool),
        curr_obs={"image": images[:T].clone(), "state": state[:T].clone()},
        next_obs={"image": images[1:].clone(), "state": state[1:].clone()},
    )


TRAJECTORIES = [trajectory(seed) for seed in range(3)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zarr store of the default codecs (image keys lossless)."""
    path = tmp_path_factory.mktemp("codecs") / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buffer:
        buffer.add_trajectories(TRAJECTORIES)
    return path


def run(*args: object) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def fails(*args: object) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code != 0
    return result.output


def digest(path: Path) -> dict[str, str]:
    """Every file below ``path`` by its content hash."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def read_all(path: Path) -> list[dict[str, torch.Tensor]]:
    buffer = TrajectoryReplayBuffer()
    buffer.load_checkpoint(str(path))
    return [buffer.trajectory(i).tensors() for i in buffer.trajectory_ids]


def test_codecs_tries_candidates_on_the_stores_own_frames(store: Path) -> None:
    before = digest(store)
    rows = json.loads(
        run("codecs", store, "--json", "--frames", "5", "--candidates", "raw,zstd:1,qoi,jpeg:90")
    )
    assert [(r["key"], r["codec"]) for r in rows] == [
        (key, codec)
        for key in ("curr_obs/image", "next_obs/image")
        for codec in ("raw", "zstd:1", "qoi", "jpeg:90")
    ]
    by = {(r["key"], r["codec"]): r for r in rows}
    assert by["curr_obs/image", "raw"]["ratio"] == 1.0
    for codec in ("raw", "zstd:1", "qoi"):  # lossless: PSNR infinite (null in JSON)
        assert by["curr_obs/image", codec]["psnr"] is None
    lossy = by["curr_obs/image", "jpeg:90"]
    assert 20 < lossy["psnr"] < math.inf and 0 < lossy["ratio"] < 1
    assert all(r["frames"] == 5 for r in rows)
    assert all(
        r[rate] is None or r[rate] > 0 for r in rows for rate in ("encode_fps", "decode_fps")
    )
    assert digest(store) == before  # nothing written
    text = run("codecs", store, "--keys", "next_obs/image", "--candidates", "qoi", "--frames", 5)
    key, codec, ratio, quality, *_ = text.splitlines()[1].split()
    assert (key, codec, quality) == ("next_obs/image", "qoi", "lossless")
    assert float(ratio) == pytest.approx(by["next_obs/image", "qoi"]["ratio"], abs=1e-3)


def test_codecs_refuses_keys_that_are_not_images(store: Path) -> None:
    assert "'curr_obs/state' is not an image-like key" in fails(
        "codecs", store, "--keys", "curr_obs/state"
    )
    assert "unknown name 'webp'" in fails("codecs", store, "--candidates", "webp")


def test_recode_re_encodes_into_a_new_store_and_leaves_the_source(
    store: Path, tmp_path: Path
) -> None:
    before = digest(store)
    destination = tmp_path / "jpeg"
    result = CliRunner().invoke(
        main, ["recode", str(store), str(destination), "--codec", "curr_obs/image=jpeg:90"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"recoded 3 trajectories into {destination} (curr_obs/image=jpeg:90)"
    )
    assert "note: next_obs/image takes curr_obs/image's codec jpeg:90" in result.stderr
    assert digest(store) == before
    codecs = json.loads((destination / "metadata.json").read_text())["codecs"]
    assert codecs["curr_obs/image"] == codecs["next_obs/image"] == "jpeg:90"
    for old, new in zip(read_all(store), read_all(destination), strict=True):
        assert set(old) == set(new)
        for key in old:
            if key.endswith("/image"):
                error = (old[key].double() - new[key].double()).square().mean().item()
                assert 10 * math.log10(255**2 / error) > 30
            else:
                assert torch.equal(old[key], new[key]), key
        # next_obs stays stored once: its rows equal the following curr_obs rows, read back
        assert torch.equal(new["next_obs/image"][:-1], new["curr_obs/image"][1:])
    info = json.loads(run("info", destination, "--json"))["keys"]
    assert info["curr_obs/image"]["codec_spec"] == "jpeg:90"
    assert info["curr_obs/image"]["psnr"] > 30
    # stored once: only the last step's rows of next_obs are its own
    assert info["next_obs/image"]["bytes_on_disk"] < info["curr_obs/image"]["bytes_on_disk"] / 2
    assert not (destination / "recode.json").exists()
    text = run("info", destination)
    line = next(line for line in text.splitlines() if line.strip().startswith("curr_obs/image"))
    assert "codec=jpeg:90" in line and "stored/raw=" in line and "psnr>=" in line


def test_recode_given_next_obs_apart_warns_with_the_cost(store: Path, tmp_path: Path) -> None:
    destination = tmp_path / "apart"
    args = ["--codec", "curr_obs/image=jpeg:90", "--codec", "next_obs/image=png:1"]
    result = CliRunner().invoke(main, ["recode", str(store), str(destination), *args])
    assert result.exit_code == 0, result.output
    assert re.search(
        r"warning: next_obs/image gets codec png:1 but curr_obs/image jpeg:90: next_obs/image "
        r"is no longer stored once .* about [\d.]+ kB more \(curr_obs/image takes [\d.]+ kB in "
        r"the source, next_obs/image stored once [\d.]+ kB\)",
        result.stderr,
    )
    info = json.loads(run("info", destination, "--json"))["keys"]
    assert info["next_obs/image"]["codec_spec"] == "png:1"
    assert info["next_obs/image"]["shape"] == info["curr_obs/image"]["shape"]
    with pytest.warns(RecodeWarning, match="next_obs/image is no longer stored once"):
        recode_store(store, tmp_path / "library", {"next_obs/image": "jpeg:90"})
    pt = tmp_path / "pt"  # a format that stores every row: the cost is its raw frames
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=pt, trajectory_format="pt") as b:
        b.add_trajectories(TRAJECTORIES)
    (split,) = plan_recode(pt, {"curr_obs/image": "jpeg:90", "next_obs/image": "qoi"}).split
    raw = len(TRAJECTORIES) * T * B * SIDE * SIDE * 3
    assert f"about as large as curr_obs/image ({raw / 1e3:.1f} kB of frames" in split


def test_recode_says_which_keys_default_encodes(store: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["recode", str(store), str(tmp_path / "d"), "--codec", "default=jpeg:95"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "note: default=jpeg:95 encodes curr_obs/image, next_obs/image; it cannot encode "
        "rewards, dones, curr_obs/state, next_obs/state, which are stored raw"
    ) in result.stderr
    plan = plan_recode(store, {"default": "zstd:3", "curr_obs/image": "qoi"})
    assert plan.default_keys == ("rewards", "dones", "curr_obs/state", "next_obs/state")
    assert plan.paired == ("next_obs/image",) and plan.default_leaves == ()


def interrupted_recode(store: Path, destination: Path, faults: Faults, codecs: dict) -> None:
    """A recode of ``store`` that storage stops halfway (its 2nd trajectory's first write)."""
    faults.count()
    recode_store(store, destination.with_name("counted"), codecs)
    writes = [i for i, call in enumerate(faults.calls) if call in ("write_file", "commit_file")]
    faults.arm(writes[len(writes) // 2], "fail")
    with pytest.raises(StorageUnavailableError):
        recode_store(store, destination, codecs)
    faults.disarm()
    assert (destination / "recode.json").exists() and not (destination / "metadata.json").exists()


def test_recode_resumes_where_it_stopped_and_only_with_its_codecs(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    run("recode", store, whole, "--codec", "default=zstd:3")
    stopped = tmp_path / "stopped"
    interrupted_recode(store, stopped, Faults(monkeypatch), {"default": "zstd:3"})
    before = digest(stopped)
    message = fails("recode", store, stopped, "--codec", "default=zstd:5")
    assert "is an interrupted recode with other codecs" in message
    assert "zstd:3 there, zstd:5 now" in " ".join(message.split())
    assert digest(stopped) == before
    run("recode", store, stopped, "--codec", "default=zstd:3")
    assert digest(stopped) == digest(whole)
    assert "already holds a store" in fails("recode", store, whole, "--codec", "default=zstd:3")


def test_recode_refuses_bad_input_and_writes_nothing(store: Path, tmp_path: Path) -> None:
    destination = tmp_path / "out"
    assert "has no key 'nope'" in fails("recode", store, destination, "--codec", "nope=qoi")
    assert "give the quality" in fails("recode", store, destination, "--codec", "default=jpeg")
    assert "expected KEY=SPEC" in fails("recode", store, destination, "--codec", "qoi")
    assert "--codec" in fails("recode", store, destination)
    assert not destination.exists()
    message = " ".join(fails("recode", store, store, "--codec", "default=raw").split())
    assert f"{store} is the source store {store}" in message


def test_recode_refuses_a_destination_inside_its_source_or_holding_other_files(
    store: Path, tmp_path: Path
) -> None:
    before = digest(store)
    inside = store / "recoded"
    message = " ".join(fails("recode", store, inside, "--codec", "default=raw").split())
    assert f"{inside} is inside the source store {store}" in message
    assert not inside.exists() and digest(store) == before
    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    (unrelated / "todo.txt").write_text("x")
    message = " ".join(fails("recode", store, unrelated, "--codec", "default=raw").split())
    assert f"{unrelated} is not empty (1 entries, e.g. 'todo.txt') and is no interrupted" in message
    assert digest(unrelated) == {"todo.txt": hashlib.sha256(b"x").hexdigest()}
    other = tmp_path / "other-source"
    shutil.copytree(store, other)
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "recode.json").write_text(json.dumps({"source": str(other), "codecs": {}}))
    message = " ".join(fails("recode", store, stopped, "--codec", "default=raw").split())
    assert f"is an interrupted recode of '{other}', not of {store}" in message
    assert sorted(p.name for p in stopped.iterdir()) == ["recode.json"]


def test_import_stores_frames_with_the_codec_asked(tmp_path: Path) -> None:
    from dataset_fixtures import write_robomimic  # noqa: PLC0415  (h5py: the datasets extra)

    arrays = write_robomimic(tmp_path / "demos.hdf5")
    destination = tmp_path / "imported"
    run(
        "import",
        tmp_path / "demos.hdf5",
        destination,
        "--from",
        "robomimic",
        "--codec",
        "default=zstd:3",
    )
    codecs = json.loads((destination / "metadata.json").read_text())["codecs"]
    assert codecs and set(codecs.values()) == {"zstd:3"}
    stored = read_all(destination)
    for demo, tensors in zip(arrays.values(), stored, strict=True):
        image = tensors["curr_obs/agentview_image"].reshape(-1, 8, 8, 3).numpy()
        assert np.array_equal(image, demo["obs/agentview_image"])


def test_info_shows_a_next_obs_key_stored_once_at_its_logical_shape(store: Path) -> None:
    info = json.loads(run("info", store, "--json"))["keys"]
    assert info["next_obs/image"]["shape"] == info["curr_obs/image"]["shape"] == [T, B, 16, 16, 3]
    rows, one, *frame = info["next_obs/image"]["stored_shape"]
    assert rows < T * B and one == 1 and frame == [16, 16, 3]
    assert "stored_shape" not in info["curr_obs/image"]
    line = next(line for line in run("info", store).splitlines() if "next_obs/image" in line)
    assert f"shape=[{T}, {B}, 16, 16, 3] (stored once: [{rows}, 1, 16, 16, 3])" in line


def test_stats_summarises_image_keys_from_a_sample_unless_asked(store: Path) -> None:
    before = digest(store)
    report = json.loads(run("stats", store, "--json"))
    everything = json.loads(run("stats", store, "--json", "--decode-images"))
    tensors = read_all(store)
    for key in ("curr_obs/image", "next_obs/image"):
        assert "sample" not in everything["keys"][key]
        frames = torch.cat([t[key].reshape(-1) for t in tensors]).double()
        assert everything["keys"][key]["count"] == frames.numel()
        assert everything["keys"][key]["mean"] == pytest.approx(frames.mean().item())
        assert everything["keys"][key]["std"] == pytest.approx(frames.std(correction=0).item())
        # 3 trajectories, fewer than the sample: the sample is every trajectory
        assert report["keys"][key] == {
            **everything["keys"][key],
            "sample": {"trajectories": 3, "of": 3},
        }
    for key in ("rewards", "curr_obs/state"):
        assert (
            report["keys"][key] == everything["keys"][key] and "sample" not in report["keys"][key]
        )
    line = next(line for line in run("stats", store).splitlines() if "curr_obs/image" in line)
    assert "(frames of 3 of 3 trajectories; --decode-images reads every frame)" in line
    assert digest(store) == before
