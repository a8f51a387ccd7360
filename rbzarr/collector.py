"""Turn per-step rollout output into a :class:`~rbzarr.trajectory.Trajectory`.

A rollout worker steps ``B`` vectorised environments; each step yields one *chunk*
``[act_t, r_t, dones_t, ...]`` together with the transition ``[obs_t, obs_t+1]``.
:class:`TrajectoryCollector` accumulates those steps over time and stacks them into
``[T, B, ...]`` tensors::

    collector = TrajectoryCollector(num_envs=B)
    collector.reset(obs)                       # one call per rollout epoch
    for t in range(T):
        collector.add_step(actions, rewards, next_obs, terminations, truncations,
                           final_obs=final_obs)
    trajectory = collector.build()             # and the collector is empty again

:func:`split` divides a trajectory along ``B`` into parts, one per consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rbzarr import tree
from rbzarr.dtypes import to_numpy
from rbzarr.errors import InvalidTrajectoryError
from rbzarr.fields import RESET_ROW_FIELDS
from rbzarr.trajectory import Trajectory, raw_time_rows, trajectory_from_raw, validate

__all__ = ["TrajectoryCollector", "max_episode_length", "model_weights_id", "split"]

# field name -> (torch dtype, shape after the B dimension)
_Signature = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def model_weights_id(versions: torch.Tensor | None) -> str:
    """The id of the weights that produced a trajectory, derived from its ``versions``.

    ``uuid5(NAMESPACE_DNS, hex(bytes of versions))``; without versions, the bytes of
    ``torch.zeros(1)`` (float32) are hashed, so every version-less trajectory shares one id.
    """
    source = torch.zeros(1) if versions is None else versions
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, to_numpy(source).tobytes().hex()))


def max_episode_length(step_dones: torch.Tensor) -> int:
    """The longest episode in ``step_dones`` (``[T, B, ...]``, reset rows already removed).

    Episodes are counted in collector steps, per environment: an episode starts at
    ``t = 0`` or right after a step where that environment is done (any entry of its
    ``dones[t, b, ...]`` set), and ends at its next done step, inclusive, or at ``T``.
    An episode still running at ``T`` counts with the steps observed so far.
    """
    steps, envs = int(step_dones.shape[0]), int(step_dones.shape[1])
    ended = step_dones.reshape(steps, envs, -1).bool().any(dim=2).cpu()
    running = torch.zeros(envs, dtype=torch.int64)
    longest = torch.zeros(envs, dtype=torch.int64)
    for t in range(steps):
        running += 1
        longest = torch.maximum(longest, running)
        running = torch.where(ended[t], 0, running)
    return int(longest.max()) if envs else 0


def split(trajectory: Trajectory, num_parts: int) -> list[Trajectory]:
    """Split ``trajectory`` along ``B`` (dim 1 of every tensor) into ``num_parts`` parts.

    Part sizes differ by at most one environment; the first ``B % num_parts`` parts get the
    extra one. Reset rows of ``dones``/``terminations``/``truncations`` are kept. Each part
    keeps the parent's ``model_weights_id`` (the same weights produced it) and recomputes
    ``max_episode_length`` over its own environments (the parent's value without
    ``[T, B, ...]`` ``dones``).
    Parts may share memory with ``trajectory``.
    """
    spec = validate(trajectory)
    if not 0 < num_parts <= spec.B:
        raise ValueError(f"num_parts must be in [1, B={spec.B}], got {num_parts}")
    parts: list[dict[str, torch.Tensor]] = [{} for _ in range(num_parts)]
    for path, value in trajectory.tensors().items():
        pieces = (
            torch.tensor_split(value, num_parts, dim=1)
            if value.dim() >= 2
            else (value,) * num_parts
        )
        for part, piece in zip(parts, pieces, strict=True):
            part[path] = piece.contiguous()
    result = []
    for fields in parts:
        dones = fields.get("dones")
        longest = (
            _longest(dones, spec.T)
            if dones is not None and dones.dim() >= 2
            else trajectory.max_episode_length
        )
        result.append(trajectory_from_raw(fields, longest, trajectory.model_weights_id))
    return result


def _longest(raw_dones: torch.Tensor, steps: int) -> int:
    rows = raw_time_rows(torch.arange(steps), steps, int(raw_dones.shape[0]))
    return max_episode_length(raw_dones.index_select(0, rows.to(raw_dones.device)))


def _signature(flat: Mapping[str, torch.Tensor]) -> _Signature:
    return {path: (value.dtype, tuple(value.shape[1:])) for path, value in flat.items()}


def _describe(sig: tuple[torch.dtype, tuple[int, ...]], num_envs: int) -> str:
    return f"dtype {sig[0]} shape {(num_envs, *sig[1])}"


@dataclass
class _Epoch:
    """One rollout epoch: the reset row given to ``reset`` and the steps after it."""

    reset_row: dict[str, torch.Tensor | None]
    steps: list[dict[str, torch.Tensor]] = field(default_factory=list)


class TrajectoryCollector:
    """Accumulate chunk steps of ``num_envs`` environments into a ``[T, B, ...]`` trajectory.

    Parameters
    ----------
    num_envs
        ``B``, the number of parallel environments; every tensor is ``[B, ...]``.
    device
        Where the collected rows are kept. Every input is copied there when accepted, so
        callers may reuse or mutate their tensors afterwards.

    Notes
    -----
    ``curr_obs[t]`` is the observation before step ``t`` and ``next_obs[t]`` the one after
    it. An auto-resetting vector env returns the *reset* observation on a done step; pass the
    true last observation as ``final_obs`` and ``next_obs[t]`` takes it for the done
    environments, while the returned observation becomes ``curr_obs[t + 1]``. An environment
    is done on a step when any entry of its ``terminations | truncations`` is set.

    Each call to :meth:`reset` starts a rollout epoch (calling it again before any step
    replaces the pending reset). With ``E`` epochs of ``T / E`` steps, ``dones``,
    ``terminations`` and ``truncations`` hold ``T + E`` rows: each epoch is led by its reset
    row. A step that does not fit (wrong ``B``, missing field, changed keys, shapes or
    dtypes) raises :class:`~rbzarr.errors.InvalidTrajectoryError` and changes nothing.
    """

    def __init__(self, num_envs: int, device: torch.device | str = "cpu") -> None:
        if num_envs <= 0:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.clear()

    def clear(self) -> None:
        """Forget every epoch, step and observation collected so far."""
        self._epochs: list[_Epoch] = []
        self._obs: dict[str, torch.Tensor] | None = None
        self._obs_signature: _Signature | None = None
        self._step_signature: _Signature | None = None

    @property
    def num_steps(self) -> int:
        """Steps collected so far, over all epochs."""
        return sum(len(epoch.steps) for epoch in self._epochs)

    @property
    def num_epochs(self) -> int:
        """Rollout epochs started so far, including one whose reset has no steps yet."""
        return len(self._epochs)

    def reset(
        self,
        obs: Mapping[str, Any],
        dones: torch.Tensor | None = None,
        terminations: torch.Tensor | None = None,
        truncations: torch.Tensor | None = None,
    ) -> None:
        """Start a rollout epoch at observation ``obs`` (a possibly nested dict of ``[B, ...]``).

        ``dones``, ``terminations`` and ``truncations`` fill the epoch's reset row (e.g. the
        last step of the previous epoch); each absent one is zeros, except that ``dones``
        defaults to ``terminations | truncations``.
        """
        flat = self._observation("obs", obs)
        signature = _signature(flat)
        if self._obs_signature is not None and self.num_steps:
            self._match("obs", signature, self._obs_signature, "the observations collected")
        given = {
            "terminations": self._optional_rows("terminations", terminations),
            "truncations": self._optional_rows("truncations", truncations),
            "dones": self._optional_rows("dones", dones),
        }
        if self._step_signature is not None:
            self._check_reset_row(given, self._step_signature)
        reset_row = {
            name: None if value is None else value.detach().to(self.device, copy=True)
            for name, value in given.items()
        }
        stored = self._store(flat)
        self._obs_signature = signature
        self._obs = stored
        if self._epochs and not self._epochs[-1].steps:
            self._epochs[-1] = _Epoch(reset_row)
        else:
            self._epochs.append(_Epoch(reset_row))

    def add_step(
        self,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: Mapping[str, Any],
        terminations: torch.Tensor,
        truncations: torch.Tensor,
        final_obs: Mapping[str, Any] | None = None,
        prev_logprobs: torch.Tensor | None = None,
        prev_values: torch.Tensor | None = None,
        versions: torch.Tensor | None = None,
        forward_inputs: Mapping[str, Any] | None = None,
        intervene_flags: torch.Tensor | None = None,
    ) -> None:
        """Record one chunk step of all ``B`` environments.

        Every tensor is ``[B, ...]``; ``next_obs`` and ``final_obs`` have the keys, dtypes and
        shapes of the ``reset`` observation. ``final_obs`` (the true last observation of
        environments that finished this step) replaces ``next_obs`` rows of done
        environments in ``next_obs[t]``. Optional fields must be given on every step of a
        trajectory or on none.
        """
        previous = self._obs
        if previous is None or self._obs_signature is None:
            raise InvalidTrajectoryError(
                "add_step before reset: call reset(obs) to start a rollout epoch"
            )
        step = {
            "actions": self._rows("actions", actions),
            "intervene_flags": self._optional_rows("intervene_flags", intervene_flags),
            "rewards": self._rows("rewards", rewards),
            "terminations": self._rows("terminations", terminations),
            "truncations": self._rows("truncations", truncations),
            "prev_logprobs": self._optional_rows("prev_logprobs", prev_logprobs),
            "prev_values": self._optional_rows("prev_values", prev_values),
            "versions": self._optional_rows("versions", versions),
        }
        if terminations.shape != truncations.shape:
            raise InvalidTrajectoryError(
                f"field 'truncations': expected the shape of 'terminations' "
                f"{tuple(terminations.shape)}, got {tuple(truncations.shape)}"
            )
        returned = self._observation("next_obs", next_obs)
        self._match("next_obs", _signature(returned), self._obs_signature, "reset obs")
        last = None if final_obs is None else self._observation("final_obs", final_obs)
        if last is not None:
            self._match("final_obs", _signature(last), self._obs_signature, "reset obs")
        extra = {} if forward_inputs is None else self._forward_inputs(forward_inputs)
        row = {name: value for name, value in step.items() if value is not None}
        row["dones"] = torch.logical_or(terminations, truncations)
        row.update(extra)
        signature = _signature(row)
        if self._step_signature is not None:
            self._match("step", signature, self._step_signature, "the first step")
        if not self._epochs[-1].steps:
            self._check_reset_row(self._epochs[-1].reset_row, signature)
        self._commit(previous, row, returned, last)
        self._step_signature = signature

    def build(self) -> Trajectory:
        """Stack the collected steps into a :class:`Trajectory` and empty the collector.

        Raises :class:`~rbzarr.errors.InvalidTrajectoryError` (and keeps everything) when no
        step was added or the epochs differ in length.
        """
        lengths = [len(epoch.steps) for epoch in self._epochs]
        if not lengths or sum(lengths) == 0:
            raise InvalidTrajectoryError(
                "cannot build a trajectory: no steps were added since the last build"
            )
        if len(set(lengths)) != 1:
            raise InvalidTrajectoryError(
                f"rollout epochs differ in length: {lengths} steps; every epoch started by "
                "reset() must have the same number of steps"
            )
        rows = [step for epoch in self._epochs for step in epoch.steps]
        signature = _signature(rows[0])
        fields = {
            path: torch.stack([step[path] for step in rows])
            for path in signature
            if path not in RESET_ROW_FIELDS
        }
        for name in sorted(RESET_ROW_FIELDS):
            fields[name] = torch.cat(
                [self._epoch_rows(epoch, name, signature) for epoch in self._epochs]
            )
        longest = max_episode_length(torch.stack([step["dones"] for step in rows]))
        trajectory = trajectory_from_raw(fields, longest, model_weights_id(fields.get("versions")))
        self.clear()
        return trajectory

    # -- helpers -----------------------------------------------------------------------

    def _rows(self, name: str, value: Any) -> torch.Tensor:
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

    def _optional_rows(self, name: str, value: Any) -> torch.Tensor | None:
        return None if value is None else self._rows(name, value)

    def _observation(self, name: str, obs: Any) -> dict[str, torch.Tensor]:
        if not isinstance(obs, Mapping):
            raise InvalidTrajectoryError(
                f"field {name!r}: expected a dict of tensors, got {type(obs).__name__}"
            )
        try:
            flat = tree.flatten(obs)
        except ValueError as exc:
            raise InvalidTrajectoryError(f"field {name!r}: {exc}") from exc
        return {path: self._rows(f"{name}/{path}", value) for path, value in flat.items()}

    def _forward_inputs(self, inputs: Any) -> dict[str, torch.Tensor]:
        flat = self._observation("forward_inputs", inputs)
        return {f"forward_inputs{tree.SEP}{path}": value for path, value in flat.items()}

    def _match(self, name: str, got: _Signature, expected: _Signature, source: str) -> None:
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

    def _check_reset_row(
        self, reset_row: Mapping[str, torch.Tensor | None], signature: _Signature
    ) -> None:
        for name, value in reset_row.items():
            if value is not None and tuple(value.shape[1:]) != signature[name][1]:
                raise InvalidTrajectoryError(
                    f"reset row of {name!r}: expected shape "
                    f"{(self.num_envs, *signature[name][1])} to match the steps, "
                    f"got {tuple(value.shape)}"
                )

    def _store(self, flat: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.detach().to(self.device, copy=True) for k, v in flat.items()}

    def _commit(
        self,
        previous: dict[str, torch.Tensor],
        row: dict[str, torch.Tensor],
        returned: dict[str, torch.Tensor],
        last: dict[str, torch.Tensor] | None,
    ) -> None:
        """Copy an accepted step in; ``next_obs`` takes ``last`` where an env is done."""
        stored = self._store(row)
        current = self._store(returned)
        following = current
        if last is not None:
            done = stored["dones"].reshape(self.num_envs, -1).any(dim=1)
            final = self._store(last)
            following = {
                path: torch.where(done.view(-1, *[1] * (value.dim() - 1)), final[path], value)
                for path, value in current.items()
            }
        for path, value in previous.items():
            stored[f"curr_obs{tree.SEP}{path}"] = value
        for path, value in following.items():
            stored[f"next_obs{tree.SEP}{path}"] = value
        self._epochs[-1].steps.append(stored)
        self._obs = current

    def _epoch_rows(self, epoch: _Epoch, name: str, signature: _Signature) -> torch.Tensor:
        """``name``'s rows of one epoch: its reset row, then one row per step."""
        dtype, trailing = signature[name]
        given = epoch.reset_row[name]
        if given is None and name == "dones":
            terms, truncs = epoch.reset_row["terminations"], epoch.reset_row["truncations"]
            if terms is not None or truncs is not None:
                given = torch.logical_or(
                    self._reset_value(terms, signature["terminations"]),
                    self._reset_value(truncs, signature["truncations"]),
                )
        first = self._reset_value(given, (dtype, trailing))
        return torch.stack([first, *(step[name] for step in epoch.steps)])

    def _reset_value(
        self, value: torch.Tensor | None, sig: tuple[torch.dtype, tuple[int, ...]]
    ) -> torch.Tensor:
        if value is None:
            return torch.zeros((self.num_envs, *sig[1]), dtype=sig[0], device=self.device)
        return value.detach().to(self.device, sig[0], copy=True)
