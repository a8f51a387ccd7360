"""Channel: put/get/get_batch/close over threads and across processes."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.multiprocessing as torch_mp

from rbzarr.errors import ChannelClosedError, ChannelTimeoutError
from rbzarr.rollout.channel import Channel
from rbzarr.trajectory.model import Trajectory

BACKENDS = [
    pytest.param({"backend": "thread"}, id="thread"),
    pytest.param({"backend": "process", "context": "spawn"}, id="process"),
]


@pytest.mark.parametrize("options", BACKENDS)
def test_fifo_batches_and_close(options: dict[str, Any]) -> None:
    channel = Channel(maxsize=8, **options)
    for i in range(5):
        channel.put(i)
    assert channel.get() == 0
    batch = channel.get_batch(3)  # a process channel may not have them all ready yet
    while len(batch) < 3:
        batch += channel.get_batch(3 - len(batch))
    assert batch == [1, 2, 3]
    channel.put(5)
    channel.close()
    assert channel.closed
    with pytest.raises(ChannelClosedError, match="put: the channel is closed"):
        channel.put(6)
    assert list(channel) == [4, 5]  # closed channels drain first
    with pytest.raises(ChannelClosedError, match="closed and drained"):
        channel.get(timeout=0)
    with pytest.raises(ChannelClosedError):
        channel.get_batch(2)
    channel.close()  # idempotent


@pytest.mark.parametrize("options", BACKENDS)
def test_timeouts(options: dict[str, Any]) -> None:
    channel = Channel(maxsize=1, **options)
    with pytest.raises(ChannelTimeoutError, match="get: channel stayed empty"):
        channel.get(timeout=0.01)
    with pytest.raises(ChannelTimeoutError):
        channel.get_batch(4, timeout=0)
    channel.put("a")
    with pytest.raises(ChannelTimeoutError, match="put: channel stayed full"):
        channel.put("b", timeout=0.01)
    assert channel.get_batch(4, timeout=30) == ["a"]
    channel.put("c", timeout=0)
    assert channel.get(timeout=30) == "c"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("options", BACKENDS)
@pytest.mark.parametrize("blocked", ["get", "put"])
def test_close_wakes_blocked_callers(options: dict[str, Any], blocked: str) -> None:
    channel = Channel(maxsize=1, **options)
    if blocked == "put":
        channel.put("filler")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            channel.get() if blocked == "get" else channel.put("more")
        except ChannelClosedError as error:
            outcome.append(error)

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    channel.close()
    for waiter in waiters:
        waiter.join()
    assert len(outcome) == 2 and all(isinstance(e, ChannelClosedError) for e in outcome)


def test_thread_get_batch_takes_every_ready_item() -> None:
    channel = Channel()
    for i in range(5):
        channel.put(i)
    assert channel.get_batch(3) == [0, 1, 2]
    assert channel.get_batch(10, timeout=0) == [3, 4]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="backend must be 'thread' or 'process', got 'x'"):
        Channel(backend="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context applies only"):
        Channel(context="spawn")
    channel = Channel()
    with pytest.raises(ValueError, match="max_items must be >= 1, got 0"):
        channel.get_batch(0)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        channel.get(timeout=-1)


def test_thread_channel_refuses_to_cross_processes() -> None:
    context = torch_mp.get_context("spawn")
    with pytest.raises(TypeError, match="use 'process'"):
        context.Process(target=print, args=(Channel(),)).start()


def _produce(channel: Channel, count: int, received: Any) -> None:
    """Child process: put tensors and a trajectory, close, and stay alive until received."""
    for i in range(count):
        channel.put(torch.full((4,), float(i)))
    channel.put(Trajectory(rewards=torch.arange(6.0).reshape(3, 2, 1), model_weights_id="w"))
    channel.close()
    received.wait(timeout=120)


@pytest.mark.timeout(120)
def test_cross_process_tensors() -> None:
    context = torch_mp.get_context("spawn")
    channel = Channel(maxsize=2, backend="process", context="spawn")
    received = context.Event()
    child = context.Process(target=_produce, args=(channel, 5, received))
    child.start()
    try:
        items = [channel.get(timeout=60)]
        while True:
            try:
                items.extend(channel.get_batch(3, timeout=60))
            except ChannelClosedError:
                break
    finally:
        received.set()
        child.join(timeout=60)
    assert child.exitcode == 0
    tensors, trajectory = items[:-1], items[-1]
    assert [t.tolist() for t in tensors] == [[float(i)] * 4 for i in range(5)]
    assert all(t.is_shared() for t in tensors)
    assert isinstance(trajectory, Trajectory) and trajectory.model_weights_id == "w"
    assert trajectory.rewards is not None
    assert torch.equal(trajectory.rewards, torch.arange(6.0).reshape(3, 2, 1))
    assert channel.closed
    with pytest.raises(ChannelClosedError):
        channel.get(timeout=1)
