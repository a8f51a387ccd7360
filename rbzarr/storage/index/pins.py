"""Pins: the store's records of which trajectories a checkpoint manifest names.

One file per pin, ``pins/<pin-id>.json`` below the store's root (beside ``priorities/``,
outside ``index/``, whose names the index log reads as its own)::

    {"rbzarr_pin": 1, "id": "<32 hex>", "checkpoint": "<the manifest's URL>",
     "created": <seconds since the epoch>, "ids": [...], "uuids": [...]}

A pin is written whole and atomically (a temporary file renamed locally, one PUT on an
object store) *before* the manifest that names it, so a manifest never exists without its
pin; a crash between the two leaves a pin without a manifest, which keeps its trajectories
until ``rbzarr checkpoint drop STORE --pin ID`` removes it.  Nothing is ever deleted while a
pin names it.  Pin ids are fresh uuids, never reused.  Adding a pin costs one write, never
a listing; reading all pins (``rbzarr checkpoints``, a collection) costs one listing and
one read per pin.  The files are untrusted input: a malformed one is a
:class:`~rbzarr.errors.CorruptStoreError` naming it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.names import is_temporary_name
from rbzarr.storage.io.store_files import StoreFiles

__all__ = ["FOLDER", "Pin", "StorePins"]

FOLDER = "pins"
PIN_VERSION = 1
_SUFFIX = ".json"


@dataclass(frozen=True)
class Pin:
    """One checkpoint's hold on trajectories of a store.

    Parameters
    ----------
    pin_id
        32 hex digits, unique to this pin.
    checkpoint
        The URL of the manifest's folder (where ``save_checkpoint`` wrote it).
    created
        When the pin was written (seconds since the epoch).
    ids, uuids
        The trajectories held, in the manifest's order, and the uuid of each.
    """

    pin_id: str
    checkpoint: str
    created: float
    ids: tuple[int, ...]
    uuids: tuple[str, ...]

    @classmethod
    def new(cls, checkpoint: str, ids: Sequence[int], uuids: Sequence[str]) -> Pin:
        """A pin with a fresh id, created now."""
        return cls(uuid.uuid4().hex, checkpoint, time.time(), tuple(ids), tuple(uuids))

    def to_json(self) -> bytes:
        """The pin file's bytes."""
        document = {
            "rbzarr_pin": PIN_VERSION,
            "id": self.pin_id,
            "checkpoint": self.checkpoint,
            "created": self.created,
            "ids": list(self.ids),
            "uuids": list(self.uuids),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Pin:
        """Parse and check a pin file (``where`` names it in errors)."""
        document = read_json(raw, where)
        try:
            pin = cls(
                pin_id=_pin_id(document["id"]),
                checkpoint=str(document["checkpoint"]),
                created=float(document["created"]),
                ids=tuple(_whole(i) for i in document["ids"]),
                uuids=tuple(str(u) for u in document["uuids"]),
            )
            version = document["rbzarr_pin"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{where}: not a pin record: {exc!r}") from exc
        if version != PIN_VERSION or len(pin.ids) != len(pin.uuids):
            raise CorruptStoreError(
                f"{where}: not a pin record of version {PIN_VERSION} with one uuid per id"
            )
        return pin


def _is_pin_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _pin_id(value: object) -> str:
    """``value`` if it is a pin id (32 lowercase hex digits), else ``ValueError``."""
    text = str(value)
    if not _is_pin_id(text):
        raise ValueError(f"expected a pin id of 32 hex digits, got {text[:40]!r}")
    return text


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a trajectory id, got {value!r}")
    return value


class StorePins(StoreFiles):
    """The pins of the store at ``location``."""

    def add(self, pin: Pin) -> None:
        """Write ``pin``'s record (atomically; one write)."""
        self.location.write_bytes(pin.to_json(), FOLDER, pin.pin_id + _SUFFIX)

    def read(self, pin_id: str) -> Pin | None:
        """The pin ``pin_id``; ``None`` when there is none.

        Raises
        ------
        ValueError
            ``pin_id`` is not a pin id (32 hex digits).
        CorruptStoreError
            Its record is malformed.
        """
        name = _pin_id(pin_id) + _SUFFIX
        try:
            raw = self.location.read_bytes(FOLDER, name)
        except FileNotFoundError:
            return None
        return Pin.from_json(raw, f"{self.location.url}/{FOLDER}/{name}")

    def all(self) -> list[Pin]:
        """Every pin, oldest first (one listing, one read per pin; a pin dropped meanwhile
        is left out)."""
        found = []
        for name in self.location.list_names(FOLDER):
            if is_temporary_name(name) or not name.endswith(_SUFFIX):
                continue
            stem = name.removesuffix(_SUFFIX)
            if not _is_pin_id(stem):
                raise CorruptStoreError(
                    f"{self.location.url}/{FOLDER}/{name}: not a pin record's name (32 hex "
                    "digits); a pin folder holds only pins: move the file elsewhere"
                )
            pin = self.read(stem)
            if pin is not None:
                found.append(pin)
        return sorted(found, key=lambda pin: (pin.created, pin.pin_id))

    def drop(self, pin_id: str) -> bool:
        """Delete the pin ``pin_id``; whether there was one.

        Raises
        ------
        ValueError
            ``pin_id`` is not a pin id (32 hex digits).
        """
        name = _pin_id(pin_id) + _SUFFIX
        if not self.location.exists(FOLDER, name):
            return False
        self.location.delete(FOLDER, name)
        return True
