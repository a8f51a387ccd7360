"""How much work a benchmark run does, and the tiny settings of ``--quick``."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["QUICK", "Settings", "settings_from"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much work one run does (``python -m benchmarks --help`` lists the flags that set it)."""

    trajectories: int | None = None
    window: int | None = None
    cache: int = 5
    pool: int = 8
    hot_calls: int = 200
    warm_calls: int = 30
    cold_calls: int = 6
    budget_s: float = 6.0
    seed: int = 1234
    threads: int = 1
    drop_caches: bool = True
    s3_trajectories: int = 40
    s3_batch: int = 256
    s3_batches: int = 5
    s3_delay_s: float = 0.020
    training_trajectories: int = 4
    training_batch: int = 16
    training_steps: int = 40
    training_step_s: float = 0.010
    training_prefetch: int = 4
    training_budget_s: float = 6.0
    training_store: str | None = None
    training_storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    training_buffer_options: dict[str, Any] = dataclasses.field(default_factory=dict)


QUICK = Settings(
    trajectories=6,
    window=5,
    cache=2,
    pool=2,
    hot_calls=20,
    warm_calls=5,
    cold_calls=3,
    budget_s=1.0,
    s3_trajectories=2,
    s3_batch=32,
    s3_batches=2,
    drop_caches=False,
    training_trajectories=1,
    training_batch=8,
    training_steps=3,
    training_prefetch=2,
    training_budget_s=0.5,
)


def settings_from(quick: bool, **overrides: Any) -> Settings:
    """The default (or ``quick``) settings with every override that is not ``None``."""
    base = QUICK if quick else Settings()
    settings = dataclasses.replace(
        base, **{name: value for name, value in overrides.items() if value is not None}
    )
    counts = ("trajectories", "window", "cache", "pool", "hot_calls", "warm_calls", "cold_calls")
    for name in counts:
        value = getattr(settings, name)
        if value is not None and value <= 0:
            flag = name.replace("_", "-")
            raise ValueError(f"--{flag} must be positive, got {value}")
    return settings
