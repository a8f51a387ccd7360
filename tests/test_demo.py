"""The main job runs end to end, and its store and checkpoint reopen and sample."""

from __future__ import annotations

import json

from rbzarr import TrajectoryReplayBuffer
from rbzarr.demo import DemoSettings, report, run_demo


def test_demo_runs_and_its_outputs_reopen(tmp_path):
    settings = DemoSettings(
        store=tmp_path,
        num_envs=4,
        steps_per_trajectory=8,
        trajectories=5,
        batch_size=16,
        updates_per_trajectory=2,
        sample_window_size=3,
        cache_size=1,
        progress=False,
    )
    result = run_demo(settings)
    assert result.env_steps == 5 * 8 * 4
    assert result.rows_sampled == 5 * 2 * 16
    assert str(result.store) in report(result)
    index = json.loads((result.store / "trajectory_index.json").read_text())
    assert index["trajectory_id_list"] == [0, 1, 2, 3, 4]
    checkpoint = json.loads((result.checkpoint / "trajectory_index.json").read_text())
    assert checkpoint["trajectory_id_list"] == [2, 3, 4]
    for path, count in ((result.store, 5), (result.checkpoint, 3)):
        buffer = TrajectoryReplayBuffer(sample_window_size=0)
        buffer.load_checkpoint(path)
        assert len(buffer) == count
        batch = buffer.sample(32)
        assert batch["curr_obs"]["state"].shape == (32, 4)
        assert batch["dones"].dtype.is_floating_point is False
