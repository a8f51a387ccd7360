"""The ``priorities`` suite: prioritized replay against TorchRL, in the same run.

Cases (rows of a compact state schema: ``state`` 16 float32, ``actions`` 4, ``rewards``,
``dones``: 88 bytes a row):

* ``hot``: ``sample(256, return_info=True)`` + ``update_priority(256)`` with 10^6 rows in
  the window, all in the buffer's memory, vs TorchRL's ``PrioritizedSampler`` over a
  ``LazyTensorStorage`` of the same count;
* ``cached``: the same with 10^7 rows in an ``auto_save`` zarr store whose whole window the
  cache holds (RLinf's ``enable_cache``) vs ``LazyTensorStorage``;
* ``disk``: the same with the 10^7 rows read from the store's files (no cache) vs
  ``LazyMemmapStorage``;
* ``uniform``: uniform ``sample(256)`` of the 10^7 rows from the files vs
  ``LazyMemmapStorage`` with TorchRL's default (uniform) sampler;
* ``sequences``: ``sample_sequences(64, 16)`` + ``update_priority(64)`` vs
  ``PrioritizedSliceSampler`` (64 slices of 16, updates of the 1,024 indices it returns);
* ``distribution``: chi-square of 10^6 draws over 10^3 rows with Pareto priorities, and the
  largest importance-weight error against the closed form;
* ``kill``: priorities flushed, the writer SIGKILLed, the store resumed: equal or not;
* ``memory``: the bytes the priorities of 10^7 rows hold.

The three 10^7-row cases read one store, written once.  Every timed case alternates rbzarr
and TorchRL over :data:`ROUNDS` rounds.

TorchRL runs in its own environment (``scripts/torchrl_env.sh``, built on first use) as a
subprocess: :mod:`benchmarks.torchrl_priorities_peer`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.measure import timed
from benchmarks.report import target
from rbzarr import PrioritizedReplay, Trajectory, TrajectoryReplayBuffer
from rbzarr.sampling.priorities import WindowPriorities

__all__ = ["chi_square_p", "priorities_targets", "run_priorities"]

ROOT = Path(__file__).resolve().parents[1]
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
OBS = 16
ROUNDS = 3


def chi_square_p(counts: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Pearson's chi-square statistic of ``counts`` against ``expected`` and its p-value
    (``len - 1`` degrees of freedom: the regularised upper incomplete gamma function)."""
    statistic = float(((counts - expected) ** 2 / expected).sum())
    half_df = torch.tensor((len(counts) - 1) / 2, dtype=torch.float64)
    p = torch.special.gammaincc(half_df, torch.tensor(statistic / 2, dtype=torch.float64))
    return statistic, float(p)


def _trajectory(seed: int, T: int, B: int) -> Trajectory:
    generator = torch.Generator().manual_seed(seed)
    return Trajectory(
        max_episode_length=T,
        model_weights_id="w",
        curr_obs={"state": torch.randn(T, B, OBS, generator=generator)},
        actions=torch.randn(T, B, 4, generator=generator),
        rewards=torch.randn(T, B, 1, generator=generator),
        dones=torch.zeros(T, B, 1, dtype=torch.bool),
    )


# The cases over the one large store: (prioritized, trajectories cached).
STORED = {"cached": (True, True), "disk": (True, False), "uniform": (False, False)}


def _sizes(quick: bool) -> dict[str, dict[str, int]]:
    """Trajectories (``count`` of ``T`` x ``B`` rows) per case."""
    small = {"count": 100, "T": 40, "B": 25}
    large = small if quick else {"count": 1000, "T": 100, "B": 100}
    sizes = (
        {"hot": small, "sequences": small}
        if quick
        else {
            "hot": {"count": 1000, "T": 40, "B": 25},
            "sequences": {"count": 1000, "T": 40, "B": 25},
        }
    )
    return {**sizes, **dict.fromkeys(STORED, large)}


def _options(prioritized: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"seed": 0, "sample_window_size": 0}
    if prioritized:
        options["prioritized"] = PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS)
    return options


def _write_store(size: dict[str, int], store: str) -> float:
    """Write the large cases' store; the seconds it took."""
    began = time.perf_counter()
    options = _options(True)
    with TrajectoryReplayBuffer(**options, auto_save=True, auto_save_path=store) as buffer:
        for k in range(size["count"]):
            buffer.add_trajectories([_trajectory(k, size["T"], size["B"])])
        buffer.flush()
    return time.perf_counter() - began


def _ours(case: str, size: dict[str, int], calls: int, budget: float, store: str) -> dict:
    """Our buffer's step for ``case``: latencies, and the time to fill it (or load the
    store, for the cases of :data:`STORED`)."""
    prioritized, cached = STORED.get(case, (True, True))
    options = _options(prioritized)
    if case in STORED:
        # No hand setting: the zarr layout keeps the window's trajectories open itself.
        options.update(auto_save=True, auto_save_path=store, cache_size=size["count"] * cached)
    generator = torch.Generator().manual_seed(1)
    with TrajectoryReplayBuffer(**options) as buffer:
        began = time.perf_counter()
        if case in STORED:
            buffer.load_checkpoint(store)
        else:
            for k in range(size["count"]):
                buffer.add_trajectories([_trajectory(k, size["T"], size["B"])])
        buffer.flush()
        fill_s = time.perf_counter() - began

        def rows() -> None:
            _, info = buffer.sample(256, return_info=True)
            buffer.update_priority(info["index"], torch.rand(256, generator=generator) + 0.01)

        def uniform() -> None:
            buffer.sample(256)

        def sequences() -> None:
            _, info = buffer.sample_sequences(64, 16, return_info=True)
            buffer.update_priority(info["index"], torch.rand(64, generator=generator) + 0.01)

        step = {"sequences": sequences, "uniform": uniform}.get(case, rows)
        latencies = timed(step, calls, budget)
        stats = buffer.get_stats()
        return {
            "latencies": latencies,
            "fill_s": fill_s,
            "rows": buffer.total_samples,
            "cached_trajectories": stats["cache_size"],
            "kernels": stats.get("priority_kernels"),
        }


def _peer(sizes: dict[str, dict[str, int]], calls: int, budget: float, root: str) -> dict:
    """TorchRL's half, in its environment; ``{"unavailable": why}`` when it cannot run."""
    script = ROOT / "scripts" / "torchrl_env.sh"
    built = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=False, timeout=3600
    )
    if built.returncode != 0:
        return {"unavailable": f"scripts/torchrl_env.sh failed: {built.stderr[-500:]}"}
    python = built.stdout.strip().splitlines()[-1]
    cases = {}
    for name, size in sizes.items():
        cases[name] = {
            "kind": name if name in ("sequences", "uniform") else "rows",
            "rows": size["count"] * size["T"] * size["B"],
            "batch": 64 if name == "sequences" else 256,
            "length": 16,
            "alpha": ALPHA,
            "beta": BETA,
            "obs": OBS,
            "episode": size["T"] * size["B"],
            "disk": name in ("disk", "uniform"),
            "calls": calls,
            "budget": budget,
        }
    request = {"cases": cases, "workdir": root, "threads": torch.get_num_threads()}
    done = subprocess.run(
        [python, str(ROOT / "benchmarks" / "torchrl_priorities_peer.py"), json.dumps(request)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode != 0:
        return {"unavailable": f"the TorchRL peer failed: {done.stderr[-800:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _distribution(draws: int) -> dict[str, Any]:
    """Chi-square of ``draws`` over 10^3 skewed rows; the largest weight error."""
    buffer = TrajectoryReplayBuffer(
        seed=0,
        sample_window_size=0,
        prioritized=PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS),
    )
    buffer.add_trajectories([_trajectory(k, 10, 10) for k in range(10)])
    index = torch.tensor([(k << 32) | r for k in range(10) for r in range(100)])
    priorities = np.random.default_rng(0).pareto(1.2, size=1000).astype(np.float32) + 0.01
    buffer.update_priority(index, priorities)
    mass = (priorities.astype(np.float64) + EPS) ** ALPHA
    probability = mass / mass.sum()
    counts = np.zeros(1000)
    worst = 0.0
    for _ in range(max(1, draws // 100_000)):
        _, info = buffer.sample(min(draws, 100_000), return_info=True)
        got = info["index"].numpy()
        flat = (got >> 32) * 100 + (got & 0xFFFFFFFF)
        np.add.at(counts, flat, 1)
        closed = (probability[flat] / probability.min()) ** -BETA
        worst = max(worst, float(np.abs(info["weight"].numpy() - closed).max()))
    statistic, p_value = chi_square_p(counts, probability * counts.sum())
    return {
        "draws": int(counts.sum()),
        "rows": 1000,
        "p_value": p_value,
        "chi2": statistic,
        "max_weight_error": worst,
    }


def _kill(root: str) -> dict[str, Any]:
    """Flush priorities, SIGKILL the writer, resume: are the priorities those flushed?"""
    store = f"{root}/killed"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from benchmarks.priorities import _trajectory
        from rbzarr import PrioritizedReplay, TrajectoryReplayBuffer
        buffer = TrajectoryReplayBuffer(
            seed=1, sample_window_size=0, auto_save=True, auto_save_path={store!r},
            prioritized=PrioritizedReplay(alpha={ALPHA}, beta={BETA}, eps={EPS}),
        )
        buffer.add_trajectories([_trajectory(k, 20, 10) for k in range(20)])
        for step in range(20):
            _, info = buffer.sample(256, return_info=True)
            buffer.update_priority(info["index"], torch.rand(256) * 10)
        buffer.flush()
        index = torch.tensor([(k << 32) | r for k in range(20) for r in range(200)])
        torch.save(buffer.get_priority(index), {store + ".flushed"!r})
        buffer.update_priority(index, 77.0)  # never flushed
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=600
    )
    flushed = torch.load(store + ".flushed")
    resumed = TrajectoryReplayBuffer(
        seed=1,
        sample_window_size=0,
        prioritized=PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS),
    )
    resumed.load_checkpoint(store)
    index = torch.tensor([(k << 32) | r for k in range(20) for r in range(200)])
    return {
        "killed": done.returncode == -9,
        "rows": len(index),
        "equal": bool(torch.equal(resumed.get_priority(index), flushed)),
    }


def _memory(rows: int) -> dict[str, Any]:
    """Bytes held for the priorities of ``rows`` rows (trajectories of 10^4)."""
    priorities = WindowPriorities(PrioritizedReplay(alpha=ALPHA, beta=BETA, eps=EPS))
    count = rows // 10_000
    priorities.sync(list(range(count)), [10_000] * count)
    return {
        "rows": rows,
        "bytes": priorities.nbytes,
        "float32_bytes": 4 * rows,
        "float64_bytes": 8 * rows,
    }


def run_priorities(quick: bool, workdir: str | None) -> dict[str, Any]:
    """Every case of the suite (``quick``: small sizes, for smoke tests).

    Every timed case alternates rbzarr and TorchRL over :data:`ROUNDS` rounds (the host is
    shared: its load drifts); each side's figure is the median of its rounds' medians.
    """
    sizes = _sizes(quick)
    calls, budget = (30, 2.0) if quick else (300, 10.0)
    rounds = 1 if quick else ROUNDS
    measured: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"ours": [], "torchrl": []} for name in sizes
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=workdir) as root:
        store = f"{root}/store"
        results["store_write_s"] = _write_store(sizes["disk"], store)
        for _ in range(rounds):
            for name in sizes:
                with tempfile.TemporaryDirectory(dir=root) as case_root:
                    where = store if name in STORED else case_root
                    measured[name]["ours"].append(
                        _summary(_ours(name, sizes[name], calls, budget, where))
                    )
            peer = _peer(sizes, calls, budget, root)
            results["torchrl_versions"] = peer.get("versions")
            for name in sizes:
                if "unavailable" in peer:
                    measured[name]["torchrl"].append({"unavailable": peer["unavailable"]})
                else:
                    measured[name]["torchrl"].append(_summary(peer["cases"][name]))
        for name, sides in measured.items():
            results[name] = {side: _rounds(found) for side, found in sides.items()}
        results["distribution"] = _distribution(100_000 if quick else 1_000_000)
        results["kill"] = _kill(root)
    results["memory"] = _memory(10**5 if quick else 10**7)
    results["python"] = sys.version.split()[0]
    results["cpus"] = os.cpu_count()
    return results


def _rounds(found: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds: the median of their medians, and each round's."""
    if "unavailable" in found[0]:
        return found[0]
    medians = [round_["p50_ms"] for round_ in found]
    return {**found[0], "p50_ms": statistics.median(medians), "round_p50_ms": medians}


def _summary(measured: dict[str, Any]) -> dict[str, Any]:
    latencies = measured.pop("latencies")
    return {
        **measured,
        "calls": len(latencies),
        "p50_ms": 1e3 * statistics.median(latencies),
        "mean_ms": 1e3 * statistics.fmean(latencies),
    }


def _ratio(results: dict[str, Any], case: str) -> tuple[float | None, str | None]:
    peer = results[case]["torchrl"]
    if "unavailable" in peer:
        return None, peer["unavailable"]
    return results[case]["ours"]["p50_ms"] / peer["p50_ms"], None


def priorities_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's targets, evaluated on ``results``."""
    versions = results.get("torchrl_versions") or {}
    peer = ", ".join(f"{k} {v}" for k, v in versions.items()) or "TorchRL"
    found = []
    for case, name, meaning, limit in (
        (
            "hot",
            "sample(256) + update_priority(256), hot, vs PrioritizedSampler",
            "median time per step vs TorchRL's over LazyTensorStorage",
            1.0,
        ),
        (
            "cached",
            "the same, the window in the cache, vs PrioritizedSampler",
            "median time per step, zarr store with the window cached vs LazyTensorStorage",
            1.0,
        ),
        (
            "disk",
            "the same, rows from disk, vs LazyMemmapStorage",
            "median time per step, zarr store without cache vs TorchRL's memmap storage",
            2.0,
        ),
        (
            "uniform",
            "uniform sample(256) from disk vs LazyMemmapStorage",
            "median time per batch, zarr store without cache vs TorchRL's memmap storage",
            1.5,
        ),
        (
            "sequences",
            "prioritized sequences 64 x 16 vs PrioritizedSliceSampler",
            "median time of sample_sequences + update_priority vs TorchRL's slice sampler",
            1.0,
        ),
    ):
        value, reason = _ratio(results, case)
        rows = results[case]["ours"]["rows"]
        found.append(
            target(f"{name} ({rows:,} rows)", f"{meaning} ({peer})", value, limit, "<=", reason)
        )
    distribution = results["distribution"]
    found.append(
        target(
            "chi-square p of drawn frequencies",
            f"{distribution['draws']:,} draws over {distribution['rows']:,} Pareto-skewed rows",
            distribution["p_value"],
            0.01,
            ">=",
        )
    )
    found.append(
        target(
            "importance weights vs the closed form",
            "largest absolute error",
            distribution["max_weight_error"],
            1e-6,
            "<=",
        )
    )
    kill = results["kill"]
    found.append(
        target(
            "priorities after kill -9 after flush, resumed",
            "1 when equal to those flushed",
            float(kill["equal"] and kill["killed"]),
            1.0,
            ">=",
        )
    )
    memory = results["memory"]
    found.append(
        target(
            f"memory for priorities at {memory['rows']:,} rows vs a float32 array",
            f"{memory['bytes']:,} bytes ({memory['bytes'] / memory['float64_bytes']:.2f}x float64)",
            memory["bytes"] / memory["float32_bytes"],
            2.0,
            "<=",
        )
    )
    return found
