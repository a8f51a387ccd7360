"""Minari datasets (Farama's successor of D4RL) in and out, through Minari's own storage.

A Minari dataset is a folder holding ``data/metadata.json`` (the spaces, the env spec, the
dataset id...) and ``data/main_data.hdf5`` (one group per episode).  Its episodes of ``T``
steps hold ``T + 1`` observations and infos and ``T`` actions, rewards, terminations and
truncations.

==========================  ===================================================
Minari episode              rbzarr key
==========================  ===================================================
``observations[:-1]``       ``curr_obs/observation``; a Dict space's ``<key>``
                            (nested: ``curr_obs/<key>/<sub>``), a Tuple's ``_index_<i>``
``observations[1:]``        ``next_obs/...`` (the same names)
``actions``                 ``actions`` (a Box or Discrete space)
``rewards``                 ``rewards``
``terminations``            ``terminations``
``truncations``             ``truncations``
(the episode's end)         ``dones`` (with any termination or truncation)
``infos[:-1]``, ``infos[1:]``
                            ``forward_inputs/infos/<key>``, ``forward_inputs/next_infos/<key>``
==========================  ===================================================

The import records Minari's ``metadata.json`` and each episode's id, seed and options; the
export writes them back, so a Minari dataset comes back with the same spaces, env spec and
metadata.  A store from elsewhere gets Box spaces that fit its arrays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from minari import MinariDataset, __version__
from minari.dataset.episode_data import EpisodeData
from minari.dataset.minari_dataset import parse_dataset_id
from minari.dataset.minari_storage import MinariStorage
from minari.serialization import deserialize_space
from tqdm import tqdm

from rbzarr.errors import DatasetFileNotFoundError, StoreExistsError, UnsupportedDatasetError
from rbzarr.interop.episodes import SOURCE_KEY, StoredEpisode, read_episodes
from rbzarr.storage.io.location import Location

__all__ = ["MinariSource", "export_minari", "resolve_minari"]

OBSERVATION = "observation"
_INFOS, _NEXT_INFOS = "forward_inputs/infos", "forward_inputs/next_infos"
# What Minari's storage sets itself; the rest of metadata.json is written back as it was.
_SET_BY_STORAGE = frozenset(
    {
        "total_episodes",
        "total_steps",
        "dataset_size",
        "data_format",
        "jpeg_encoding",
        "observation_space",
        "action_space",
        "env_spec",
    }
)
_WRITTEN_BACK = ("observation_space", "action_space", "env_spec", "eval_env_spec")
_SETS = ("author", "author_email")
# Episodes handed to Minari's storage per call: one file open per burst, not per episode.
_BURST = 256


def resolve_minari(source: str | os.PathLike[str]) -> Path:
    """The ``data`` folder of a Minari dataset: a folder, or an id under ``MINARI_DATASETS_PATH``.

    Raises
    ------
    DatasetFileNotFoundError
        Neither a dataset folder nor a dataset id with a local copy.
    """
    text = os.fspath(source)
    if "://" in text and not text.startswith("file://"):
        raise UnsupportedDatasetError(f"{text}: Minari datasets are read from a local folder")
    path = Path(text.removeprefix("file://"))
    candidates = [path / "data", path]
    if not path.is_absolute():
        root = minari_datasets_path()
        candidates.append(Path(root) / text / "data")
    for candidate in candidates:
        if (candidate / "metadata.json").is_file():
            return candidate
    raise DatasetFileNotFoundError(
        f"{text}: no Minari dataset there (no data/metadata.json), nor under "
        f"MINARI_DATASETS_PATH as a dataset id"
    )


def _space_fields(prefix: str, values: Any, space: gym.Space, where: str) -> dict[str, np.ndarray]:
    """A space's values as flat keys below ``prefix`` (Dict and Tuple spaces nest)."""
    if isinstance(space, gym.spaces.Dict):
        out: dict[str, np.ndarray] = {}
        for key, sub in space.spaces.items():
            out.update(_space_fields(f"{prefix}/{key}", values[key], sub, where))
        return out
    if isinstance(space, gym.spaces.Tuple):
        out = {}
        for position, sub in enumerate(space.spaces):
            out.update(_space_fields(f"{prefix}/_index_{position}", values[position], sub, where))
        return out
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise UnsupportedDatasetError(
            f"{where}: {prefix} holds {array.dtype} values ({type(space).__name__} space); "
            f"rbzarr imports numeric spaces"
        )
    return {prefix: array}


def _info_fields(infos: Mapping[str, Any], steps: int, where: str, prefix: str = "") -> dict:
    """Numeric infos of ``steps + 1`` rows, as ``infos`` and ``next_infos`` keys."""
    out: dict[str, np.ndarray] = {}
    for key, value in infos.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_info_fields(value, steps, where, f"{name}/"))
            continue
        array = np.asarray(value)
        if array.dtype.kind not in "biuf" or array.ndim == 0 or len(array) != steps + 1:
            raise UnsupportedDatasetError(
                f"{where}: info {name!r} is {array.dtype} of shape {list(array.shape)}; rbzarr "
                f"imports numeric infos of one row per observation ({steps + 1})"
            )
        out[f"{_INFOS}/{name}"] = array[:-1]
        out[f"{_NEXT_INFOS}/{name}"] = array[1:]
    return out


class MinariSource:
    """A Minari dataset opened with Minari; :meth:`episodes` reads one episode at a time."""

    def __init__(self, source: str | os.PathLike[str]) -> None:
        self.data_path = resolve_minari(source)
        self.dataset = MinariDataset(self.data_path)
        self.raw_metadata = json.loads((self.data_path / "metadata.json").read_text())
        space = self.dataset.action_space
        if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete):
            raise UnsupportedDatasetError(
                f"{self.data_path}: action space {type(space).__name__}; rbzarr imports Box and "
                f"Discrete actions"
            )

    def metadata(self) -> dict[str, Any]:
        """What the import records: metadata.json and each episode's id, seed and options."""
        storage = self.dataset.storage
        indices = self.dataset.episode_indices
        return {
            "format": "minari",
            "url": str(self.data_path.parent),
            "metadata": self.raw_metadata,
            "episodes": [
                _jsonable(dict(meta)) for meta in storage.get_episode_metadata(indices.tolist())
            ],
        }

    def __len__(self) -> int:
        return int(self.dataset.total_episodes)

    def episodes(self) -> Iterator[dict[str, np.ndarray]]:
        """Each episode's arrays by flat trajectory key (see the module docs)."""
        for episode in self.dataset.iterate_episodes():
            yield self._fields(episode)

    def _fields(self, episode: EpisodeData) -> dict[str, np.ndarray]:
        steps = len(episode.rewards)
        where = f"{self.data_path}: episode {episode.id}"
        observed = _space_fields("obs", episode.observations, self.dataset.observation_space, where)
        fields: dict[str, np.ndarray] = {}
        for key, rows in observed.items():
            name = key.removeprefix("obs").removeprefix("/") or OBSERVATION
            fields[f"curr_obs/{name}"] = rows[:-1]
            fields[f"next_obs/{name}"] = rows[1:]
        fields["actions"] = np.asarray(episode.actions)
        fields["rewards"] = np.asarray(episode.rewards)
        fields["terminations"] = np.asarray(episode.terminations)
        fields["truncations"] = np.asarray(episode.truncations)
        dones = fields["terminations"].astype(bool) | fields["truncations"].astype(bool)
        dones[-1:] = True
        fields["dones"] = dones
        fields.update(_info_fields(episode.infos or {}, steps, where))
        return fields


def _jsonable(value: Any) -> Any:
    """numpy scalars and arrays inside ``value`` as JSON values."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def _nested(fields: Mapping[str, np.ndarray], prefix: str, space: gym.Space) -> Any:
    """The values of ``space`` from the flat keys below ``prefix`` (the inverse of the import)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _nested(fields, f"{prefix}/{key}", sub) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(
            _nested(fields, f"{prefix}/_index_{position}", sub)
            for position, sub in enumerate(space.spaces)
        )
    return fields[prefix]


def _observations(fields: Mapping[str, np.ndarray], space: gym.Space) -> Any:
    """``T + 1`` observations: ``curr_obs`` rows, then the last ``next_obs`` row."""
    if not isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        return np.concatenate(
            [fields[f"curr_obs/{OBSERVATION}"], fields[f"next_obs/{OBSERVATION}"][-1:]]
        )
    joined = {
        "obs" + key.removeprefix("curr_obs"): np.concatenate(
            [rows, fields["next_obs" + key.removeprefix("curr_obs")][-1:]]
        )
        for key, rows in fields.items()
        if key.startswith("curr_obs/")
    }
    return _nested(joined, "obs", space)


def _infos(fields: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Infos of ``T + 1`` rows from the ``infos`` and ``next_infos`` keys, nested again."""
    out: dict[str, Any] = {}
    for key, rows in fields.items():
        if not key.startswith(_INFOS + "/"):
            continue
        name = key.removeprefix(_INFOS + "/")
        following = fields.get(f"{_NEXT_INFOS}/{name}")
        values = rows if following is None else np.concatenate([rows, following[-1:]])
        *parents, leaf = name.split("/")
        target = out
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = values
    return out


def _fitting_space(rows: np.ndarray) -> gym.Space:
    """A Box that holds ``rows``' values (one row per step)."""
    shape = rows.shape[1:]
    if rows.dtype == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    if rows.dtype == np.bool_:
        return gym.spaces.MultiBinary(list(shape) or 1)
    if rows.dtype.kind in "iu":
        info = np.iinfo(rows.dtype)
        return gym.spaces.Box(info.min, info.max, shape, rows.dtype)
    return gym.spaces.Box(-np.inf, np.inf, shape, rows.dtype)


def _store_spaces(episode: StoredEpisode) -> tuple[gym.Space, gym.Space]:
    """Observation and action spaces for a store not imported from Minari."""
    names = sorted(k.removeprefix("curr_obs/") for k in episode.fields if k.startswith("curr_obs/"))
    if not names or "actions" not in episode.fields:
        raise ValueError(
            f"trajectory {episode.trajectory_id} has no curr_obs or no actions: nothing to "
            f"write as Minari observations and actions"
        )
    if names == [OBSERVATION]:
        observation = _fitting_space(episode.fields[f"curr_obs/{OBSERVATION}"])
    else:
        observation = _dict_space({n: episode.fields[f"curr_obs/{n}"] for n in names})
    return observation, _fitting_space(episode.fields["actions"])


def _dict_space(rows: Mapping[str, np.ndarray]) -> gym.spaces.Dict:
    """A Dict space of Boxes, nested where the keys nest."""
    tree: dict[str, Any] = {}
    for name, values in rows.items():
        *parents, leaf = name.split("/")
        target = tree
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = _fitting_space(values)

    def build(node: Mapping[str, Any]) -> gym.spaces.Dict:
        return gym.spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree)


def _buffer(fields: Mapping[str, np.ndarray], space: gym.Space, meta: Mapping[str, Any]) -> Any:
    """One episode as Minari's ``EpisodeBuffer``."""
    from minari.data_collector.episode_buffer import EpisodeBuffer  # noqa: PLC0415

    steps = len(fields["actions"])
    infos = _infos(fields)
    return EpisodeBuffer(
        id=meta.get("id"),
        seed=meta.get("seed"),
        options=meta.get("options"),
        observations=_observations(fields, space),
        actions=fields["actions"],
        rewards=fields.get("rewards", np.zeros(steps, dtype=np.float32)).reshape(steps),
        terminations=fields.get("terminations", fields["dones"]).reshape(steps).astype(bool),
        truncations=fields.get("truncations", np.zeros(steps, dtype=bool))
        .reshape(steps)
        .astype(bool),
        infos=infos,
    )


class _MinariWriter:
    """A new Minari dataset at ``root`` (its ``data`` folder), written in bursts."""

    def __init__(
        self, root: Path, first: StoredEpisode, recorded: Mapping[str, Any], dataset_id: str
    ) -> None:
        from_minari = recorded.get("format") == "minari"
        raw = dict(recorded.get("metadata") or {}) if from_minari else {}
        if from_minari:
            observation = deserialize_space(raw["observation_space"])
            action = deserialize_space(raw["action_space"])
        else:
            observation, action = _store_spaces(first)
        env_spec = None
        if raw.get("env_spec"):
            env_spec = gym.envs.registration.EnvSpec.from_json(raw["env_spec"])
        self.observation_space = observation
        self.storage = MinariStorage.new(
            root / "data",
            observation_space=observation,
            action_space=action,
            env_spec=env_spec,
            data_format=str(raw.get("data_format", "hdf5")),
            jpeg_encoding=bool(raw.get("jpeg_encoding", False)),
        )
        kept = {k: v for k, v in raw.items() if k not in _SET_BY_STORAGE}
        for name in _SETS:
            if name in kept:
                kept[name] = set(kept[name])
        kept["dataset_id"] = dataset_id  # where it is written, not the source's
        kept.setdefault("minari_version", __version__)
        self.storage.update_metadata(kept)
        self.episode_meta = list(recorded.get("episodes") or []) if from_minari else []
        self.pending: list[Any] = []
        self.count = 0
        self.written_back = {k: raw[k] for k in _WRITTEN_BACK if k in raw}

    def add(self, episode: StoredEpisode) -> None:
        meta = self.episode_meta[self.count] if self.count < len(self.episode_meta) else {}
        meta = {**meta, "id": self.count}
        self.pending.append(_buffer(episode.fields, self.observation_space, meta))
        self.count += 1
        if len(self.pending) >= _BURST:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.storage.update_episodes(self.pending)
            self.pending = []

    def finish(self) -> None:
        """The last burst; the spaces' and env spec's JSON as the source had it (Minari
        serialises them again, perhaps another way)."""
        self.flush()
        if self.written_back:
            path = self.storage.data_path / "metadata.json"
            document = json.loads(path.read_text())
            document.update(self.written_back)
            path.write_text(json.dumps(document))


def export_minari(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str],
    *,
    include_incomplete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    dataset_id: str | None = None,
) -> tuple[int, int]:
    """Write the store at ``source`` as a new Minari dataset folder ``destination``.

    Returns the number of episodes written and of incomplete ones left out.  On failure
    what was written is removed.  The dataset is named ``dataset_id``, by default after
    where it is written (:func:`dataset_id_of`), so Minari finds it by that id.
    """
    # Absolute: Minari's storage joins a relative folder to itself (a relative destination
    # below a relative MINARI_DATASETS_PATH was written nowhere).
    root = Path(os.fspath(destination).removeprefix("file://")).absolute()
    if root.exists() and any(root.iterdir()):
        raise StoreExistsError(f"{root} is not empty; export writes only to a new location")
    dataset_id = dataset_id_of(root) if dataset_id is None else dataset_id
    _check_dataset_id(dataset_id)
    existed = root.exists()
    episodes = read_episodes(source, storage_options, include_incomplete=include_incomplete)
    recorded = episodes.documents.metadata.get(SOURCE_KEY) or {}
    writer: _MinariWriter | None = None
    try:
        for episode in tqdm(episodes, desc="export", unit="episode", disable=not progress):
            if writer is None:
                root.mkdir(parents=True, exist_ok=True)
                writer = _MinariWriter(root, episode, recorded, dataset_id)
            writer.add(episode)
        if writer is None:
            raise ValueError(
                f"{source}: the store holds no complete episode to export"
                f" ({episodes.left_out} incomplete; --include-incomplete writes them)"
            )
        writer.finish()
    except BaseException:
        if root.exists():
            _remove_written(root, existed)
        raise
    return writer.count, episodes.left_out


def minari_datasets_path() -> Path:
    """Where Minari looks for datasets: ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    root = os.environ.get("MINARI_DATASETS_PATH")
    return Path(root) if root else Path.home() / ".minari" / "datasets"


def dataset_id_of(root: Path) -> str:
    """The id Minari finds a dataset folder ``root`` by: its path below Minari's datasets
    folder when it is inside it, else its own name."""
    try:
        return root.resolve().relative_to(minari_datasets_path().resolve()).as_posix()
    except ValueError:
        return root.name


def _check_dataset_id(dataset_id: str) -> None:
    """Refuse an id Minari cannot load (``(namespace/)name-v<version>``), before writing."""
    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError) as exc:  # minari 0.5.4: TypeError when there is no -v<N>
        raise ValueError(
            f"Minari dataset id {dataset_id!r} is not of the form (namespace/)name-v<N>: "
            "name the destination folder like cartpole-v0, or pass --dataset-id "
            "(dataset_id=) with such an id"
        ) from exc


def _remove_written(root: Path, keep_root: bool) -> None:
    """Remove the dataset files an export wrote below ``root``."""
    data = root / "data"
    for name in ("main_data.hdf5", "metadata.json"):
        (data / name).unlink(missing_ok=True)
    if data.exists() and not any(data.iterdir()):
        data.rmdir()
    if not keep_root and not any(root.iterdir()):
        root.rmdir()
