"""Import LeRobot v3.0 and robomimic datasets into stores, export stores to them, seed buffers.

pyarrow, PyAV and h5py come with the ``datasets`` extra; they are imported on first use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.interop.episodes import write_episodes
from rbzarr.storage.documents import Documents
from rbzarr.storage.location import Location

if TYPE_CHECKING:
    from rbzarr.buffer.buffer import TrajectoryReplayBuffer

__all__ = ["EXPORT_FORMATS", "IMPORT_FORMATS", "export_dataset", "import_dataset", "seed_buffer"]

IMPORT_FORMATS = ("lerobot", "robomimic")
EXPORT_FORMATS = ("lerobot", "hdf5")


@contextlib.contextmanager
def _datasets_extra() -> Iterator[None]:
    """Name the extra when pyarrow, PyAV or h5py is missing.

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
) -> Documents:
    """Import a LeRobot v3.0 dataset or a robomimic HDF5 file into a new zarr store.

    Every episode (demo) becomes one trajectory of shape ``[T, 1, ...]``, written one at a
    time; the mapping of fields is in ``docs/behaviour.md``.  The source is checked before
    anything is written, and an error part-way removes what was written: ``destination``
    is left as it was.

    Parameters
    ----------
    source
        A LeRobot dataset's root folder or a robomimic ``.hdf5`` file (path or fsspec URL).
    destination
        Where the new store goes; it must not hold a store yet.
    source_format
        ``"lerobot"`` or ``"robomimic"``.
    storage_options, destination_options
        fsspec options for the source and the destination.
    progress
        Show a progress bar on stderr.

    Returns
    -------
    Documents
        The documents of the new store (what the source was is under
        ``metadata["source_dataset"]``).

    Raises
    ------
    ValueError
        An unknown ``source_format``.
    UnsupportedDatasetError
        A LeRobot version other than v3.x (the message names the converter), an image or
        string feature, a codec PyAV cannot decode, or an HDF5 file without ``data/``.
    DatasetFileNotFoundError
        A file the metadata names (parquet, mp4, ``info.json``, the HDF5 file) is missing.
    DatasetMismatchError
        Episode lengths, frame counts or indices disagree between metadata and data.
    StoreExistsError
        ``destination`` already holds a store (nothing is written).
    ImportError
        pyarrow, PyAV or h5py is not installed (the ``datasets`` extra).
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
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> int:
    """Write a store as a new LeRobot v3.0 dataset or robomimic HDF5 file.

    Every env column of every trajectory becomes one episode (demo), in the store's order;
    reset rows are left out.  A store imported from either format is written back with its
    own names, tasks, fps and attributes, and the fields the import filled in are left out,
    so the non-video fields come back bit for bit.  On failure what was written is removed.

    Parameters
    ----------
    source
        The store to export.
    destination
        A new LeRobot dataset folder, or a new ``.hdf5`` file.
    target_format
        ``"lerobot"`` or ``"hdf5"`` (robomimic's layout).
    fps
        LeRobot frames per second (default: the imported dataset's, else 30).
    task
        LeRobot task of every episode of a store that was not imported from LeRobot.
    codec
        The PyAV encoder of LeRobot videos (``"libsvtav1"``, LeRobot's default, or
        ``"libx264"``, ``"mpeg4"``...).  ``uint8`` ``[H, W, 3]`` observations become videos.
    storage_options, destination_options
        fsspec options for the source and the destination.
    progress
        Show a progress bar on stderr.

    Returns
    -------
    int
        The number of episodes written.

    Raises
    ------
    ValueError
        An unknown ``target_format``, or a store without trajectories.
    StoreExistsError
        ``destination`` is not empty (a folder) or exists (a file); nothing is written.
    CheckpointNotFoundError
        ``source`` is not a store.
    ImportError
        pyarrow, PyAV or h5py is not installed (the ``datasets`` extra).
    """
    _check_format(target_format, EXPORT_FORMATS, "export")
    if target_format == "lerobot":
        with _datasets_extra():
            from rbzarr.interop.lerobot_write import export_lerobot  # noqa: PLC0415

        info = export_lerobot(
            source,
            destination,
            fps=fps,
            task=task,
            codec=codec,
            storage_options=storage_options,
            destination_options=destination_options,
            progress=progress,
        )
        return int(info["total_episodes"])
    with _datasets_extra():
        from rbzarr.interop.robomimic import export_robomimic  # noqa: PLC0415

    return export_robomimic(
        source,
        destination,
        storage_options=storage_options,
        destination_options=destination_options,
        progress=progress,
    )


def seed_buffer(
    buffer: TrajectoryReplayBuffer,
    source: str | os.PathLike[str],
    source_format: str,
    store: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Fill ``buffer`` (a demo buffer) with a LeRobot or robomimic dataset's episodes.

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
        ``"lerobot"`` or ``"robomimic"``.
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
        wanted = Location.from_url(source, storage_options).url
        if recorded.get("url") != wanted:
            raise StoreExistsError(
                f"{location.url} holds a store imported from {recorded.get('url')!r}, "
                f"not from {wanted!r}"
            ) from None
    buffer.load_checkpoint(location.url)
    return documents
