"""Turn per-step rollout output into a ``[T, B, ...]`` :class:`~rbzarr.trajectory.model.Trajectory`.

A sampled (flat) row ``t`` carries ``dones`` of the *step* rows: raw row ``t + 1`` of a
single-epoch trajectory, true when ``curr_obs[t] -> next_obs[t]`` ended its episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rbzarr.errors import InvalidTrajectoryError
from rbzarr.rollout.autoreset import NEXT_STEP, aligned_rows, autoreset_mode_name
from rbzarr.rollout.collected import max_episode_length, model_weights_id
from rbzarr.rollout.epochs import RolloutEpoch, epoch_rows, stack_epochs, stacked
from rbzarr.rollout.step_checks import Signature, StepChecks, signature_of
from rbzarr.trajectory import tree
from rbzarr.trajectory.fields import RESET_ROW_FIELDS
from rbzarr.trajectory.model import Trajectory, trajectory_from_raw

__all__ = ["TrajectoryCollector"]


class TrajectoryCollector:
    """Accumulate chunk steps of ``num_envs`` environments into a ``[T, B, ...]`` trajectory.

    Parameters
    ----------
    num_envs
        ``B``, the number of parallel environments; every tensor is ``[B, ...]``.
    device
        Where the collected rows are kept. Every input is copied there when accepted, so
        callers may reuse or mutate their tensors afterwards.
    autoreset_mode
        How the environments reset themselves (:mod:`rbzarr.rollout.autoreset`): ``"same_step"``
        (default) or ``"next_step"`` (gymnasium 1.x's default), or a gymnasium
        ``AutoresetMode``.  :meth:`for_vector_env` reads it from the env.

    Raises
    ------
    ValueError
        If ``num_envs`` is not positive, or for an unsupported ``autoreset_mode``.

    Notes
    -----
    ``curr_obs[t]`` is the observation before step ``t`` and ``next_obs[t]`` the one after
    it. An environment is done on a step when any entry of its
    ``terminations | truncations`` is set.

    *Same-step mode*: an auto-resetting vector env returns the *reset* observation on a done
    step; pass the true last observation as ``final_obs`` and ``next_obs[t]`` takes it for
    the done environments, while the returned observation becomes ``curr_obs[t + 1]``.
    (Without ``final_obs``, ``next_obs`` is stored as given.)

    *Next-step mode*: the step after an environment's done is its reset step (its action
    ignored, reward 0); it is not stored.  Each column ``b`` of a built trajectory holds
    environment ``b``'s transitions in order, so columns do not share wall-clock steps; a
    trajectory is as long as the column with the fewest transitions, and the others' extra
    transitions begin the next one.  :meth:`reset` is called once (after ``envs.reset()``)
    and :meth:`build` keeps collecting; :meth:`clear` drops everything.

    Each call to :meth:`reset` starts a rollout epoch (calling it again before any step
    replaces the pending reset). With ``E`` epochs of ``T / E`` steps, ``dones``,
    ``terminations`` and ``truncations`` hold ``T + E`` rows: each epoch is led by its reset
    row. A step that does not fit (wrong ``B``, missing field, changed keys, shapes or
    dtypes) raises :class:`~rbzarr.errors.InvalidTrajectoryError` and changes nothing.
    """

    def __init__(
        self, num_envs: int, device: torch.device | str = "cpu", autoreset_mode: Any = "same_step"
    ) -> None:
        if num_envs <= 0:
            raise ValueError(f"num_envs must be > 0, got {num_envs}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.autoreset_mode = autoreset_mode_name(autoreset_mode)
        self._checks = StepChecks(num_envs)
        self.clear()

    @classmethod
    def for_vector_env(cls, envs: Any, device: torch.device | str = "cpu") -> TrajectoryCollector:
        """A collector for a gymnasium vector env: its ``num_envs`` and autoreset mode.

        Parameters
        ----------
        envs
            A gymnasium vector env: ``num_envs``, ``metadata["autoreset_mode"]`` are read.
        device
            Where the collected rows are kept, as in the constructor.

        Returns
        -------
        TrajectoryCollector
            An empty collector; call :meth:`reset` with the observation of ``envs.reset()``.

        Raises
        ------
        ValueError
            When the env's ``metadata["autoreset_mode"]`` is ``Disabled`` (the message names
            the fix).
        """
        mode = envs.metadata.get("autoreset_mode", NEXT_STEP)
        return cls(int(envs.num_envs), device, autoreset_mode=mode)

    def clear(self) -> None:
        """Forget every epoch, step and observation collected so far."""
        self._epochs: list[RolloutEpoch] = []
        self._obs: dict[str, torch.Tensor] | None = None
        self._obs_signature: Signature | None = None
        self._step_signature: Signature | None = None
        # Next-step mode: which environments were done on their last step (reset next).
        self._was_done = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

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
        defaults to ``terminations | truncations``.  In next-step mode, ``reset`` starts
        the collection and may not be called while steps are pending (:meth:`clear` first).

        Parameters
        ----------
        obs
            The observation the epoch starts from, as returned by ``envs.reset()``.
        dones, terminations, truncations
            Optional ``[B, ...]`` flags for the reset row, shaped like the steps' flags.

        Raises
        ------
        InvalidTrajectoryError
            In next-step mode with steps pending, or when ``obs`` or a flag does not fit
            ``B`` or the fields already collected; nothing is changed.
        """
        if self.autoreset_mode == NEXT_STEP and self.num_steps:
            raise InvalidTrajectoryError(
                f"reset() with {self.num_steps} steps pending: in next-step autoreset mode "
                "the collector carries on across build() calls; call clear() to drop them "
                "(e.g. after envs.reset())"
            )
        flat = self._checks.observation("obs", obs)
        signature = signature_of(flat)
        if self._obs_signature is not None and self.num_steps:
            self._checks.match("obs", signature, self._obs_signature, "the observations collected")
        given = {
            "terminations": self._checks.optional_rows("terminations", terminations),
            "truncations": self._checks.optional_rows("truncations", truncations),
            "dones": self._checks.optional_rows("dones", dones),
        }
        if self._step_signature is not None:
            self._checks.check_reset_row(given, self._step_signature)
        reset_row = {
            name: None if value is None else value.detach().to(self.device, copy=True)
            for name, value in given.items()
        }
        stored = self._store(flat)
        self._obs_signature = signature
        self._obs = stored
        if self._epochs and not self._epochs[-1].steps:
            self._epochs[-1] = RolloutEpoch(reset_row)
        else:
            self._epochs.append(RolloutEpoch(reset_row))

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
        environments in ``next_obs[t]`` (same-step mode only). Optional fields must be given
        on every step of a trajectory or on none.

        Parameters
        ----------
        actions
            The actions taken this step.
        rewards
            The rewards the step returned.
        next_obs
            The observation the step returned (possibly nested dict of ``[B, ...]``).
        terminations, truncations
            The step's episode-end flags, of one shape; ``dones`` is their logical or.
        final_obs
            Same-step mode: the true last observation of the environments done this step.
        prev_logprobs, prev_values
            Optional log-probabilities of ``actions`` and value estimates of the policy.
        versions
            Optional weight versions of the acting policy; they set ``model_weights_id``.
        forward_inputs
            Optional (nested) dict of policy inputs, stored as ``forward_inputs/...``.
        intervene_flags
            Optional ``[B, D]`` flags marking human-intervened steps.

        Raises
        ------
        InvalidTrajectoryError
            Before :meth:`reset`, for ``final_obs`` in next-step mode, or when a tensor does
            not fit (wrong ``B``, shapes, dtypes or fields); nothing is changed.
        """
        previous = self._obs
        if previous is None or self._obs_signature is None:
            raise InvalidTrajectoryError(
                "add_step before reset: call reset(obs) to start a rollout epoch"
            )
        if final_obs is not None and self.autoreset_mode == NEXT_STEP:
            raise InvalidTrajectoryError(
                "final_obs in next-step autoreset mode: the done step's next_obs already is "
                "the final observation; drop final_obs (it is for same-step mode)"
            )
        step = {
            "actions": self._checks.rows("actions", actions),
            "intervene_flags": self._checks.optional_rows("intervene_flags", intervene_flags),
            "rewards": self._checks.rows("rewards", rewards),
            "terminations": self._checks.rows("terminations", terminations),
            "truncations": self._checks.rows("truncations", truncations),
            "prev_logprobs": self._checks.optional_rows("prev_logprobs", prev_logprobs),
            "prev_values": self._checks.optional_rows("prev_values", prev_values),
            "versions": self._checks.optional_rows("versions", versions),
        }
        if terminations.shape != truncations.shape:
            raise InvalidTrajectoryError(
                f"field 'truncations': expected the shape of 'terminations' "
                f"{tuple(terminations.shape)}, got {tuple(truncations.shape)}"
            )
        returned = self._checks.observation("next_obs", next_obs)
        self._checks.match("next_obs", signature_of(returned), self._obs_signature, "reset obs")
        last = None if final_obs is None else self._checks.observation("final_obs", final_obs)
        if last is not None:
            self._checks.match("final_obs", signature_of(last), self._obs_signature, "reset obs")
        extra = {} if forward_inputs is None else self._checks.forward_inputs(forward_inputs)
        row = {name: value for name, value in step.items() if value is not None}
        row["dones"] = torch.logical_or(terminations, truncations)
        row.update(extra)
        signature = signature_of(row)
        if self._step_signature is not None:
            self._checks.match("step", signature, self._step_signature, "the first step")
        if not self._epochs[-1].steps:
            self._checks.check_reset_row(self._epochs[-1].reset_row, signature)
        self._commit(previous, row, returned, last)
        self._step_signature = signature
        if self.autoreset_mode == NEXT_STEP:
            self._was_done = self._epochs[-1].steps[-1]["dones"].reshape(self.num_envs, -1)
            self._was_done = self._was_done.any(dim=1)

    def build(self) -> Trajectory:
        """Stack the collected steps into a :class:`Trajectory`.

        Same-step mode empties the collector.  Next-step mode stacks every column's first
        ``T`` transitions (``T``: the fewest of any column) and keeps the rest, and the
        current observations, for the next trajectory.

        Returns
        -------
        Trajectory
            ``[T, B, ...]`` fields, with ``T + E`` reset-row rows for ``E`` epochs.

        Raises
        ------
        InvalidTrajectoryError
            When no step was added, the epochs differ in length, or (next-step) some
            environment has no transition yet; the collector keeps everything.
        """
        lengths = [len(epoch.steps) for epoch in self._epochs]
        if not lengths or sum(lengths) == 0:
            raise InvalidTrajectoryError(
                "cannot build a trajectory: no steps were added since the last build"
            )
        if self.autoreset_mode == NEXT_STEP:
            return self._build_aligned()
        if len(set(lengths)) != 1:
            raise InvalidTrajectoryError(
                f"rollout epochs differ in length: {lengths} steps; every epoch started by "
                "reset() must have the same number of steps"
            )
        rows = [step for epoch in self._epochs for step in epoch.steps]
        signature = signature_of(rows[0])
        fields = stack_epochs(self._epochs, signature, self.num_envs, self.device)
        trajectory = self._trajectory(fields, torch.stack([step["dones"] for step in rows]))
        self.clear()
        return trajectory

    def _build_aligned(self) -> Trajectory:
        """Next-step mode: one epoch, each column its own environment's transitions.

        Raises
        ------
        InvalidTrajectoryError
            Some environment has made no transition yet.
        """
        (epoch,) = self._epochs  # reset() refuses a second epoch while steps are pending
        steps, left = aligned_rows(torch.stack(epoch.valid).cpu())
        if steps.shape[0] == 0:
            raise InvalidTrajectoryError(
                "cannot build a trajectory: some environment has made no transition yet "
                "(in next-step mode its reset steps are not transitions); add more steps"
            )
        envs = torch.arange(self.num_envs).expand_as(steps)
        signature = signature_of(epoch.steps[0])
        rows = stacked(epoch.steps, list(signature))
        fields = {path: value[steps, envs] for path, value in rows.items()}
        step_dones = fields["dones"]
        for name in RESET_ROW_FIELDS:
            fields[name] = epoch_rows(
                epoch, name, signature, fields[name], self.num_envs, self.device
            )
        trajectory = self._trajectory(fields, step_dones)
        # Keep the steps from the first one still holding an untaken transition.
        pending = left.any(dim=1).nonzero().flatten()
        first = int(pending[0]) if len(pending) else len(epoch.steps)
        zeros: dict[str, torch.Tensor | None] = dict.fromkeys(RESET_ROW_FIELDS)
        kept = list(left[first:].to(self.device))
        self._epochs = [RolloutEpoch(zeros, epoch.steps[first:], kept)]
        return trajectory

    def _trajectory(self, fields: dict[str, torch.Tensor], step_dones: torch.Tensor) -> Trajectory:
        longest = max_episode_length(step_dones)
        return trajectory_from_raw(fields, longest, model_weights_id(fields.get("versions")))

    # -- helpers -----------------------------------------------------------------------

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
        epoch = self._epochs[-1]
        epoch.steps.append(stored)
        epoch.valid.append(~self._was_done)  # all true in same-step mode
        self._obs = current
