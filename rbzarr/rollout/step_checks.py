"""Checks of what one collector step passes in; every failure names the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.trajectory import tree

__all__ = ["Signature", "StepChecks", "signature_of"]

# field name -> (torch dtype, shape after the B dimension)
Signature = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def signature_of(flat: Mapping[str, torch.Tensor]) -> Signature:
    """Dtype and trailing shape (after ``B``) of every flat field."""
    return {path: (value.dtype, tuple(value.shape[1:])) for path, value in flat.items()}


def _describe(sig: tuple[torch.dtype, tuple[int, ...]], num_envs: int) -> str:
    return f"dtype {sig[0]} shape {(num_envs, *sig[1])}"


class StepChecks:
    """Checks for steps of ``num_envs`` environments."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    def rows(self, name: str, value: Any) -> torch.Tensor:
        """``value`` if it is a ``[B, ...]`` tensor."""
        if value is None:
            raise InvalidTrajectoryError(
                f"field {name!r}: missing; expected a tensor [B={self.num_envs}, ...]"
            )
        if not isinstance(value, torch.Tensor):
            raise InvalidTrajectoryError(
                f"field {name!r}: expected a torch.Tensor, got {type(value).__name__}"
            )
        if value.dim() < 1 or value.shape[0] != self.num_envs:
            raise InvalidTrajectoryError(
                f"field {name!r}: expected [B={self.num_envs}, ...], got {tuple(value.shape)}"
            )
        return value

    def optional_rows(self, name: str, value: Any) -> torch.Tensor | None:
        """:meth:`rows`, or ``None`` for ``None``."""
        return None if value is None else self.rows(name, value)

    def observation(self, name: str, obs: Any) -> dict[str, torch.Tensor]:
        """A (nested) dict of ``[B, ...]`` tensors, flattened."""
        if not isinstance(obs, Mapping):
            raise InvalidTrajectoryError(
                f"field {name!r}: expected a dict of tensors, got {type(obs).__name__}"
            )
        try:
            flat = tree.flatten(obs)
        except ValueError as exc:
            raise InvalidTrajectoryError(f"field {name!r}: {exc}") from exc
        return {path: self.rows(f"{name}/{path}", value) for path, value in flat.items()}

    def forward_inputs(self, inputs: Any) -> dict[str, torch.Tensor]:
        """:meth:`observation` of ``forward_inputs``, keyed ``forward_inputs/...``."""
        flat = self.observation("forward_inputs", inputs)
        return {f"forward_inputs{tree.SEP}{path}": value for path, value in flat.items()}

    def match(self, name: str, got: Signature, expected: Signature, source: str) -> None:
        """Refuse ``got`` unless it has ``expected``'s fields, dtypes and shapes."""
        missing = [path for path in expected if path not in got]
        unexpected = [path for path in got if path not in expected]
        if missing or unexpected:
            raise InvalidTrajectoryError(
                f"{name}: fields differ from {source}: missing {missing}, unexpected {unexpected}"
            )
        for path, want in expected.items():
            if got[path] != want:
                raise InvalidTrajectoryError(
                    f"{name} field {path!r}: expected {_describe(want, self.num_envs)} "
                    f"(as in {source}), got {_describe(got[path], self.num_envs)}"
                )

    def check_reset_row(
        self, reset_row: Mapping[str, torch.Tensor | None], signature: Signature
    ) -> None:
        """Refuse reset-row values whose trailing shape differs from the steps'."""
        for name, value in reset_row.items():
            if value is not None and tuple(value.shape[1:]) != signature[name][1]:
                raise InvalidTrajectoryError(
                    f"reset row of {name!r}: expected shape "
                    f"{(self.num_envs, *signature[name][1])} to match the steps, "
                    f"got {tuple(value.shape)}"
                )
