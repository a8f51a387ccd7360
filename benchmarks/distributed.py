"""The ``distributed`` suite (issue 22): many writers, notices, add by reference, Ray actors.

Figures, each on the local disk (a temporary folder):

* ``notice``: the pickled size of one commit notice;
* ``add_by_reference``: ``add_committed`` latency (p50) for a 1 MB and a 100 MB trajectory;
* ``writers``: aggregate MB/s of 1 and of 2 writer processes appending to one store
  (alternating rounds, the median ratio), the cores they kept busy, and the control of 2
  writers into 2 stores of their own;
* ``kill``: 4 writers x 20 trajectories, one SIGKILLed: flushed trajectories missing after;
* ``ray_actor``: add+sample throughput of a buffer owned by a Ray actor and of TorchRL's
  ``RayReplayBuffer`` on the same workload ("unavailable" without ray or torchrl).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from benchmarks.report import target
from rbzarr.analysis.view import open_buffer
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.distributed.notices import CommitNotice, commit_notices
from rbzarr.trajectory.model import Trajectory

__all__ = ["distributed_targets", "run_distributed"]

B = 4


def _trajectory(megabytes: float, seed: int, width: int = 8192) -> Trajectory:
    """A trajectory of about ``megabytes`` MB of float32 observations ``[T, B, width]``."""
    T = max(1, round(megabytes * 2**20 / (B * width * 4)))
    generator = torch.Generator().manual_seed(seed)
    return Trajectory(
        rewards=torch.rand(T, B, 1, generator=generator),
        actions=torch.zeros(T, B, 1, dtype=torch.int64),
        curr_obs={"state": torch.rand(T, B, width, generator=generator)},
    )


def _committed(store: str, trajectory: Trajectory) -> CommitNotice:
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, cache_size=0) as writer:
        writer.add_trajectories([trajectory])
        writer.flush()
        return commit_notices(writer, writer.trajectory_ids[-1:])[0]


def _add_latency(store: str, notice: CommitNotice, repeats: int) -> float:
    """p50 seconds of one ``add_committed`` into a fresh learner."""
    times = []
    for _ in range(repeats):
        with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as learner:
            start = time.perf_counter()
            learner.add_committed([notice])
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _by_reference(root: str, quick: bool) -> dict[str, Any]:
    store = os.path.join(root, "reference")
    small = _committed(store, _trajectory(1, 0))
    large = _committed(store, _trajectory(25 if quick else 100, 1))
    repeats = 5 if quick else 9
    p50 = {"1MB": _add_latency(store, small, repeats), "100MB": _add_latency(store, large, repeats)}
    if quick:
        p50["25MB (quick)"] = p50.pop("100MB")
    values = list(p50.values())
    return {"p50_s": p50, "ratio": max(values) / min(values)}


def _write(store: str, count: int, megabytes: float, seed: int, start: Any, done: Any) -> None:
    """A writer process: open the store, meet the others at ``start``, append ``count``
    trajectories, flush, and put the time its last commit ended on ``done``."""
    trajectories = [_trajectory(megabytes, seed * 1000 + k) for k in range(count)]
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, cache_size=0, max_pending_writes=2
    ) as buffer:
        start.wait()
        cpu = time.process_time()
        for trajectory in trajectories:
            buffer.add_trajectories([trajectory])
        buffer.flush()
        # perf_counter is CLOCK_MONOTONIC: one clock for every process.
        done.put((time.perf_counter(), time.process_time() - cpu))


def _aggregate(
    root: str, writers: int, count: int, megabytes: float, name: str, apart: bool = False
) -> tuple[float, float]:
    """MB/s of ``writers`` processes, each appending ``count`` trajectories to one store
    (``apart``: each to its own), from the moment all have opened it to the last commit
    (process exits not timed), and the cores they kept busy meanwhile (their CPU seconds
    / that time)."""
    context = _processes()
    start, done = context.Barrier(writers + 1), context.Queue()
    stores = [os.path.join(root, f"{name}-{w}" if apart else name) for w in range(writers)]
    processes = [
        context.Process(target=_write, args=(stores[w], count, megabytes, w, start, done))
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    start.wait()  # every writer has opened the store
    began = time.perf_counter()
    reports = [done.get(timeout=300) for _ in processes]
    for process in processes:
        process.join()
    seconds = max(ended for ended, _ in reports) - began
    return writers * count * megabytes / seconds, sum(cpu for _, cpu in reports) / seconds


def _writers(root: str, quick: bool) -> dict[str, Any]:
    """1 writer vs 2, in alternating rounds (a busy host's noise falls on both alike); the
    ratio is the median of the rounds' ratios.  The control, 2 writers into 2 stores of
    their own, shares nothing: if it is no faster than 2 into one store, the host (its
    cores, its disk) is the limit, not the store."""
    count, megabytes = (6, 8.0) if quick else (8, 16.0)
    runs: dict[str, list[tuple[float, float]]] = {"one": [], "two": [], "two_apart": []}
    for r in range(2 if quick else 7):  # rounds of ~0.1-1 s swing 2x on a shared host
        runs["one"].append(_aggregate(root, 1, count, megabytes, f"one-{r}"))
        runs["two"].append(_aggregate(root, 2, count, megabytes, f"two-{r}"))
        runs["two_apart"].append(_aggregate(root, 2, count, megabytes, f"apart-{r}", True))
    ratios = [b[0] / a[0] for a, b in zip(runs["one"], runs["two"], strict=True)]
    control = [b[0] / a[0] for a, b in zip(runs["one"], runs["two_apart"], strict=True)]
    figures: dict[str, Any] = {}
    for name, measured in runs.items():
        figures[f"{name}_mb_s"] = statistics.median(mb_s for mb_s, _ in measured)
        # Cores busy: about 1 for one writer, 2 for two when the host has both cores free.
        figures[f"{name}_cores"] = statistics.median(cores for _, cores in measured)
    return {
        **figures,
        "round_ratios": ratios,
        "ratio": statistics.median(ratios),
        # The control measured as the figure is: 2 writers sharing nothing against 1.
        "control_round_ratios": control,
        "control_ratio": statistics.median(control),
    }


def _kill_writer(store: str, writer: int, report: str) -> None:
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, cache_size=0) as buffer:
        fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for k in range(20):
            buffer.add_trajectories([_trajectory(0.01, writer * 100 + k, width=16)])
            buffer.flush()
            os.write(fd, f"{buffer.trajectory_ids[-1]}\n".encode())


def _kill(root: str) -> dict[str, Any]:
    """4 writers x 20, writer 1 SIGKILLed after its 5th flush: flushed ids not listed after."""
    context = _processes()
    store = os.path.join(root, "kill")
    reports = [os.path.join(root, f"kill-{w}.txt") for w in range(4)]
    processes = [
        context.Process(target=_kill_writer, args=(store, w, reports[w])) for w in range(4)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_lines(reports[1])) < 5:
        time.sleep(0.005)
    os.kill(processes[1].pid or 0, signal.SIGKILL)
    for process in processes:
        process.join()
    flushed = {int(line) for report in reports for line in _lines(report)}
    listed = open_buffer(store).ids
    return {
        "flushed": len(flushed),
        "listed": len(listed),
        "lost": len(flushed - set(listed)),
        "duplicated": len(listed) - len(set(listed)),
    }


def _processes() -> Any:
    """A fork server's context: a forked child of this process could inherit zarr's event
    loop without its thread, and hang."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["benchmarks.distributed"])
    return context


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return handle.read().split()


def _throughput(step: Callable[[int], None], steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps / (time.perf_counter() - start)


def _ray_actor(quick: bool) -> dict[str, Any]:
    """Steps/s of (add one trajectory, sample 256 rows) through each buffer actor."""
    try:
        import ray  # noqa: PLC0415  (optional)
        from tensordict import TensorDict  # noqa: PLC0415
        from torchrl.data import LazyTensorStorage, RayReplayBuffer  # noqa: PLC0415
    except ImportError as exc:
        return {"unavailable": f"needs ray and torchrl: {exc}"}
    from rbzarr.distributed.ray_actor import remote_buffer  # noqa: PLC0415

    steps = 20 if quick else 80
    trajectories = [_trajectory(0.05, k, width=100) for k in range(steps)]
    with _ray_cluster(ray):
        ours = remote_buffer(seed=0, sample_window_size=0)
        ray.get(ours.size.remote())

        def ours_step(i: int) -> None:
            ray.get(ours.add_trajectories.remote([trajectories[i]]))
            ray.get(ours.sample.remote(256))

        theirs = RayReplayBuffer(
            storage=partial(LazyTensorStorage, 64 * B * steps),
            batch_size=256,
            remote_config={"num_cpus": 0},
        )

        def theirs_step(i: int) -> None:
            t = trajectories[i]
            state = t.curr_obs["state"]
            n = state.shape[0] * B
            rows = TensorDict(
                {
                    "rewards": torch.as_tensor(t.rewards).reshape(n, -1),
                    "actions": torch.as_tensor(t.actions).reshape(n, -1),
                    "state": state.reshape(n, -1),
                },
                batch_size=[n],
            )
            theirs.extend(rows)
            theirs.sample()

        ours_step(0)
        theirs_step(0)  # both actors started and warm
        # Short interleaved rounds, the order swapped every round: a shared machine's
        # noise falls on both alike, and the median ratio leaves its bursts out.
        rounds = 4 if quick else 8
        per_round = (steps - 1) // rounds
        ours_s: list[float] = []
        theirs_s: list[float] = []
        for r in range(rounds):
            offset = 1 + r * per_round
            pair = [
                (ours_s, partial(_shifted, ours_step, offset)),
                (theirs_s, partial(_shifted, theirs_step, offset)),
            ]
            for figures, step in pair if r % 2 == 0 else pair[::-1]:
                figures.append(_throughput(step, per_round))
        theirs.shutdown()
    ratios = [a / b for a, b in zip(ours_s, theirs_s, strict=True)]
    return {
        "rbzarr_steps_s": statistics.median(ours_s),
        "torchrl_steps_s": statistics.median(theirs_s),
        "round_ratios": ratios,
        "ratio": statistics.median(ratios),
    }


def _shifted(step: Callable[[int], None], offset: int, i: int) -> None:
    step(offset + i)


@contextlib.contextmanager
def _ray_cluster(ray: Any) -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            log_to_driver=False,
        )
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_distributed(quick: bool = False) -> dict[str, Any]:
    """Every figure of the suite (see the module docs)."""
    with tempfile.TemporaryDirectory() as root:
        store = os.path.join(root, "notice")
        notice = _committed(store, _trajectory(1, 0))
        results: dict[str, Any] = {"notice": {"bytes": len(pickle.dumps(notice))}}
        results["add_by_reference"] = _by_reference(root, quick)
        results["writers"] = _writers(root, quick)
        results["kill"] = _kill(root)
    results["ray_actor"] = _ray_actor(quick)
    return results


def distributed_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's targets."""
    actor = results.get("ray_actor", {})
    kill = results["kill"]
    return [
        target(
            "channel payload per trajectory <= 1 KB",
            "pickled bytes of one CommitNotice",
            results["notice"]["bytes"],
            1024,
            "<=",
        ),
        target(
            "add-by-reference latency, 1 MB vs 100 MB, within 2x",
            "p50 add_committed of the larger / of the smaller trajectory",
            results["add_by_reference"]["ratio"],
            2.0,
            "<=",
        ),
        target(
            "aggregate write throughput, 2 writers vs 1 >= 1.6x",
            "MB/s of 2 writer processes into one store / MB/s of 1",
            results["writers"]["ratio"],
            1.6,
            ">=",
        ),
        target(
            "Ray actor add+sample >= TorchRL RayReplayBuffer",
            "steps/s (add one trajectory, sample 256 rows) of rbzarr's BufferActor / TorchRL's",
            actor.get("ratio"),
            1.0,
            ">=",
            reason=actor.get("unavailable"),
        ),
        target(
            "flushed trajectories lost, 4 writers and a kill -9 (local)",
            "flushed ids a reader does not list afterwards, plus duplicated ids",
            kill["lost"] + kill["duplicated"],
            0,
            "<=",
        ),
    ]
