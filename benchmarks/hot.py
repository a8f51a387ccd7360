"""Hot sampling: every trajectory of the window in the buffer's cache (``auto_save=False``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks import baselines
from benchmarks.draws import DrawSequence, TrackedBuffer, gather_rows, same_rows
from benchmarks.measure import add_all, add_latency, row_bytes
from benchmarks.settings import Settings
from benchmarks.torchrl_peer import TorchRLPeer, torchrl_missing
from benchmarks.workloads import Workload, trajectory_sequence
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory import tree
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import validate

__all__ = ["run_hot"]


def run_hot(workload: Workload, settings: Settings) -> dict[str, Any]:
    """The hot mode of ``workload``: buffer, limit, TorchRL and RLinf-style figures."""
    trajectories = trajectory_sequence(workload, settings)
    per_row = row_bytes(trajectories[0])
    run = baselines.HotRun(
        workload.batch, settings.hot_calls, settings.budget_s, settings.seed, per_row
    )
    batch = run.batch
    flats = [flatten_trajectory(t, validate(t)) for t in trajectories]
    sequence = DrawSequence([len(next(iter(f.values()))) for f in flats], batch, run.seed)
    with TrajectoryReplayBuffer(
        seed=run.seed, sample_window_size=len(trajectories), auto_save=False
    ) as buffer:
        adds, copies = add_all(buffer, trajectories)
        tracked = TrackedBuffer(buffer, batch)
        checked = same_rows(tree.flatten(tracked.sample()), gather_rows(flats, *sequence.at(0)))
        measured = run.measure(tracked.sample)
    del buffer, tracked  # free the cached window before the peers allocate theirs
    result: dict[str, Any] = {
        "row_bytes": per_row,
        "rows": sum(validate(t).num_samples for t in trajectories),
        "add": add_latency(adds, copies),
        "same_rows": checked,
        "buffer": measured,
    }
    rows = len(trajectories) * workload.T * workload.B
    result["limit"] = baselines.hot_limit(rows, run)
    result["torchrl_tensor"] = _torchrl_hot(flats, sequence, run)
    result["rlinf_style"] = baselines.rlinf_hot(trajectories, run)
    if workload.name == "state":
        loop = dataclasses.replace(run, calls=max(3, run.calls // 10))
        result["per_row_loop"] = baselines.per_row_loop(trajectories, loop)
    result["vs_limit"] = result["limit"]["rows_s"] / result["buffer"]["rows_s"]
    result["speedup_vs_rlinf_style"] = result["buffer"]["rows_s"] / result["rlinf_style"]["rows_s"]
    return result


def _torchrl_hot(
    flats: list[dict[str, Any]], sequence: DrawSequence, run: baselines.HotRun
) -> dict[str, Any]:
    """``LazyTensorStorage.get`` of the buffer's own batches (draws 1, 2, ...)."""
    missing = torchrl_missing()
    if missing is not None:
        return {"unavailable": missing}
    peer = TorchRLPeer(flats, scratch_dir=None)
    checked = same_rows(
        peer.get(peer.indices(*sequence.at(0))), gather_rows(flats, *sequence.at(0))
    )
    batches = iter(range(1, run.calls + 2))
    measured = run.measure(lambda: peer.get(peer.indices(*sequence.at(next(batches)))))
    return {"storage": peer.kind, "same_rows": checked, **measured}
