"""A store's schema and format marker as ``metadata.json`` records them (store level, below
the buffer: the buffer, its checkpoints and the analysis tools all read them here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rbzarr.errors import CorruptStoreError, UnsafePathError
from rbzarr.storage.index.entry import count
from rbzarr.storage.io.names import safe_key
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.rlinf.documents import Entry
from rbzarr.trajectory.dtypes import storage_dtype

if TYPE_CHECKING:
    from rbzarr.trajectory.model import Schema

__all__ = ["check_schema", "is_rbzarr_store", "schema_from_json", "schema_to_json"]


def schema_to_json(schema: Schema | None) -> dict[str, Any] | None:
    """The schema as JSON, ``{key: [dtype, [trailing...]]}``; ``None`` before the first add."""
    if schema is None:
        return None
    return {key: [dtype, list(trailing)] for key, (dtype, trailing) in schema.items()}


def schema_from_json(document: Any) -> Schema | None:
    """Inverse of :func:`schema_to_json`; ``None`` when the store records none (RLinf)."""
    if not document:
        return None
    try:
        schema = {
            safe_key(key, "metadata.json 'schema'"): (
                _dtype_name(dtype),
                tuple(count(d) for d in trailing),
            )
            for key, (dtype, trailing) in document.items()
        }
    except UnsafePathError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptStoreError(f"metadata.json: unreadable 'schema': {exc}") from exc
    return schema


def check_schema(schema: Schema, layout: TrajectoryLayout, entry: Entry) -> None:
    """Refuse (:class:`CorruptStoreError`) a stored ``schema`` that a trajectory's data
    contradicts: every key's dtype and trailing shape, read from one row of the trajectory
    of ``entry`` (so nothing is ever allocated by the sizes the schema declares)."""
    if not schema or int(entry["num_samples"]) == 0:
        return
    where = f"{layout.location.url}: trajectory {entry['trajectory_id']}"
    try:
        rows, names = layout.first_row(entry, list(schema))
        held_dtypes = {key: names[key] for key in schema}
    except (KeyError, IndexError) as exc:
        raise CorruptStoreError(f"{where}: does not hold the schema's fields: {exc!r}") from exc
    for key, (dtype, trailing) in schema.items():
        held = rows[key]
        if held_dtypes[key] != dtype or tuple(held.shape[1:]) != tuple(trailing):
            raise CorruptStoreError(
                f"{where}: field {key!r} holds {held_dtypes[key]} rows of "
                f"{list(held.shape[1:])}, the schema in metadata.json says {dtype} rows of "
                f"{list(trailing)}"
            )


def _dtype_name(name: Any) -> str:
    """``name`` if it names a dtype rbzarr stores, else ``ValueError``."""
    storage_dtype(str(name))
    return str(name)


def is_rbzarr_store(metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata.json`` carries rbzarr's format marker (RLinf's does not)."""
    return "rbzarr_format_version" in metadata
