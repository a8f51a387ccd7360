"""A store re-encoded into a new zarr store with other codecs (``rbzarr recode``).

The destination is new, or one that an interrupted recode of the same source with the same
codecs left: a recode writes :data:`RECODE_FILE` (its source and codecs) before any
trajectory and removes it after the store's documents, so a rerun knows what it resumes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from rbzarr.analysis.export import COPY_FAILURES, COPY_RETURNS, copied_documents
from rbzarr.analysis.listing import StoreListing
from rbzarr.analysis.summary import describe_store
from rbzarr.caller import warn_caller
from rbzarr.errors import CodecConflictError, CorruptStoreError, RecodeWarning, StoreExistsError
from rbzarr.shared_doc import shared_doc
from rbzarr.storage.index.schema import schema_from_json
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.json_limits import read_json
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import open_store
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.storage.zarr.codecs import Codec, choose_codec, parse_codecs
from rbzarr.storage.zarr.layout import CODECS_KEY, ZarrLayout
from rbzarr.storage.zarr.next_obs import CURR, NEXT
from rbzarr.trajectory.model import Schema, validate

__all__ = ["RECODE_FILE", "RecodePlan", "plan_recode", "recode_store"]

# The dtypes a key's codec is chosen for: frames, or anything else.
_UINT8, _OTHER = "uint8", "float64"
# What an unfinished recode writes first: its source and codecs.
RECODE_FILE = "recode.json"


@dataclass(frozen=True)
class RecodePlan:
    """What a recode will write: each key's codec, and what the user may not expect.

    Parameters
    ----------
    source
        The source store's URL.
    codecs
        The specs the destination's writer gets (``"default"`` included): those given, a
        ``curr_obs`` key's spec for its ``next_obs`` key, the source's for the rest.
    resolved
        The concrete codec of every key of the source's schema, as text.
    default
        The given ``"default"`` spec as text, or ``None``.
    default_keys, default_leaves
        Keys ``"default"`` encodes, and those it cannot and leaves raw (an image codec
        encodes only image-like keys).
    paired
        ``next_obs`` keys given their ``curr_obs`` key's codec, so they stay stored once.
    split
        One warning per ``next_obs`` key that loses "stored once" (its codec now differs
        from its ``curr_obs`` key's), with the size it costs.
    """

    source: str
    codecs: dict[str, Any]
    resolved: dict[str, str]
    default: str | None = None
    default_keys: tuple[str, ...] = ()
    default_leaves: tuple[str, ...] = ()
    paired: tuple[str, ...] = ()
    split: tuple[str, ...] = ()

    def notes(self) -> list[str]:
        """What the plan does that the options do not say, one line each (warnings apart)."""
        found = [
            f"{key} takes {_curr(key)}'s codec {self.resolved[key]}, so it stays stored once "
            f"(give --codec {key}=SPEC to choose it apart)"
            for key in self.paired
        ]
        if self.default is not None:
            leaves = ", ".join(self.default_leaves)
            found.append(
                f"default={self.default} encodes {', '.join(self.default_keys) or 'no key'}"
                + (f"; it cannot encode {leaves}, which are stored raw" if leaves else "")
            )
        return found

    def marker(self) -> dict[str, Any]:
        """The :data:`RECODE_FILE` document of this plan."""
        return {"source": self.source, "codecs": self.resolved}


def plan_recode(
    source: str | os.PathLike[str] | Location,
    codecs: Mapping[str, Any],
    storage_options: Mapping[str, Any] | None = None,
) -> RecodePlan:
    """What :func:`recode_store` would write with ``codecs``; reads only the source's
    documents (and one trajectory of a store that records no schema).

    Raises
    ------
    ValueError
        A spec is malformed, names a key the source does not have, or cannot encode its key.
    CheckpointNotFoundError
        ``source`` is not a store.
    """
    reader, documents = open_store(source, storage_options)
    return _plan(reader, documents, codecs)


@shared_doc(copy_returns=COPY_RETURNS, copy_failures=COPY_FAILURES)
def recode_store(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    codecs: Mapping[str, Any],
    *,
    storage_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Documents:
    """Copy every committed trajectory of ``source`` into a new zarr store at ``destination``,
    its keys encoded with ``codecs``.

    ``source`` is only read.  Keys ``codecs`` does not name keep the codec ``source``
    records for them, unless ``codecs`` has ``"default"``; a ``next_obs/K`` key not named
    takes the codec given to ``curr_obs/K``, so it stays stored once (given apart, a
    :class:`~rbzarr.errors.RecodeWarning` says what that costs).  Lossy codecs record their
    PSNR, as when writing.  The trajectories' priority files
    (:attr:`~rbzarr.storage.index.store_index.StoreIndex.priorities`) are copied as they
    are.  An interrupted recode resumes: run it again with the same
    source and codecs and the trajectories already complete in ``destination`` are kept;
    the store's documents are written last, so ``destination`` is a store only once every
    trajectory is in it.

    Parameters
    ----------
    source
        The store read (any format).
    destination
        Where the new zarr store goes: a new or empty location, or one an interrupted recode
        of ``source`` left.
    codecs
        ``{key: spec}`` (``"curr_obs/image": "jpeg:95"``, ``"default": "lossless"``).
    storage_options, destination_options
        fsspec options of ``source`` and ``destination``.
    progress
        Show a progress bar on stderr.

    {copy_returns}

    Raises
    ------
    StoreExistsError
        ``destination`` already holds a store, is inside ``source``, holds other files, or
        an interrupted recode of another source; nothing is written.
    CodecConflictError
        ``destination`` is an interrupted recode with other codecs; nothing is written.
    ValueError
        A spec is malformed, or names a key ``source`` does not have.
    {copy_failures}
    """
    reader, documents = open_store(source, storage_options)
    plan = _plan(reader, documents, codecs)
    for warning in plan.split:
        warn_caller(warning, RecodeWarning)
    writer = ZarrLayout(Location.from_url(destination, destination_options), codecs=plan.codecs)
    _require_destination(writer, reader.location, plan)
    writer.location.write_bytes(json.dumps(plan.marker(), indent=1).encode(), RECODE_FILE)
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    entries = [index.entries[i] for i in index.id_list]
    for entry in tqdm(entries, desc="recode", unit="traj", disable=not progress):
        if _complete(writer, entry):
            continue
        writer.write(dict(entry), reader.read(entry))
    written = writer.write_documents(copied_documents(reader, writer, index, documents, "zarr"))
    writer.location.delete(RECODE_FILE)
    return written


def _plan(reader: TrajectoryLayout, documents: Documents, codecs: Mapping[str, Any]) -> RecodePlan:
    """The plan of recoding the store ``reader`` reads (see :class:`RecodePlan`)."""
    given = parse_codecs(codecs)
    schema = _schema(reader, documents)
    unknown = sorted(key for key in given if key != "default" and schema and key not in schema)
    if unknown:
        raise ValueError(f"{reader.location.url} has no key {unknown[0]!r} (keys: {list(schema)})")
    recorded = documents.metadata.get(CODECS_KEY) or {}
    chosen: dict[str, Any] = dict(codecs)
    if "default" not in given:  # the source's own choices stay where none is given
        chosen = {**{k: v for k, v in recorded.items() if k != "default"}, **codecs}
        chosen.setdefault("default", recorded.get("default", "raw"))
    paired = [
        key for key in schema if key.startswith(NEXT) and key not in given and _curr(key) in given
    ]
    for key in paired:
        chosen[key] = codecs[_curr(key)]
    before = _resolve(parse_codecs(recorded), schema)
    after = _resolve(parse_codecs(chosen), schema)
    default = given["default"].text if "default" in given else None
    reached = [k for k in schema if default is not None and k not in given and k not in paired]
    leaves = [k for k in reached if after[k] == "raw" != default]
    split = [
        key
        for key in schema
        if _curr(key) in schema
        and _stored_once(schema, before, key)
        and after[key] != after[_curr(key)]
    ]
    return RecodePlan(
        source=reader.location.url,
        codecs=chosen,
        resolved=after,
        default=default,
        default_keys=tuple(k for k in reached if k not in leaves),
        default_leaves=tuple(leaves),
        paired=tuple(paired),
        split=tuple(_split_warnings(reader, split, after, _raw_frames(documents, schema))),
    )


def _curr(key: str) -> str:
    """The ``curr_obs`` key of a ``next_obs`` key (``""`` for any other key)."""
    return CURR + key[len(NEXT) :] if key.startswith(NEXT) else ""


def _schema(reader: TrajectoryLayout, documents: Documents) -> Schema:
    """The source's schema: recorded, else its first trajectory's (none when empty)."""
    recorded = schema_from_json(documents.metadata.get("schema"))
    if recorded is not None:
        return recorded
    index = TrajectoryIndex.from_documents(documents, reader.location.url)
    if not index.id_list:
        return {}
    return validate(reader.read(index.entries[index.id_list[0]])).schema


def _resolve(codecs: Mapping[str, Codec], schema: Schema) -> dict[str, str]:
    """The concrete codec of each key of ``schema`` under ``codecs``, as text."""
    # Only "is it uint8" matters to the choice, and numpy does not name every dtype (bfloat16).
    return {
        key: choose_codec(
            codecs, key, (1, 1, *trailing), _UINT8 if dtype == "uint8" else _OTHER
        ).text
        for key, (dtype, trailing) in schema.items()
    }


def _stored_once(schema: Schema, resolved: Mapping[str, str], key: str) -> bool:
    """Whether ``next_obs`` key ``key`` can share rows with its ``curr_obs`` key under
    ``resolved``: one dtype and shape, one image codec (see ``storage/zarr/next_obs.py``)."""
    curr = _curr(key)
    if schema.get(curr) != schema[key] or resolved[key] != resolved[curr]:
        return False
    return parse_codecs({key: resolved[key]})[key].is_image


def _raw_frames(documents: Documents, schema: Schema) -> dict[str, int]:
    """Raw bytes of each uint8 key of ``schema`` over the store's samples."""
    samples = int(documents.metadata.get("total_samples") or 0)
    return {
        key: samples * math.prod(trailing)
        for key, (dtype, trailing) in schema.items()
        if dtype == "uint8"
    }


def _split_warnings(
    reader: TrajectoryLayout,
    keys: list[str],
    resolved: Mapping[str, str],
    raw: Mapping[str, int],
) -> list[str]:
    """Why each ``next_obs`` key of ``keys`` is stored whole, and what it costs (from the
    source's sizes on disk, or its raw frames where the format stores every row)."""
    if not keys:
        return []
    sizes: dict[str, Any] = {}
    if isinstance(reader, ZarrLayout):  # its sizes come from zarr's metadata alone
        sizes = describe_store(StoreListing(reader.location))["keys"]
    found = []
    for key in keys:
        curr = _curr(key)
        mine, theirs = sizes.get(key, {}), sizes.get(curr, {})
        cost = f"about as large as {curr} ({_size(raw.get(key, 0))} of frames before its codec)"
        if mine.get("bytes_on_disk") is not None and theirs.get("bytes_on_disk") is not None:
            cost = (
                f"about {_size(theirs['bytes_on_disk'] - mine['bytes_on_disk'])} more ({curr} "
                f"takes {_size(theirs['bytes_on_disk'])} in the source, {key} stored once "
                f"{_size(mine['bytes_on_disk'])})"
            )
        found.append(
            f"{key} gets codec {resolved[key]} but {curr} {resolved[curr]}: {key} is no "
            f"longer stored once (the rows it shares with {curr}) but whole, {cost}; name only "
            f"{curr}, or give both one codec, to keep it stored once"
        )
    return found


def _size(nbytes: int) -> str:
    """A size for people: MB, or kB below 0.1 MB."""
    return f"{nbytes / 1e6:.1f} MB" if abs(nbytes) >= 100_000 else f"{nbytes / 1e3:.1f} kB"


def _require_destination(writer: ZarrLayout, source: Location, plan: RecodePlan) -> None:
    """Refuse a destination that is not new, empty, or an interrupted recode of this plan."""
    where = writer.location
    if where.url == source.url or where.url.startswith(source.url.rstrip("/") + "/"):
        inside = "is" if where.url == source.url else "is inside"
        raise StoreExistsError(
            f"{where.url} {inside} the source store {source.url}: recode writes a new store "
            "outside its source; choose another destination"
        )
    if StoreIndex.open(where).exists:
        raise StoreExistsError(
            f"{where.url} already holds a store; recode writes only to a new "
            "location (or one an interrupted recode left)"
        )
    names = where.list_names()
    if not names:
        return
    if RECODE_FILE not in names:
        raise StoreExistsError(
            f"{where.url} is not empty ({len(names)} entries, e.g. {names[0]!r}) and is no "
            "interrupted recode; recode writes to a new or empty folder"
        )
    earlier = read_json(where.read_bytes(RECODE_FILE), f"{where.url}/{RECODE_FILE}")
    if not isinstance(earlier, dict) or earlier.get("source") != plan.source:
        found = earlier.get("source") if isinstance(earlier, dict) else None
        raise StoreExistsError(
            f"{where.url} is an interrupted recode of {found!r}, not of {plan.source}; "
            "resume it with its own source, or choose another destination"
        )
    if earlier.get("codecs") != plan.resolved:
        theirs = earlier.get("codecs") or {}
        differ = sorted(
            k for k in {*theirs, *plan.resolved} if theirs.get(k) != plan.resolved.get(k)
        )
        shown = ", ".join(f"{k}: {theirs.get(k)} there, {plan.resolved.get(k)} now" for k in differ)
        raise CodecConflictError(
            f"{where.url} is an interrupted recode with other codecs ({shown}); resume it "
            "with the codecs it began with, or choose another destination"
        )


def _complete(writer: ZarrLayout, entry: Mapping[str, Any]) -> bool:
    """Whether a trajectory is already wholly in ``writer`` (its group's attributes, the
    commit marker, are written last)."""
    audit = writer.audit()
    if not audit.contains(dict(entry)):
        return False
    try:
        return bool(writer.fields(dict(entry))) and not audit.missing_parts(dict(entry))
    except CorruptStoreError:
        return False
