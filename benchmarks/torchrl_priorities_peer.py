"""TorchRL's prioritized samplers, timed in TorchRL's own environment (a subprocess).

Run by :mod:`benchmarks.priorities` with the python of ``scripts/torchrl_env.sh``; imports
only torch, tensordict and torchrl.  Reads one JSON request on argv[1], prints one JSON
result: the versions, and per case the latencies of ``sample`` + ``update_priority``.

Cases: ``rows`` (``PrioritizedSampler`` over ``LazyTensorStorage`` or, with ``disk``,
``LazyMemmapStorage``; batches of ``batch`` rows), ``uniform`` (``RandomSampler``, no
update) and ``sequences``
(``PrioritizedSliceSampler``, ``batch`` sequences of ``length`` steps).
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from typing import Any

import tensordict
import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
)


def rows_of(count: int, obs: int, episode: int, seed: int) -> TensorDict:
    """``count`` rows of the benchmark's schema (obs, action, reward, done, episode id)."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(count, obs, generator=generator),
            "action": torch.randn(count, 4, generator=generator),
            "reward": torch.randn(count, 1, generator=generator),
            "done": torch.zeros(count, 1, dtype=torch.bool),
            "episode": torch.arange(count) // episode,
        },
        batch_size=[count],
    )


def timed(step: Any, calls: int, budget: float) -> list[float]:
    step()
    latencies: list[float] = []
    while len(latencies) < calls and (len(latencies) < 5 or sum(latencies) < budget):
        start = time.perf_counter()
        step()
        latencies.append(time.perf_counter() - start)
    return latencies


def run_case(case: dict[str, Any], scratch: str) -> dict[str, Any]:
    count, batch = case["rows"], case["batch"]
    alpha, beta = case["alpha"], case["beta"]
    storage: Any
    if case.get("disk"):
        storage = LazyMemmapStorage(count, scratch_dir=scratch)
    else:
        storage = LazyTensorStorage(count)
    if case["kind"] == "sequences":
        sampler: Any = PrioritizedSliceSampler(
            max_capacity=count,
            alpha=alpha,
            beta=beta,
            slice_len=case["length"],
            traj_key="episode",
            strict_length=False,
        )
        size = batch * case["length"]
    elif case["kind"] == "uniform":
        sampler = RandomSampler()
        size = batch
    else:
        sampler = PrioritizedSampler(max_capacity=count, alpha=alpha, beta=beta)
        size = batch
    buffer = ReplayBuffer(storage=storage, sampler=sampler, batch_size=size)
    start = time.perf_counter()
    chunk = 1 << 20
    for first in range(0, count, chunk):
        rows = rows_of(min(chunk, count - first), case["obs"], case["episode"], first)
        rows["episode"] += first // case["episode"]
        buffer.extend(rows)
    fill_s = time.perf_counter() - start
    generator = torch.Generator().manual_seed(0)

    def uniform() -> None:
        buffer.sample()

    def step() -> None:
        _, info = buffer.sample(return_info=True)
        priorities = torch.rand(len(info["index"]), generator=generator) + 0.01
        buffer.update_priority(info["index"], priorities)

    latencies = timed(uniform if case["kind"] == "uniform" else step, case["calls"], case["budget"])
    return {"latencies": latencies, "fill_s": fill_s}


def main() -> None:
    request = json.loads(sys.argv[1])
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(request.get("threads", 1))
    out: dict[str, Any] = {
        "versions": {
            "torch": torch.__version__,
            "torchrl": torchrl.__version__,
            "tensordict": tensordict.__version__,
        },
        "cases": {},
    }
    for name, case in request["cases"].items():
        with tempfile.TemporaryDirectory(dir=request.get("workdir")) as scratch:
            out["cases"][name] = run_case(case, scratch)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
