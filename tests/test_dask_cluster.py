"""``--scheduler``: stats, plot, export and the dask views on a real dask.distributed cluster.

One ``LocalCluster`` of two worker processes serves the module; every result is compared
with the same work done in this process, for exact equality.
"""

from __future__ import annotations

import gc
import json
import os
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from rbzarr import (
    RbzarrError,
    SchedulerUnavailableError,
    Trajectory,
    TrajectoryReplayBuffer,
)
from rbzarr.analysis.cluster import TrajectoryTasks, connect
from rbzarr.analysis.export import export_store
from rbzarr.analysis.plotting import plot_store
from rbzarr.analysis.stats import compute_stats
from rbzarr.analysis.view import open_buffer
from rbzarr.cli.main import main

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster, set_as_default=False) as connected:
        yield connected


def random_trajectory(generator: torch.Generator, T: int, B: int) -> Trajectory:
    """Random rewards (one NaN), random dones with a reset row, a state field."""
    rewards = torch.randn(T, B, 1, generator=generator, dtype=torch.float32)
    rewards[0, 0, 0] = float("nan")
    dones = torch.rand(T, B, 1, generator=generator) < 0.3
    resets = torch.ones(1, B, 1, dtype=torch.bool)
    return Trajectory(
        rewards=rewards,
        dones=torch.cat([resets, dones]),
        prev_logprobs=torch.randn(T, B, generator=generator, dtype=torch.float64),
        curr_obs={"state": torch.randn(T, B, 3, generator=generator)},
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("dask") / "store"
    generator = torch.Generator().manual_seed(7)
    trajectories = [random_trajectory(generator, 5 + i % 3, 3) for i in range(12)]
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, trajectory_format="zarr"
    ) as buffer:
        buffer.add_trajectories(trajectories)
    return str(path)


def test_stats_and_plot_on_the_cluster_equal_the_run_in_process(client, store, tmp_path):
    tasks = TrajectoryTasks(client)
    for across in (True, False):
        here = compute_stats(open_buffer(store), across_trajectories=across)
        there = compute_stats(open_buffer(store), across_trajectories=across, tasks=tasks)
        assert json.dumps(there) == json.dumps(here)
    rewards, episodes = here["keys"]["rewards"], here["episodes"]
    assert rewards["nan"] == 12 and episodes["complete"] > 0
    counts = plot_store(open_buffer(store), tmp_path / "there.png", tasks=tasks)
    assert counts == {"rewards": rewards["count"] + 12, "episodes": episodes["complete"]}


def test_export_on_the_cluster_writes_the_same_store(client, store, tmp_path):
    here = export_store(store, tmp_path / "here", "pt", last=7)
    there = export_store(store, tmp_path / "there", "pt", last=7, tasks=TrajectoryTasks(client))
    assert there.metadata == here.metadata and there.trajectory_index == here.trajectory_index
    exported, wanted = open_buffer(tmp_path / "there"), open_buffer(tmp_path / "here")
    assert exported.ids == wanted.ids == list(range(5, 12))
    for trajectory_id in wanted.ids:
        got = exported.trajectory(trajectory_id).tensors()
        want = wanted.trajectory(trajectory_id).tensors()
        assert got.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, equal_nan=True)


def test_a_task_error_is_raised_here_as_its_own_class(client, store, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)
    shutil.rmtree(damaged / "trajectories" / "4")
    with pytest.raises(RbzarrError) as here:
        compute_stats(open_buffer(damaged))
    with pytest.raises(RbzarrError) as there:
        compute_stats(open_buffer(damaged), tasks=TrajectoryTasks(client))
    assert type(there.value) is type(here.value)
    assert "trajectories/4" in str(there.value)


def test_dask_views_compute_on_the_cluster(cluster, store):
    view = open_buffer(store)
    arrays = view.dask_arrays("rewards")
    with connect(cluster.scheduler_address) as client, client.as_current():
        computed = [array.compute() for array in arrays.values()]
        assert dask.delayed(os.getpid)().compute() != os.getpid()  # on a worker process
    for got, trajectory_id in zip(computed, arrays, strict=True):
        want = view.trajectory(trajectory_id, ["rewards"]).rewards.numpy()
        assert np.array_equal(got, want, equal_nan=True)


def test_cli_scheduler_option_gives_the_same_output(cluster, store, tmp_path):
    address = cluster.scheduler_address
    runs = {}
    for flags in ([], ["--scheduler", address]):
        result = CliRunner().invoke(main, ["stats", store, "--json", *flags])
        assert result.exit_code == 0, result.output
        runs[bool(flags)] = result.stdout
    assert runs[True] == runs[False]
    result = CliRunner().invoke(
        main, ["export", store, str(tmp_path / "e"), "--format", "pkl", "--scheduler", address]
    )
    assert result.exit_code == 0, result.output
    assert open_buffer(tmp_path / "e").ids == list(range(12))
    result = CliRunner().invoke(main, ["stats", store, "--scheduler", "no-port-here"])
    assert result.exit_code == 1
    assert "no dask scheduler answered at 'no-port-here'" in result.output


def test_an_unreachable_scheduler_is_a_named_error_after_its_timeout():
    with pytest.raises(
        SchedulerUnavailableError,
        match=r"no dask scheduler answered at 'tcp://127.0.0.1:9' within 1 s",
    ):
        connect("tcp://127.0.0.1:9", timeout=1.0)


def _clients() -> set[int]:
    return {id(obj) for obj in gc.get_objects() if type(obj) is distributed.Client}


def test_a_failed_connection_leaves_no_client_for_a_later_collection():
    # A half-built client collected later, inside the next client's start, deadlocked on
    # dask's loop lock (CI hung 300 s here); connect() must leave none behind.
    before = _clients()
    for address in ("no-port-here", "tcp://127.0.0.1:9"):
        with pytest.raises(SchedulerUnavailableError):
            connect(address, timeout=1.0)
        assert _clients() <= before
