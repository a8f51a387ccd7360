"""Exclusive claims of writer slots: who may write a slot's documents and ids.

Locally a claim is an exclusive ``flock`` of the slot's folder (the store's root for slot
0): the kernel drops it when its process ends, however it ends, so a killed writer's slot
is free again at once and no file is added to the store.  On object stores (S3) a claim is
the object ``writers/<slot>/claim``, created only if absent (``IfNoneMatch="*"``, s3fs's
``mode="create"``); a clean close deletes it.  That PUT is also the store's writability
probe, at no extra request: a permanent failure (no such bucket, access denied) is
:class:`~rbzarr.errors.StoreNotWritableError` at construction.  A writer killed there keeps its slot
claimed: the next writer takes another slot (zarr), or is refused with advice (pt / pkl).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time

from rbzarr.errors import StorageUnavailableError, StoreNotWritableError
from rbzarr.storage.index.slots import WRITERS, slot_location
from rbzarr.storage.io.backends import permanent_cause, translate_errors
from rbzarr.storage.io.deadlines import deadline_options
from rbzarr.storage.io.files import make_directories
from rbzarr.storage.io.location import Location

__all__ = ["CLAIM_FILE", "SlotClaim"]

CLAIM_FILE = "claim"


class SlotClaim:
    """One held claim of one slot of one store; :meth:`acquire` or nothing."""

    def __init__(self, location: Location, slot: int, descriptor: int | None) -> None:
        self.location = location
        self.slot = slot
        self._descriptor = descriptor  # the flocked folder, locally
        self._held = True

    @classmethod
    def acquire(cls, location: Location, slot: int) -> SlotClaim | None:
        """Claim ``slot`` of the store at ``location``; ``None`` if another writer holds it."""
        if location.is_local:
            return cls._lock_folder(location, slot)
        content = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()})
        target = location.join(WRITERS, str(slot), CLAIM_FILE)
        with translate_errors(location.url, "claiming a writer slot of"):
            try:
                location.fs.pipe_file(
                    target, content.encode(), mode="create", **deadline_options(location.fs)
                )
            except FileExistsError:
                return None
            except FileNotFoundError:
                raise  # no such bucket: translate_errors names it, as every write path does
            except OSError as exc:  # the claim is the store's first write: its probe
                if permanent_cause(exc) is None:
                    raise
                raise StoreNotWritableError(
                    f"auto_save_path {location.url} cannot be written: {exc}; choose another "
                    "auto_save_path, create the bucket or fix its permissions"
                ) from exc
        return cls(location, slot, None)

    @classmethod
    def _lock_folder(cls, location: Location, slot: int) -> SlotClaim | None:
        folder = slot_location(location, slot).path
        with translate_errors(location.url, "claiming a writer slot of"):
            # A durable store's new folders are synced into their parents too.
            make_directories(folder, location.durable)
            descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                return None
            except BaseException:
                os.close(descriptor)
                raise
        return cls(location, slot, descriptor)

    @property
    def held(self) -> bool:
        """Whether this claim is still held."""
        return self._held

    def release(self) -> None:
        """Give the slot up (a second call does nothing)."""
        if not self._held:
            return
        self._held = False
        if self._descriptor is not None:
            os.close(self._descriptor)
            return
        # Best effort: during an outage the claim stays, as a killed writer's would (the
        # next zarr writer takes another slot), and close() still succeeds.
        target = self.location.join(WRITERS, str(self.slot), CLAIM_FILE)
        with (
            contextlib.suppress(StorageUnavailableError, FileNotFoundError),
            translate_errors(self.location.url, "releasing a writer slot of"),
        ):
            self.location.fs.rm_file(target)

    def __del__(self) -> None:
        # A buffer dropped without close(): locally the lock goes with the descriptor.
        if self._descriptor is not None and self._held:
            self._held = False
            os.close(self._descriptor)
