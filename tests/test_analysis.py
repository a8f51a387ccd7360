"""The read-only view: trajectories, episodes, streaming statistics and dask arrays."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import make_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import CheckpointNotFoundError, EmptyBufferError, Trajectory, TrajectoryReplayBuffer
from rbzarr.analysis.episodes import episode_segments
from rbzarr.analysis.plotting import plot_store
from rbzarr.analysis.progress import progress_bar
from rbzarr.analysis.stats import RunningStats, compute_stats
from rbzarr.analysis.view import open_buffer
from rbzarr.cli.console import progress_wanted
from rbzarr.cli.main import main


def build(path, fmt: str, trajectories: list[Trajectory]) -> str:
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, trajectory_format=fmt) as b:
        b.add_trajectories(trajectories)
    return str(path)


def episode_trajectory(dones_steps: list[list[bool]], epochs: int = 1) -> Trajectory:
    """A [T, B] trajectory with the given step dones (reset rows added, all True) and
    rewards ``t * 10 + b``."""
    done = torch.tensor(dones_steps, dtype=torch.bool)  # [T, B]
    T, B = done.shape
    blocks = done.reshape(epochs, T // epochs, B)
    resets = torch.ones(epochs, 1, B, dtype=torch.bool)  # never steps: must not cut
    rewards = (torch.arange(T).unsqueeze(1) * 10 + torch.arange(B)).to(torch.float32)
    return Trajectory(
        rewards=rewards.unsqueeze(-1),
        dones=torch.cat([resets, blocks], dim=1).reshape(T + epochs, B, 1),
        prev_logprobs=torch.zeros(T, B),
    )


def _summary(values: np.ndarray) -> dict[str, Any]:
    """The stats report's summary of ``values`` (all finite), computed here with numpy."""
    return {
        "count": values.size,
        "nan": 0,
        "inf": 0,
        "mean": pytest.approx(values.mean()),
        "std": pytest.approx(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


@pytest.mark.parametrize("fmt", ["zarr", "pt", "pkl"])
def test_view_reads_committed_trajectories(tmp_path, fmt):
    originals = [make_trajectory(4, 2, 0, epochs=2), make_trajectory(6, 2, 8, mwid="m1")]
    url = build(tmp_path / "s", fmt, originals)
    view = open_buffer(url)
    assert (len(view), view.ids, view.format, view.total_samples) == (2, [0, 1], fmt, 20)
    assert view.metadata["trajectory_format"] == fmt
    assert [e["model_weights_id"] for e in view.entries.values()] == ["w", "m1"]
    assert view.keys() == list(originals[0].tensors())
    for (trajectory_id, got), want in zip(view.iter_trajectories(), originals, strict=True):
        assert got.tensors().keys() == want.tensors().keys()
        for key, value in want.tensors().items():
            assert torch.equal(got.tensors()[key], value), (trajectory_id, key)
    assert torch.equal(view.trajectory(1, ["rewards"]).rewards, originals[1].rewards)
    with pytest.raises(KeyError, match="trajectory 5 is not in the index"):
        view.trajectory(5)


def test_refresh_sees_new_commits_only(tmp_path):
    url = tmp_path / "s"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=url)
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.flush()
    view = open_buffer(url)
    buffer.add_trajectories([make_trajectory(4, 2, 8), make_trajectory(4, 2, 16)])
    buffer.close()
    # An uncommitted copy of a trajectory group is invisible: the index is the truth.
    shutil.copytree(url / "trajectories" / "0", url / "trajectories" / "9")
    assert view.ids == [0]
    view.refresh()
    assert view.ids == [0, 1, 2]
    assert view.total_samples == 24


def test_not_a_store(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=r"metadata\.json not found"):
        open_buffer(tmp_path)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_episode_segments_match_a_python_oracle(data):
    T = data.draw(st.integers(1, 8))
    B = data.draw(st.integers(1, 3))
    done = data.draw(st.lists(st.lists(st.booleans(), min_size=B, max_size=B), min_size=T))
    done = done[:T] + [[False] * B] * (T - len(done[:T]))
    want = []
    for env in range(B):
        start = 0
        for t in range(T):
            if done[t][env]:
                want.append((env, start, t - start + 1, True))
                start = t + 1
        if start < T:
            want.append((env, start, T - start, False))
    got = episode_segments(torch.tensor(done).reshape(T, B, 1).to(torch.int64))
    assert got == want


def test_iter_episodes_cut_at_dones_not_at_reset_rows(tmp_path):
    dones = [[False, True], [True, False], [False, False], [False, True]]  # T=4, B=2
    url = build(tmp_path / "s", "zarr", [episode_trajectory(dones, epochs=2)])
    episodes = list(open_buffer(url).iter_episodes(["rewards"]))
    summary = [(e.env, e.start, e.length, e.done, e.episode_return) for e in episodes]
    # rewards are t*10 + env
    assert summary == [
        (0, 0, 2, True, 0.0 + 10.0),
        (0, 2, 2, False, 20.0 + 30.0),
        (1, 0, 1, True, 1.0),
        (1, 1, 3, True, 11.0 + 21.0 + 31.0),
    ]
    assert sorted(episodes[0].fields) == ["dones", "rewards"]
    assert episodes[3].fields["rewards"].shape == (3, 1)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=0, max_size=20),
        min_size=1,
        max_size=6,
    )
)
def test_running_stats_equal_numpy_whatever_the_split(batches):
    stats = RunningStats()
    for batch in batches:
        stats.update(torch.tensor(batch, dtype=torch.float64))
    values = np.array([v for batch in batches for v in batch], dtype=np.float64)
    if values.size == 0:
        assert stats.to_dict() == {
            "count": 0,
            "nan": 0,
            "inf": 0,
            "mean": None,
            "std": None,
            "min": None,
            "max": None,
        }
        return
    got = stats.to_dict()
    assert got["count"] == values.size
    assert got["min"] == values.min() and got["max"] == values.max()
    assert math.isclose(got["mean"], values.mean(), rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(got["std"], values.std(), rel_tol=1e-7, abs_tol=1e-4)


def test_compute_stats_values(tmp_path):
    dones = [[False, True], [True, False], [False, False], [False, True]]
    url = build(tmp_path / "s", "pt", [episode_trajectory(dones), episode_trajectory(dones)])
    report = compute_stats(open_buffer(url), ["rewards"], across_trajectories=False)
    rewards = np.array([t * 10 + b for t in range(4) for b in range(2)] * 2, dtype=np.float64)
    assert report["trajectories"] == 2 and report["total_samples"] == 16
    assert report["keys"] == {"rewards": _summary(rewards)}
    lengths = np.array([2, 1, 3] * 2, dtype=np.float64)
    returns = np.array([10.0, 1.0, 63.0] * 2)
    assert report["episodes"] == {
        "complete": 6,
        "incomplete": 2,
        "length": _summary(lengths),
        "return": _summary(returns),
    }
    with pytest.raises(ValueError, match=r"unknown keys \['nope'\]"):
        compute_stats(open_buffer(url), ["nope"])


def test_dask_arrays(tmp_path):
    originals = [make_trajectory(4, 2, 0, epochs=2), make_trajectory(8, 2, 8)]
    view = open_buffer(build(tmp_path / "z", "zarr", originals))
    arrays = view.dask_arrays("dones")
    assert list(arrays) == [0, 1]
    for array, want in zip(arrays.values(), originals, strict=True):
        assert np.array_equal(array.compute(), want.dones.numpy())
    pt = open_buffer(build(tmp_path / "p", "pt", originals[:1]))
    with pytest.raises(ValueError, match="need the zarr layout"):
        pt.dask_arrays("dones")


def run_store(path) -> str:
    """Three trajectories of one run (B=2), then one of B=3 (a new run).

    Rewards are ``t * 10 + b`` within each trajectory.  Env 0's first episode runs from
    trajectory 0 into 1; env 1's second from trajectory 0 through 1 into 2.
    """
    return build(
        path,
        "zarr",
        [
            episode_trajectory([[False, False], [False, True], [False, False]]),
            episode_trajectory([[False, False], [True, False]]),
            episode_trajectory([[False, True], [False, False], [False, False]]),
            episode_trajectory([[True, False, False], [False, False, False]]),
        ],
    )


def test_episodes_follow_an_env_across_trajectories_of_a_run(tmp_path):
    view = open_buffer(run_store(tmp_path / "s"))
    assert view.run_continues() == [True, True, False, False]
    got = [
        (e.trajectory_id, e.env, e.start, e.length, e.done, e.episode_return, e.trajectory_ids)
        for e in view.iter_episodes(["rewards"])
    ]
    assert got == [
        (0, 1, 0, 2, True, 1.0 + 11.0, (0,)),
        (0, 0, 0, 5, True, 0.0 + 10.0 + 20.0 + 0.0 + 10.0, (0, 1)),
        (2, 0, 0, 3, False, 0.0 + 10.0 + 20.0, (2,)),  # cut: the run ends at trajectory 2
        (0, 1, 2, 4, True, 21.0 + 1.0 + 11.0 + 1.0, (0, 1, 2)),
        (2, 1, 1, 2, False, 11.0 + 21.0, (2,)),
        (3, 0, 0, 1, True, 0.0, (3,)),
        (3, 0, 1, 1, False, 10.0, (3,)),
        (3, 1, 0, 2, False, 1.0 + 11.0, (3,)),
        (3, 2, 0, 2, False, 2.0 + 12.0, (3,)),
    ]
    spanning = next(e for e in view.iter_episodes() if e.trajectory_ids == (0, 1, 2))
    assert spanning.fields["rewards"][:, 0].tolist() == [21.0, 1.0, 11.0, 1.0]
    assert spanning.fields["dones"][:, 0].tolist() == [False, False, False, True]
    cut = [(e.trajectory_id, e.length, e.done) for e in view.iter_episodes([], False)]
    assert cut[:5] == [(0, 3, False), (0, 2, True), (0, 1, False), (1, 2, True), (1, 2, False)]


def test_stats_cli_and_plot_agree_on_episodes_across_trajectories(tmp_path):
    url = run_store(tmp_path / "s")
    whole = compute_stats(open_buffer(url), ["rewards"])["episodes"]
    assert (whole["complete"], whole["incomplete"]) == (4, 5)
    lengths, returns = np.array([2.0, 5.0, 4.0, 1.0]), np.array([12.0, 40.0, 34.0, 0.0])
    assert whole["length"] == _summary(lengths)
    assert whole["return"] == _summary(returns)
    cut = compute_stats(open_buffer(url), ["rewards"], across_trajectories=False)["episodes"]
    assert (cut["complete"], cut["incomplete"]) == (4, 8)
    assert (cut["length"]["max"], cut["return"]["max"]) == (2.0, 12.0)
    for flags, want in (([], whole), (["--per-trajectory"], cut)):
        result = CliRunner().invoke(main, ["stats", url, "--keys", "rewards", "--json", *flags])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["episodes"] == want
    assert plot_store(open_buffer(url), tmp_path / "p.png")["episodes"] == 4
    view = open_buffer(url)
    assert sum(e.done for e in view.iter_episodes(["rewards"])) == 4


def test_view_state_dict_continues_the_stream_and_empty_view_is_empty_buffer_error(tmp_path):
    path = build(tmp_path / "s", "zarr", [make_trajectory(4, 4, 0), make_trajectory(4, 4, 9)])
    view, other = open_buffer(path, seed=5), open_buffer(path, seed=99)
    view.sample(3)
    other.load_state_dict(view.state_dict())
    assert torch.equal(other.sample(11)["rewards"], view.sample(11)["rewards"])
    (tmp_path / "e").mkdir()
    shutil.copy(tmp_path / "s" / "metadata.json", tmp_path / "e")
    (tmp_path / "e" / "trajectory_index.json").write_text(
        json.dumps({"trajectory_index": {}, "trajectory_id_list": []})
    )
    with pytest.raises(EmptyBufferError, match="no committed trajectory"):
        open_buffer(tmp_path / "e").sample(1)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 255), max_size=30), min_size=1, max_size=4))
def test_uint8_moments_from_their_histogram_equal_the_float_ones(batches):
    histogram, floats = RunningStats(), RunningStats()
    for batch in batches:
        histogram.update(torch.tensor(batch, dtype=torch.uint8))
        floats.update(torch.tensor(batch, dtype=torch.float64))
    got, want = histogram.to_dict(), floats.to_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name] == (value if value is None else pytest.approx(value, abs=1e-9)), name


def test_progress_into_a_pipe_is_plain_lines(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with progress_bar(3, "stats", True, interval=0) as bar:
        for _ in range(3):
            bar.update()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and lines and lines[-1].startswith("stats: 100%")
    assert "3/3" in lines[-1]
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with progress_bar(3, "stats", False, interval=0) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_stats_wants_progress_lines_in_a_pipe_but_not_in_a_captured_stream():
    script = (
        "from rbzarr.cli.console import progress_wanted\n"
        "print(progress_wanted(lines=True), progress_wanted())"
    )
    piped = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert piped.stdout.split() == ["True", "False"]
    with CliRunner().isolation():
        assert progress_wanted(lines=True) is False


def test_stats_and_recode_plans_read_a_bfloat16_key(tmp_path):
    from rbzarr.analysis.recode import plan_recode  # noqa: PLC0415

    actions = torch.full((4, 2, 3), 1.5, dtype=torch.bfloat16)
    trajectory = Trajectory(max_episode_length=4, rewards=torch.ones(4, 2), actions=actions)
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "s") as buffer:
        buffer.add_trajectories([trajectory])
    assert compute_stats(str(tmp_path / "s"), ["actions"])["keys"]["actions"]["mean"] == 1.5
    plan = plan_recode(tmp_path / "s", {"default": "zstd:3"})
    assert plan.notes() == ["default=zstd:3 encodes actions, rewards"]
