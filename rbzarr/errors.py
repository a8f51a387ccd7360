"""The exception hierarchy; each class also derives from the builtin a caller would catch."""

from __future__ import annotations


class RbzarrError(Exception):
    """Base class of every error raised by rbzarr."""


class InvalidTrajectoryError(RbzarrError, ValueError):
    """A trajectory's fields disagree with each other or with the buffer's schema."""


class TrajectoryListError(InvalidTrajectoryError, TypeError):
    """``add_trajectories`` got no list of trajectories (one trajectory, a str, a dict,
    ``None``); a ``TypeError`` too, as RLinf raises for it."""


class UnsafePathError(RbzarrError, ValueError):
    """A name would escape the directory it must stay inside."""


class CheckpointNotFoundError(RbzarrError, FileNotFoundError):
    """A checkpoint, its JSON documents or a trajectory's data are missing."""


class CheckpointReferenceError(CheckpointNotFoundError):
    """A checkpoint manifest names a store, or trajectories in it, that are gone or changed.

    Parameters
    ----------
    message
        What is gone or changed, and where.
    store
        The store's URL.
    missing, changed
        The trajectory ids whose data is gone, or is no longer the trajectory the manifest
        names (both empty when the store itself is gone).
    """

    def __init__(
        self,
        message: str,
        store: str,
        missing: tuple[int, ...] = (),
        changed: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.store = store
        self.missing = missing
        self.changed = changed


class CheckpointConflictError(RbzarrError, ValueError):
    """A checkpoint call conflicts with the buffer's auto-save store (it would drop or
    overwrite what the store lists)."""


class CodecConflictError(RbzarrError, ValueError):
    """A writer's codec for a key differs from the one its store records (``rbzarr recode``
    changes a store's codecs)."""


class InvalidCodecError(RbzarrError, ValueError):
    """A codec cannot encode its key (a lossy image codec on floats, an image codec on a
    non-image shape), or names a key the trajectories do not have: refused before anything
    is accepted."""


class CodecUnavailableError(RbzarrError, ImportError):
    """A codec's package cannot be imported by this process: its data cannot be written or
    decoded here, but it is not damaged (install the package named in the message)."""


class EmptyBufferError(RbzarrError, RuntimeError):
    """Sampling a buffer (or a window) that holds no trajectory."""


class CorruptStoreError(RbzarrError, ValueError):
    """A store exists but its documents or data cannot be parsed or disagree."""


class UnsafePickleError(CorruptStoreError):
    """A pickle refers to a global that the restricted unpickler does not admit."""


class StoreExistsError(RbzarrError, FileExistsError):
    """Writing would overwrite a store that this buffer has not loaded."""


class StorageUnavailableError(RbzarrError, OSError):
    """The storage backend failed (unreachable, refused, timed out) after retries."""


class SchedulerUnavailableError(RbzarrError, ConnectionError):
    """No dask scheduler answered at the address given (``--scheduler``) in time."""


class StorageOptionError(RbzarrError, TypeError):
    """A storage option that the location's filesystem does not take (a misspelled name)."""


class StoreNotWritableError(StorageUnavailableError):
    """The store's path cannot be written for good (permission, read-only, not a directory,
    no space, no such bucket): retrying does not help."""


class BufferClosedError(RbzarrError, RuntimeError):
    """The buffer was closed; it no longer accepts trajectories."""


class WriterFailedError(RbzarrError, RuntimeError):
    """A background write failed; the cause is chained as ``__cause__``."""


class ChannelClosedError(RbzarrError, RuntimeError):
    """A channel was closed: ``put`` is refused, and ``get`` finds nothing left to drain."""


class ChannelTimeoutError(RbzarrError, TimeoutError):
    """A channel ``put`` or ``get`` did not complete within its timeout."""


class InsertTimeoutError(RbzarrError, TimeoutError):
    """A dataset with ``samples_per_insert`` waited ``insert_timeout`` seconds for an insert."""


class WorkerProcessError(RbzarrError, RuntimeError):
    """A dataset that samples the buffer in its own process was iterated in a DataLoader
    worker process (which would sample a frozen copy)."""


class UncommittedWritesWarning(UserWarning):
    """``close(wait=False)`` returned while writes were not committed yet."""


class RecodeWarning(UserWarning):
    """A recode's codecs cost more than the user may expect (a ``next_obs`` key that is no
    longer stored once)."""


class DamagedTrajectoryWarning(UserWarning):
    """A buffer with ``on_damaged="skip"`` dropped a trajectory whose data is damaged or
    missing from its sample window (once per trajectory; the store is left as it is)."""


class UnsupportedDatasetError(RbzarrError, ValueError):
    """A dataset to import is of a version, layout or codec that rbzarr does not read."""


class DatasetMismatchError(RbzarrError, ValueError):
    """A dataset's metadata and its data disagree (episode lengths, frame counts, indices)."""


class DatasetFileNotFoundError(RbzarrError, FileNotFoundError):
    """A file that a dataset's metadata names (parquet, video, HDF5) is missing."""


class NotAnImageError(RbzarrError, ValueError):
    """A key asked to be shown as camera frames is not image-like (or a store has none)."""


class EpisodeNotFoundError(RbzarrError, IndexError):
    """An episode number beyond the episodes a store holds."""


class EncoderUnavailableError(RbzarrError, ImportError):
    """An output format whose encoder (PyAV's codec, Pillow's writer) is not installed."""


# Every class above is public (``rbzarr`` re-exports those users catch most).
__all__ = [
    name
    for name, value in dict(globals()).items()
    if isinstance(value, type) and value.__module__ == __name__
]
