"""A training loop against a store: sample a batch, then a fixed step (a sleep), repeated.

Each loop runs with and without ``prefetch`` on a local store and on S3 (moto behind the test
suite's proxy, which delays every request, unless ``training_store`` names a real one). With
prefetch the next batches are read while the step runs, so a loop whose reads are hidden
reaches ``1 / step`` steps per second; the S3/local ratio says how much of that S3 keeps.
``training_buffer_options`` go to every buffer; the S3 buffer gets a local shard cache in a
temporary directory unless they name one (``local_cache_dir``): a learner writing to S3 and
sampling its own trajectories, as RLinf's learners do.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks.s3 import load_s3_server, proxied_bucket
from benchmarks.settings import Settings
from benchmarks.workloads import image_trajectory
from rbzarr.buffer.buffer import TrajectoryReplayBuffer
from rbzarr.trajectory.model import Trajectory

__all__ = ["loop_steps", "run_training", "store_loops"]

MODES = ("no_prefetch", "prefetch")


def loop_steps(
    sample: Callable[[], Any], steps: int, step_s: float, budget_s: float
) -> dict[str, Any]:
    """Time ``steps`` iterations of ``sample()`` then ``sleep(step_s)`` (at most ``budget_s``).

    The first batch (arrays opened, read-ahead started) is not timed.
    """
    sample()
    waits = []
    start = time.perf_counter()
    for _ in range(steps):
        began = time.perf_counter()
        sample()
        waits.append(time.perf_counter() - began)
        time.sleep(step_s)
        if time.perf_counter() - start > budget_s:
            break
    seconds = time.perf_counter() - start
    return {
        "steps": len(waits),
        "seconds": seconds,
        "steps_s": len(waits) / seconds,
        "wait_p50_ms": 1e3 * statistics.median(waits),
        "wait_max_ms": 1e3 * max(waits),
    }


def store_loops(
    url: str,
    trajectories: list[Trajectory],
    settings: Settings,
    storage_options: dict[str, Any] | None = None,
    proxy: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The loop without and with prefetch on one new store at ``url``.

    One buffer (``prefetch=training_prefetch``) serves both: without prefetch the loop passes
    its own generator, which bypasses the read-ahead (the path of a buffer without it).
    """
    options = {
        "seed": settings.seed,
        "enable_cache": False,
        "sample_window_size": len(trajectories),
        **(extra or {}),
        **settings.training_buffer_options,
    }
    batch = settings.training_batch
    results: dict[str, Any] = {}
    with TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=url,
        storage_options=storage_options,
        prefetch=settings.training_prefetch,
        **options,
    ) as buffer:
        buffer.add_trajectories(trajectories)
        buffer.flush()
        own = torch.Generator().manual_seed(settings.seed)
        loops = {
            "no_prefetch": (0, lambda: buffer.sample(batch, generator=own)),
            "prefetch": (settings.training_prefetch, lambda: buffer.sample(batch)),
        }
        for mode, (prefetch, sample) in loops.items():
            if proxy is not None:
                proxy.slow_down(settings.s3_delay_s)
                proxy.reset_log()
            found = loop_steps(
                sample,
                settings.training_steps,
                settings.training_step_s,
                settings.training_budget_s,
            )
            found["rows_s"] = found["steps_s"] * batch
            if proxy is not None:
                # Reads of batches drawn ahead and not handed out count too.
                found["requests_per_step"] = len(proxy.requests) / (found["steps"] + 1)
                proxy.slow_down(0.0)
            results[mode] = {"prefetch": prefetch, **found}
    return results


def run_training(settings: Settings, quick: bool, workdir: str | None = None) -> dict[str, Any]:
    """The training suite: loops on a local store and on S3, and the S3/local ratios."""
    T, B = (8, 4) if quick else (32, 8)
    trajectories = [
        image_trajectory(settings.seed + i, T, B) for i in range(settings.training_trajectories)
    ]
    result: dict[str, Any] = {
        "T": T,
        "B": B,
        "trajectories": len(trajectories),
        "batch": settings.training_batch,
        "step_ms": 1e3 * settings.training_step_s,
        "buffer_options": dict(settings.training_buffer_options),
    }
    with tempfile.TemporaryDirectory(dir=workdir) as root:
        result["local"] = store_loops(f"{root}/store", trajectories, settings)
    with _s3_store(settings) as found:
        if isinstance(found, str):
            result["s3"] = result["s3_vs_local"] = {"unavailable": found}
            return result
        url, options, proxy = found
        with tempfile.TemporaryDirectory(dir=workdir) as cache:
            result["s3"] = store_loops(
                url, trajectories, settings, options, proxy, {"local_cache_dir": cache}
            )
        result["s3"]["delay_s"] = settings.s3_delay_s if proxy is not None else None
    result["s3_vs_local"] = {
        mode: result["s3"][mode]["steps_s"] / result["local"][mode]["steps_s"] for mode in MODES
    }
    return result


@contextlib.contextmanager
def _s3_store(settings: Settings) -> Iterator[tuple[str, dict[str, Any], Any] | str]:
    """``(url, storage options, proxy or None)``: the named store, else moto behind the proxy."""
    if settings.training_store is not None:
        yield settings.training_store, dict(settings.training_storage_options), None
        return
    server_module = load_s3_server()
    if isinstance(server_module, str):
        yield server_module
        return
    with proxied_bucket(server_module, "training") as (_, proxy, bucket, options):
        options.update(settings.training_storage_options)
        yield f"s3://{bucket}/training", options, proxy
