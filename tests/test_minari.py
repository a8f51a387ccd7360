"""Minari 0.5 datasets in and out, with Minari itself as the oracle.

Datasets are recorded with Minari's ``DataCollector`` and ``create_dataset`` (gymnasium
environments stepped with random actions), imported, exported, and read back with
``load_dataset``, ``iterate_episodes`` and ``sample_episodes``.
"""

from __future__ import annotations

import gc
import json
import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner

minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("jax")  # Minari's DataCollector steps with jax's tree utilities

from rbzarr import Trajectory, TrajectoryReplayBuffer  # noqa: E402
from rbzarr.cli import main  # noqa: E402
from rbzarr.errors import DatasetFileNotFoundError, UnsupportedDatasetError  # noqa: E402
from rbzarr.interop import export_dataset, import_dataset, seed_buffer  # noqa: E402
from rbzarr.interop.episodes import read_episodes  # noqa: E402


class DictPointEnv(gym.Env):
    """A small env with a nested Dict observation and numeric infos, ending at random."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(-10, 10, (2,), np.float32),
                "sensors": gym.spaces.Dict({"touch": gym.spaces.Box(0, 1, (3,), np.float32)}),
            }
        )
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self._steps = 0

    def _observation(self) -> dict:
        return {
            "position": self.np_random.uniform(-10, 10, 2).astype(np.float32),
            "sensors": {"touch": self.np_random.uniform(0, 1, 3).astype(np.float32)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._steps = 0
        return self._observation(), {"energy": np.float32(0.0)}

    def step(self, action):
        self._steps += 1
        terminated = bool(self.np_random.uniform() < 0.2)
        truncated = self._steps >= 6 and not terminated
        info = {"energy": np.float32(self._steps * 0.5)}
        return self._observation(), float(action.sum()), terminated, truncated, info


# Registered by a string entry point, so its env spec serialises into Minari's metadata.
if "rbzarr-tests/DictPoint-v0" not in gym.registry:
    gym.register("rbzarr-tests/DictPoint-v0", entry_point="test_minari:DictPointEnv")


def record(env, dataset_id, episodes, seed, record_infos=False):
    """A Minari dataset recorded with DataCollector (random actions)."""
    # Minari drops its TemporaryDirectory objects (when a dataset is created, and on close)
    # after removing their folders itself, so each warns as it is collected: Minari's
    # warning, not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        collector = minari.DataCollector(env, record_infos=record_infos, jpeg_encoding=False)
        env.action_space.seed(seed)
        for episode in range(episodes):
            collector.reset(seed=seed + episode)
            while True:
                _, _, terminated, truncated, _ = collector.step(env.action_space.sample())
                if terminated or truncated:
                    break
        dataset = collector.create_dataset(
            dataset_id=dataset_id,
            algorithm_name="random",
            author="rbzarr tests",
            author_email="tests@example.invalid",
            eval_env=env.spec,
            code_permalink="https://example.invalid/rbzarr",
            description="random steps",
        )
        collector.close()
        del collector
        gc.collect()
    return dataset


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


@pytest.fixture
def cartpole(minari_root):
    env = gym.make("CartPole-v1")
    return record(env, "cartpole/random-v0", 5, seed=3)


@pytest.fixture
def dict_points(minari_root):
    env = gym.make("rbzarr-tests/DictPoint-v0", disable_env_checker=True)
    return record(env, "points/random-v0", 4, seed=7, record_infos=True)


def episodes_of(dataset):
    return list(dataset.iterate_episodes())


def same_values(one, two) -> bool:
    if isinstance(one, dict):
        return one.keys() == two.keys() and all(same_values(one[k], two[k]) for k in one)
    one, two = np.asarray(one), np.asarray(two)
    return one.dtype == two.dtype and one.shape == two.shape and np.array_equal(one, two)


def assert_same_episodes(first, second):
    assert len(first) == len(second)
    for one, two in zip(first, second, strict=True):
        for name in ("observations", "actions", "rewards", "terminations", "truncations"):
            assert same_values(getattr(one, name), getattr(two, name)), name
        assert same_values(one.infos, two.infos)


def metadata(root, dataset_id):
    document = json.loads((root / dataset_id / "data" / "metadata.json").read_text())
    document.pop("dataset_size")  # the file's size in MB, rounded: it may differ
    return document


def test_an_episode_becomes_one_trajectory_with_shifted_observations(cartpole, tmp_path):
    documents = import_dataset("cartpole/random-v0", tmp_path / "store", "minari")
    assert documents.metadata["size"] == 5
    assert documents.metadata["total_samples"] == cartpole.total_steps
    stored = [episode.fields for episode in read_episodes(tmp_path / "store")]
    for fields, episode in zip(stored, episodes_of(cartpole), strict=True):
        steps = len(episode.rewards)
        assert np.array_equal(fields["curr_obs/observation"], episode.observations[:-1])
        assert np.array_equal(fields["next_obs/observation"], episode.observations[1:])
        assert np.array_equal(fields["actions"], episode.actions)
        assert fields["actions"].dtype == episode.actions.dtype
        assert np.array_equal(fields["rewards"], episode.rewards)
        assert np.array_equal(fields["terminations"], episode.terminations)
        assert np.array_equal(fields["truncations"], episode.truncations)
        assert fields["dones"].tolist() == [False] * (steps - 1) + [True]


def test_a_cartpole_dataset_round_trips_bit_exact(cartpole, minari_root, tmp_path):
    import_dataset(minari_root / "cartpole/random-v0", tmp_path / "store", "minari")
    written = export_dataset(tmp_path / "store", minari_root / "cartpole/again-v0", "minari")
    assert (written.episodes, written.left_out) == (5, 0)
    again = minari.load_dataset("cartpole/again-v0")
    assert again.total_episodes == cartpole.total_episodes
    assert again.total_steps == cartpole.total_steps
    assert again.observation_space == cartpole.observation_space
    assert again.action_space == cartpole.action_space
    assert again.spec.env_spec == cartpole.spec.env_spec
    assert_same_episodes(episodes_of(cartpole), episodes_of(again))
    # The metadata comes back as it was, but for the id: the one Minari finds it by.
    original = metadata(minari_root, "cartpole/random-v0")
    assert metadata(minari_root, "cartpole/again-v0") == {
        **original,
        "dataset_id": "cartpole/again-v0",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a misnamed dataset is a warning, and left out
        assert "cartpole/again-v0" in minari.list_local_datasets()
    sampled = again.sample_episodes(3)
    assert len(sampled) == 3
    assert all(len(e.observations) == len(e.rewards) + 1 for e in sampled)


def test_an_export_outside_minaris_folder_takes_its_folders_name_or_the_id_given(
    cartpole, minari_root, tmp_path
):
    import_dataset(minari_root / "cartpole/random-v0", tmp_path / "store", "minari")
    export_dataset(tmp_path / "store", tmp_path / "elsewhere" / "poles-v2", "minari")
    assert metadata(tmp_path / "elsewhere", "poles-v2")["dataset_id"] == "poles-v2"
    export_dataset(tmp_path / "store", minari_root / "ns" / "x-v0", "minari", dataset_id="ns/x-v0")
    assert minari.load_dataset("ns/x-v0").total_episodes == cartpole.total_episodes
    with pytest.raises(ValueError, match=r"not of the form .* --dataset-id"):
        export_dataset(tmp_path / "store", tmp_path / "no-version", "minari")
    assert not (tmp_path / "no-version").exists()


def test_dict_observations_become_nested_keys_and_infos_come_back(dict_points, tmp_path):
    import_dataset("points/random-v0", tmp_path / "store", "minari")
    fields = next(iter(read_episodes(tmp_path / "store"))).fields
    first = episodes_of(dict_points)[0]
    touch = first.observations["sensors"]["touch"]
    assert np.array_equal(fields["curr_obs/sensors/touch"], touch[:-1])
    assert np.array_equal(fields["next_obs/sensors/touch"], touch[1:])
    assert np.array_equal(fields["forward_inputs/infos/energy"], first.infos["energy"][:-1])
    assert np.array_equal(fields["forward_inputs/next_infos/energy"], first.infos["energy"][1:])
    export_dataset(tmp_path / "store", tmp_path / "out" / "points-v0", "minari")
    again = minari.MinariDataset(tmp_path / "out" / "points-v0" / "data")
    assert again.observation_space == dict_points.observation_space
    assert_same_episodes(episodes_of(dict_points), episodes_of(again))


def test_string_infos_are_refused_and_nothing_is_written(minari_root, tmp_path):
    class Labelled(gym.Wrapper):
        def reset(self, **kwargs):
            observation, info = self.env.reset(**kwargs)
            return observation, {**info, "label": "start"}

        def step(self, action):
            *rest, info = self.env.step(action)
            return (*rest, {**info, "label": "step"})

    record(Labelled(gym.make("CartPole-v1")), "labelled/random-v0", 2, 1, record_infos=True)
    with pytest.raises(UnsupportedDatasetError, match="info 'label'"):
        import_dataset("labelled/random-v0", tmp_path / "store", "minari")
    assert not (tmp_path / "store").exists()


def test_a_missing_dataset_is_named(minari_root, tmp_path):
    with pytest.raises(DatasetFileNotFoundError, match="MINARI_DATASETS_PATH"):
        import_dataset("nothing/here-v0", tmp_path / "store", "minari")


def test_a_buffer_store_exports_complete_episodes_with_fitting_spaces(minari_root, tmp_path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "store")
    T, B = 5, 2
    dones = torch.zeros(T + 1, B, 1, dtype=torch.bool)
    dones[3, 0] = True  # env 0 ends at step 3 and starts again; env 1 runs on
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(T, B, 4, generator=generator)
    buffer.add_trajectories(
        [
            Trajectory(
                max_episode_length=T,
                curr_obs={"state": states},
                next_obs={"state": states + 1},
                actions=torch.randn(T, B, 2, generator=generator),
                rewards=torch.randn(T, B, 1, generator=generator),
                dones=dones,
            )
        ]
    )
    buffer.close()
    written = export_dataset(tmp_path / "store", minari_root / "mine-v0", "minari")
    # One episode ended (env 0, steps 0..2); env 0's second and env 1's are still running.
    assert (written.episodes, written.left_out) == (1, 2)
    dataset = minari.load_dataset("mine-v0")
    assert dataset.total_episodes == 1
    assert dataset.total_steps == 3
    assert dataset.observation_space == gym.spaces.Dict(
        {"state": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)}
    )
    episode = next(dataset.iterate_episodes())
    assert np.array_equal(episode.observations["state"][:3], states[:3, 0].numpy())
    assert np.array_equal(episode.observations["state"][3], states[2, 0].numpy() + 1)
    every = export_dataset(
        tmp_path / "store", tmp_path / "all" / "all-v0", "minari", include_incomplete=True
    )
    assert (every.episodes, every.left_out) == (3, 0)
    assert minari.MinariDataset(tmp_path / "all" / "all-v0" / "data").total_steps == T * B


def test_cli_and_seed_buffer(cartpole, minari_root, tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main, ["import", "cartpole/random-v0", str(tmp_path / "store"), "--from", "minari"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("imported 5 episodes")
    target = minari_root / "cli-v0"
    result = runner.invoke(
        main, ["export", str(tmp_path / "store"), str(target), "--format", "minari"]
    )
    assert (result.exit_code, result.output) == (0, f"exported 5 episodes to {target}\n")
    buffer = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    documents = seed_buffer(buffer, "cartpole/random-v0", "minari", tmp_path / "seeded")
    assert documents.metadata["size"] == 5
    assert (len(buffer), buffer.total_samples) == (5, cartpole.total_steps)
    assert buffer.sample(4)["curr_obs"]["observation"].shape == (4, 4)
    # A second call loads the store the first imported.
    again = TrajectoryReplayBuffer(seed=0, sample_window_size=0)
    seed_buffer(again, "cartpole/random-v0", "minari", tmp_path / "seeded")
    assert again.total_samples == cartpole.total_steps


def test_a_relative_export_below_minaris_folder_is_listed_under_its_namespace(
    cartpole, minari_root, tmp_path, monkeypatch
):
    import_dataset(minari_root / "cartpole/random-v0", tmp_path / "store", "minari")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", minari_root.name)  # relative, as a shell sets it
    result = CliRunner().invoke(
        main, ["export", "store", f"{minari_root.name}/ns/name-v0", "--format", "minari"]
    )
    assert result.exit_code == 0, result.output
    assert metadata(minari_root, "ns/name-v0")["dataset_id"] == "ns/name-v0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a misnamed dataset is a warning, and left out
        assert "ns/name-v0" in minari.list_local_datasets()
    assert minari.load_dataset("ns/name-v0").total_steps == cartpole.total_steps
    assert sorted(p.name for p in minari_root.rglob("*.hdf5")) == ["main_data.hdf5"] * 2
