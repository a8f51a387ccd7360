"""Import LeRobot v3.0, robomimic and Minari datasets into stores, export stores to them,
seed buffers.

pyarrow, PyAV, Pillow, h5py and minari come with the ``datasets`` extra; they are imported
on first use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from rbzarr.interop.episodes import write_episodes
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import Documents

if TYPE_CHECKING:
    from rbzarr.buffer.buffer import TrajectoryReplayBuffer

__all__ = [
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "DatasetExport",
    "export_dataset",
    "import_dataset",
    "seed_buffer",
]

IMPORT_FORMATS = ("lerobot", "robomimic", "minari")
EXPORT_FORMATS = ("lerobot", "hdf5", "minari")


@dataclass(frozen=True)
class DatasetExport:
    """What :func:`export_dataset` wrote.

    Parameters
    ----------
    episodes
        The episodes written.
    left_out
        The incomplete episodes (still running where the store ends) not written.
    """

    episodes: int
    left_out: int


@contextlib.contextmanager
def _datasets_extra() -> Iterator[None]:
    """Name the extra when pyarrow, PyAV, Pillow, h5py or minari is missing.

    Raises
    ------
    ImportError
        A module the ``datasets`` extra brings cannot be imported.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"{exc.name} is missing: install the datasets extra, pip install 'rbzarr[datasets]'"
        ) from exc


def _check_format(name: str, known: tuple[str, ...], what: str) -> None:
    if name not in known:
        raise ValueError(f"unknown {what} format {name!r}; expected one of {', '.join(known)}")


def import_dataset(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str] | Location,
    source_format: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    codecs: Mapping[str, Any] | None = None,
) -> Documents:
    """Import a LeRobot v3.0 dataset, a robomimic HDF5 file or a Minari dataset into a new store.

    Every episode (demo) becomes one trajectory of shape ``[T, 1, ...]``, written in bursts;
    the mapping of fields is in ``docs/behaviour.md``.  The source is checked before
    anything is written, and an error part-way removes what was written: ``destination``
    is left as it was.

    Parameters
    ----------
    source
        A LeRobot dataset's root folder or a robomimic ``.hdf5`` file (path or fsspec URL),
        or a Minari dataset's folder or id (under ``MINARI_DATASETS_PATH``).
    destination
        Where the new store goes; it must not hold a store yet.
    source_format
        ``"lerobot"``, ``"robomimic"`` or ``"minari"``.
    storage_options, destination_options
        fsspec options for the source and the destination.
    progress
        Show a progress bar on stderr.
    codecs
        Codec per flat key of the new store, or ``"default"`` (``{key: spec}``, as
        ``layout_options={"codecs": ...}``); image-like keys not named are stored lossless.

    Returns
    -------
    Documents
        The documents of the new store (what the source was is under
        ``metadata["source_dataset"]``).

    Raises
    ------
    ValueError
        An unknown ``source_format`` or a malformed codec spec.
    UnsupportedDatasetError
        A LeRobot version other than v3.x (the message names the converter), a string
        feature, a codec PyAV cannot decode, an HDF5 file without ``data/``, or Minari
        spaces or infos that are not numeric.
    DatasetFileNotFoundError
        A file the metadata names (parquet, mp4, ``info.json``, the HDF5 file) is missing,
        or no Minari dataset is at ``source``.
    DatasetMismatchError
        Episode lengths, frame counts or indices disagree between metadata and data.
    StoreExistsError
        ``destination`` already holds a store (nothing is written).
    ImportError
        A module of the ``datasets`` extra is not installed.
    """
    _check_format(source_format, IMPORT_FORMATS, "import")
    if source_format == "lerobot":
        with _datasets_extra():
            from rbzarr.interop.lerobot_read import LeRobotSource  # noqa: PLC0415

        lerobot = LeRobotSource.from_url(source, storage_options)
        recorded = {
            "format": "lerobot",
            "url": lerobot.location.url,
            "codebase_version": lerobot.info["codebase_version"],
            "fps": lerobot.fps,
            "robot_type": lerobot.info.get("robot_type"),
            "features": lerobot.info["features"],
            "tasks": lerobot.tasks,
            "episodes": [
                {"episode_index": int(e["episode_index"]), "tasks": list(e.get("tasks") or [])}
                for e in lerobot.episodes_meta
            ],
            "synthesized": [] if "next.reward" in lerobot.info["features"] else ["rewards"],
        }
        return write_episodes(
            lerobot.episodes(),
            destination,
            recorded,
            total=len(lerobot.episodes_meta),
            destination_options=destination_options,
            progress=progress,
            codecs=codecs,
        )
    if source_format == "minari":
        with _datasets_extra():
            from rbzarr.interop.minari_format import MinariSource  # noqa: PLC0415

        minari = MinariSource(source)
        return write_episodes(
            minari.episodes(),
            destination,
            minari.metadata(),
            total=len(minari),
            destination_options=destination_options,
            progress=progress,
            codecs=codecs,
        )
    with _datasets_extra():
        from rbzarr.interop.robomimic import RobomimicSource  # noqa: PLC0415

    robomimic = RobomimicSource(source, storage_options)
    try:
        return write_episodes(
            robomimic.episodes(),
            destination,
            robomimic.metadata(),
            total=len(robomimic.demos),
            destination_options=destination_options,
            progress=progress,
            codecs=codecs,
        )
    finally:
        robomimic.close()


def export_dataset(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str],
    target_format: str,
    *,
    fps: int | None = None,
    task: str = "",
    codec: str = "libsvtav1",
    include_incomplete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    dataset_id: str | None = None,
) -> DatasetExport:
    """Write a store as a new LeRobot v3.0 dataset, robomimic HDF5 file or Minari dataset.

    Every env column is cut into episodes at its ``dones`` (followed across consecutive
    trajectories), in the store's order; reset rows are left out.  Episodes that ended are
    written; one still running where the store ends is left out unless
    ``include_incomplete``.  A store imported from one of these formats is written back
    with its own names, tasks, fps, spaces and metadata, and the fields the import filled
    in are left out, so the non-video fields come back bit for bit.  On failure what was
    written is removed.

    Parameters
    ----------
    source
        The store to export.
    destination
        A new LeRobot dataset folder, a new ``.hdf5`` file, or a new Minari dataset folder.
    target_format
        ``"lerobot"``, ``"hdf5"`` (robomimic's layout) or ``"minari"``.
    fps
        LeRobot frames per second (default: the imported dataset's, else 30).
    task
        LeRobot task of every episode of a store that was not imported from LeRobot.
    codec
        The PyAV encoder of LeRobot videos (``"libsvtav1"``, LeRobot's default, or
        ``"libx264"``, ``"mpeg4"``...).  ``uint8`` ``[H, W, 3]`` observations become videos,
        or PNG frames where the imported LeRobot dataset had image features.
    include_incomplete
        Also write the episodes still running where the store ends.
    storage_options, destination_options
        fsspec options for the source and the destination (Minari: a local folder).
    progress
        Show a progress bar on stderr.
    dataset_id
        Minari: the dataset's id, ``(namespace/)name-v<N>``; by default its path below
        Minari's datasets folder (``MINARI_DATASETS_PATH``) when written there, else the
        destination folder's name, so ``minari.load_dataset`` finds it by that id.

    Returns
    -------
    DatasetExport
        The number of episodes written and of incomplete episodes left out.

    Raises
    ------
    ValueError
        An unknown ``target_format``, or a store without an episode to write.
    StoreExistsError
        ``destination`` is not empty (a folder) or exists (a file); nothing is written.
    CheckpointNotFoundError
        ``source`` is not a store.
    ImportError
        A module of the ``datasets`` extra is not installed.
    """
    _check_format(target_format, EXPORT_FORMATS, "export")
    if dataset_id is not None and target_format != "minari":
        raise ValueError(f"dataset_id names a Minari dataset, not a {target_format} export")
    common = _ExportCommon(
        include_incomplete=include_incomplete, storage_options=storage_options, progress=progress
    )
    if target_format == "lerobot":
        with _datasets_extra():
            from rbzarr.interop.lerobot_write import export_lerobot  # noqa: PLC0415

        info, left_out = export_lerobot(
            source,
            destination,
            fps=fps,
            task=task,
            codec=codec,
            destination_options=destination_options,
            **common,
        )
        return DatasetExport(int(info["total_episodes"]), left_out)
    if target_format == "minari":
        with _datasets_extra():
            from rbzarr.interop.minari_format import export_minari  # noqa: PLC0415

        return DatasetExport(*export_minari(source, destination, dataset_id=dataset_id, **common))
    with _datasets_extra():
        from rbzarr.interop.robomimic import export_robomimic  # noqa: PLC0415

    written = export_robomimic(
        source, destination, destination_options=destination_options, **common
    )
    return DatasetExport(*written)


class _ExportCommon(TypedDict):
    """The keywords every dataset exporter takes."""

    include_incomplete: bool
    storage_options: Mapping[str, Any] | None
    progress: bool


def _source_url(
    source: str | os.PathLike[str], source_format: str, options: Mapping[str, Any] | None
) -> str:
    """The URL an import records of ``source`` (a Minari id resolves to its folder)."""
    if source_format == "minari":
        with _datasets_extra():
            from rbzarr.interop.minari_format import resolve_minari  # noqa: PLC0415

        return str(resolve_minari(source).parent)
    return Location.from_url(source, options).url


def seed_buffer(
    buffer: TrajectoryReplayBuffer,
    source: str | os.PathLike[str],
    source_format: str,
    store: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Fill ``buffer`` (a demo buffer) with a LeRobot, robomimic or Minari dataset's episodes.

    The dataset is imported into a new store at ``store`` (:func:`import_dataset`), which
    ``buffer`` then loads with ``load_checkpoint``; an existing store at ``store`` that an
    earlier call imported is loaded as it is.  The buffer grows online from there.

    Parameters
    ----------
    buffer
        The buffer to fill; its current content is replaced, as by ``load_checkpoint``.
    source
        The dataset (see :func:`import_dataset`).
    source_format
        ``"lerobot"``, ``"robomimic"`` or ``"minari"``.
    store
        Where the imported store is kept.
    storage_options
        fsspec options for ``source`` and ``store``.
    progress
        Show a progress bar on stderr during the import.

    Returns
    -------
    Documents
        The documents of the store the buffer loaded.

    Raises
    ------
    ValueError
        An unknown ``source_format``.
    StoreExistsError
        ``store`` holds a store that was not imported from ``source``.
    """
    from rbzarr.errors import StoreExistsError  # noqa: PLC0415
    from rbzarr.storage.registry import open_store  # noqa: PLC0415

    _check_format(source_format, IMPORT_FORMATS, "import")
    location = Location.from_url(store, storage_options)
    try:
        documents = import_dataset(
            source,
            location,
            source_format,
            storage_options=storage_options,
            destination_options=storage_options,
            progress=progress,
        )
    except StoreExistsError:
        _, documents = open_store(location, storage_options)
        recorded = documents.metadata.get("source_dataset") or {}
        wanted = _source_url(source, source_format, storage_options)
        if recorded.get("url") != wanted:
            raise StoreExistsError(
                f"{location.url} holds a store imported from {recorded.get('url')!r}, "
                f"not from {wanted!r}"
            ) from None
    buffer.load_checkpoint(location.url)
    return documents
