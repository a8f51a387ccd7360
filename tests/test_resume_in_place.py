"""Continuing in place: ``load_checkpoint(auto_save_path)`` after a clean ``close()`` draws
what one uninterrupted run would, because the store records the samplers' state at close."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import make_trajectory

from rbzarr import TrajectoryReplayBuffer


def _batches(buffer: TrajectoryReplayBuffer, count: int) -> list[torch.Tensor]:
    return [buffer.sample(16)["rewards"] for _ in range(count)]


def _run(store: Path) -> TrajectoryReplayBuffer:
    buffer = TrajectoryReplayBuffer(seed=3, auto_save=True, auto_save_path=store)
    buffer.add_trajectories([make_trajectory(6, 2, i) for i in range(6)])
    return buffer


def test_a_clean_close_then_load_continues_the_draws(tmp_path: Path) -> None:
    with _run(tmp_path / "whole") as whole:
        expected = _batches(whole, 8)
        sequences = whole.sample_sequences(4, 3)["rewards"]

    with _run(tmp_path / "parts") as first:
        drawn = _batches(first, 3)
    with TrajectoryReplayBuffer(seed=3, auto_save=True, auto_save_path=tmp_path / "parts") as again:
        again.load_checkpoint(tmp_path / "parts")
        drawn += _batches(again, 5)
        assert torch.equal(again.sample_sequences(4, 3)["rewards"], sequences)
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))


def test_a_buffer_that_drew_nothing_writes_nothing_at_close(tmp_path: Path) -> None:
    with _run(tmp_path / "s"):
        pass
    documents = sorted(p for p in (tmp_path / "s").rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in documents}
    with TrajectoryReplayBuffer(seed=3, auto_save=True, auto_save_path=tmp_path / "s") as reader:
        reader.load_checkpoint(tmp_path / "s")
    assert {p: p.stat().st_mtime_ns for p in documents if p.exists()} == stamps
    metadata = json.loads((tmp_path / "s" / "metadata.json").read_text())
    assert "sampler" not in metadata
