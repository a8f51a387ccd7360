"""Hostile stores: each case tampers with a valid store and runs every operation on it in a
capped child process (:mod:`hostile_stores`).  No case may crash the child, run code, touch
or copy anything outside the store, read rows from outside, grow memory past 1 GiB, time
out, or raise anything but a named error (``CorruptStoreError``, ``UnsafePathError``,
``CheckpointNotFoundError`` or a subclass)."""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_stores import (
    OPERATIONS,
    SECRET,
    Case,
    Reduce,
    Strided,
    check_case,
    deep_pickle,
    deep_scalar,
    deflate_bomb,
    edit_json,
    first_file,
    group,
    huge_length_pickle,
    link,
    make_bases,
    numpy_dtype_forgery,
    numpy_scalar_forgery,
    prepare,
    record_of,
    rename_key,
    replace_text,
    run_case,
    snapshot,
    write_record,
)

pytestmark = pytest.mark.timeout(600)

ZARR = ("zarr", "zarrz", "zarr1")
FILES = ("pt", "pkl")
ALL = (*ZARR, *FILES)
LOG = ("zarrlog",)


def _index(case: Case) -> Path:
    return case.store / "trajectory_index.json"


def _metadata(case: Case) -> Path:
    return case.store / "metadata.json"


def _entry0(change: Callable[[dict[str, Any]], None]) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        edit_json(_index(case), lambda d: change(d["trajectory_index"]["0"]))

    return mutate


def _pkl_record(value: Callable[[Case], Any], field: str = "rewards") -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        record = record_of(case)
        record[field] = value(case)
        first_file(case).write_bytes(pickle.dumps(record, protocol=2))

    return mutate


def _layout(key: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        edit_json(
            group(case) / "zarr.json",
            lambda d: change(d["attributes"]["rbzarr_layout"]["arrays"][key]),
        )

    return mutate


def _array_document(key: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Case], None]:
    """Change an array's document: its group's consolidated copy (a file of its own in
    stores written before)."""

    def mutate(case: Case) -> None:
        own = group(case) / key / "zarr.json"
        if own.exists():
            edit_json(own, change)
            return
        edit_json(
            group(case) / "zarr.json",
            lambda d: change(d["consolidated_metadata"]["metadata"][key]),
        )

    return mutate


def _shard(case: Case, key: str = "rewards") -> Path:
    folder = group(case) / key  # the shard: c.0.0 (or c/0/0 in older stores)
    return next(p for p in folder.rglob("*") if p.is_file() and p.name != "zarr.json")


def _forge_index(case: Case) -> None:
    """The last 20 bytes of a shard (its index) point far past the file."""
    path = _shard(case)
    data = path.read_bytes()
    path.write_bytes(data[:-20] + (2**40).to_bytes(8, "little") * 2 + data[-4:])


def _lying_pt_shape(case: Case) -> None:
    record = record_of(case)
    for key in ("rewards", "actions", "prev_logprobs"):
        record[key] = torch.cat([record[key], record[key]])
    write_record(case, record)


def _stride_zero_pt(case: Case) -> None:
    record = record_of(case)
    record["rewards"] = torch.zeros(1, dtype=torch.float64).expand(4, 2, 10**8)
    write_record(case, record)


def _huge_index(case: Case) -> None:
    edit_json(_index(case), lambda d: d.update(padding="x" * (65 << 20)))


def _symlinked_folder(name: str) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        link(case.store / name, case.outside / "other" / name)

    return mutate


def _symlinked_file(name: str) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        target = case.outside / name.replace("/", "_")
        source = case.store / name
        target.write_bytes(source.read_bytes())
        link(source, target)

    return mutate


def _linked_writer_slot(case: Case) -> None:
    """``writers/1`` a link to an outside folder holding a writer's documents."""
    slot = case.outside / "slot"
    slot.mkdir()
    for name in ("metadata.json", "trajectory_index.json"):
        (slot / name).write_bytes((case.store / name).read_bytes())
    (case.store / "writers").mkdir()
    link(case.store / "writers" / "1", slot)


def _linked_trajectories_with_orphans(case: Case) -> None:
    """The repro of ``verify --repair`` deleting another store's trajectories 2 and 3."""
    link(case.store / "trajectories", case.outside / "other" / "trajectories")
    edit_json(
        _index(case),
        lambda d: d.update(
            trajectory_id_list=[0, 1], trajectory_index={k: d["trajectory_index"][k] for k in "01"}
        ),
    )


def _secret_pt(case: Case) -> None:
    """Trajectory 3's ``.pt`` a link to a private key (the load_checkpoint copy repro)."""
    path = next(case.store.glob(f"trajectory_3_*.{case.fmt}"))
    link(path, case.outside / "id_rsa")


def _fifo(relative: Callable[[Case], Path]) -> Callable[[Case], None]:
    """Replace a file by a FIFO (a reader that opens it blocks until a writer comes)."""

    def mutate(case: Case) -> None:
        path = relative(case)
        path.unlink(missing_ok=True)  # a document a store written before has
        os.mkfifo(path)

    return mutate


def _socket_file(case: Case) -> None:
    """Trajectory 0's file replaced by a listening Unix socket's name."""
    import socket  # noqa: PLC0415

    path = first_file(case)
    path.unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the name stays; opening it fails (ENXIO) or blocks, per platform


def _log(case: Case) -> Path:
    return case.store / "index"


def _head(case: Case) -> Path:
    return _log(case) / "head.json"


def _block(case: Case) -> Path:
    return next((_log(case) / "blocks").glob("*.json"))


def _record(case: Case, seq: int = 2) -> Path:
    return _log(case) / "log" / f"{seq:012d}.json"


def _edit_block_entry(change: Callable[[dict[str, Any]], None]) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        edit_json(_block(case), lambda d: change(d["entries"][0]))

    return mutate


def _group_attrs(text: str) -> Callable[[Case], None]:
    """Group 0's attributes hold ``text`` (raw JSON) as its model_weights_id."""

    def mutate(case: Case) -> None:
        path = group(case) / "zarr.json"
        document = json.loads(path.read_bytes())
        document["attributes"]["model_weights_id"] = "@@"
        path.write_text(json.dumps(document).replace('"@@"', text))

    return mutate


def _lost_log_with(change: Callable[[Case], None]) -> Callable[[Case], None]:
    """The log loses its block (a repair rebuilds trajectories 0 and 1 from their groups'
    attributes), and group 0's attributes are tampered with."""

    def mutate(case: Case) -> None:
        _block(case).unlink()
        change(case)

    return mutate


def _group0_shape(text: str) -> Callable[[Case], None]:
    def mutate(case: Case) -> None:
        replace_text(group(case) / "zarr.json", r'"shape": ?\[4, ?2\]', f'"shape": {text}')

    return mutate


def _digit_folder(case: Case, folder: str, name: str) -> None:
    """A folder named with Unicode digits beside the real ones (a copy of a real one)."""
    if folder == "writers":
        (case.store / "writers").mkdir(exist_ok=True)
        target = case.store / "writers" / name
        target.mkdir()
        for document in ("metadata.json", "trajectory_index.json"):
            if (case.store / document).exists():
                (target / document).write_bytes((case.store / document).read_bytes())
    else:
        import shutil  # noqa: PLC0415

        shutil.copytree(group(case), case.store / "trajectories" / name)


def _schema(change: Callable[[dict[str, Any]], None]) -> Callable[[Case], None]:
    """Change the stored schema (``metadata.json``'s, and a log head's)."""

    def mutate(case: Case) -> None:
        edit_json(_metadata(case), lambda m: change(m["schema"]))
        if _head(case).exists():
            edit_json(_head(case), lambda h: change(h["metadata"]["schema"]))

    return mutate


def _head_repeating_block(case: Case) -> None:
    """The head names its block 100,000 times (3.4 MB; each read would read it again)."""
    edit_json(
        _head(case),
        lambda h: h.update(
            blocks=h["blocks"] * 100_000, size=2 * 100_000, total_samples=16 * 10**5
        ),
    )


def _block_outside(case: Case) -> None:
    """The head names a block whose file is a link to another store's block."""
    other = case.outside / "other" / "index" / "blocks"
    target = next(other.glob("*.json"))
    link(_block(case), target)


def _record_claims_other_id(case: Case) -> None:
    """Record 2 lists trajectory 2's data under id 3 (uuid and all): id 3 twice, 2 dropped."""
    edit_json(_record(case, 2), lambda r: r["entries"][0].update(trajectory_id=3))


# name -> (kinds, mutation, expected outcomes of some operations)
MUTATIONS: dict[str, tuple[tuple[str, ...], Callable[[Case], None], dict[str, str]]] = {
    # documents
    "index_not_json": (ALL, lambda c: _index(c).write_bytes(b"{"), {"sample": "CorruptStoreError"}),
    "index_deeply_nested": (
        ("zarr", "pt"),
        lambda c: _index(c).write_bytes(b"[" * 200_000 + b"]" * 200_000),
        {"sample": "CorruptStoreError"},
    ),
    "metadata_deeply_nested": (
        ("zarr",),
        lambda c: _metadata(c).write_bytes(b'{"schema":' + b"{" * 5000 + b"}" * 5000 + b"}"),
        {},
    ),
    "counter_infinity": (
        ("zarr", "pkl"),
        lambda c: replace_text(
            _metadata(c), r'"trajectory_counter": \d+', '"trajectory_counter": Infinity'
        ),
        {"sample": "CorruptStoreError"},
    ),
    "shape_infinity": (
        ("zarr", "pt"),
        lambda c: replace_text(_index(c), r'"shape": \[\s*4', '"shape": [Infinity'),
        {"sample": "CorruptStoreError"},
    ),
    "shape_negative": (
        ALL,
        _entry0(lambda e: e.update(shape=[-4, 2], num_samples=-8)),
        {"sample": "CorruptStoreError"},
    ),
    "id_past_int64": (
        ("zarr", "pkl"),
        lambda c: edit_json(
            _index(c),
            lambda d: d.update(
                trajectory_id_list=[2**63, 1, 2, 3],
                trajectory_index={
                    **d["trajectory_index"],
                    str(2**63): {**d["trajectory_index"]["0"], "trajectory_id": 2**63},
                },
            ),
        ),
        {"sample": "CorruptStoreError"},
    ),
    "id_negative": (
        ("zarr", "pt"),
        lambda c: edit_json(
            _index(c),
            lambda d: d.update(
                trajectory_id_list=[-1, 1, 2, 3],
                trajectory_index={
                    **d["trajectory_index"],
                    "-1": {**d["trajectory_index"]["0"], "trajectory_id": -1},
                },
            ),
        ),
        {"sample": "CorruptStoreError"},
    ),
    "id_list_wrong_type": (
        ("zarr", "pkl"),
        lambda c: edit_json(_index(c), lambda d: d.update(trajectory_id_list="0123")),
        {"sample": "CorruptStoreError"},
    ),
    "duplicate_ids": (
        ALL,
        lambda c: edit_json(_index(c), lambda d: d.update(trajectory_id_list=[0, 1, 1, 2, 3, 3])),
        {
            "sample": "CorruptStoreError",
            "load_plain": "CorruptStoreError",
            "load_auto_save": "CorruptStoreError",
            "export": "CorruptStoreError",
            "repair": "ok",
        },
    ),
    "index_past_size_bound": (("zarr", "pt"), _huge_index, {"sample": "DocumentTooLargeError"}),
    "schema_garbage": (
        ("zarr", "pkl"),
        lambda c: edit_json(_metadata(c), lambda m: m.update(schema={"rewards": 5})),
        {},
    ),
    "schema_escaping_key": (
        ("zarr",),
        lambda c: edit_json(_metadata(c), lambda m: m.update(schema={"../../x": ["float64", [1]]})),
        {},
    ),
    "weights_id_escaping": (
        FILES,
        _entry0(lambda e: e.update(model_weights_id="../outside/x")),
        {"sample": "UnsafePathError"},
    ),
    "weights_id_control_characters": (
        FILES,
        _entry0(lambda e: e.update(model_weights_id="w\n\x1b[31m")),
        {"sample": "UnsafePathError"},
    ),
    # keys (zarr)
    "field_key_escapes": (
        ("zarr", "zarrz", "zarr1"),
        lambda c: rename_key(c, "rewards", "../../../outside/rewards"),
        {"sample": "UnsafePathError"},
    ),
    "field_key_absolute": (
        ("zarr", "zarr1"),
        lambda c: rename_key(c, "rewards", "/etc/rewards"),
        {"sample": "UnsafePathError"},
    ),
    "field_key_empty_segment": (
        ("zarr",),
        lambda c: rename_key(c, "curr_obs/state", "curr_obs//state"),
        {"sample": "UnsafePathError"},
    ),
    "fields_not_a_dict": (
        ("zarr",),
        lambda c: edit_json(group(c) / "zarr.json", lambda d: d["attributes"].update(fields=[1])),
        {"sample": "CorruptStoreError"},
    ),
    # layout descriptions and shard indexes (zarr layout 2)
    "description_huge_inner_chunk": (
        ("zarrz",),
        _layout("rewards", lambda a: a.update(shape=[4, 2, 2**30], inner=[4, 2, 2**30])),
        {"sample": "CorruptStoreError"},
    ),
    "description_negative_shape": (
        ("zarr",),
        _layout("rewards", lambda a: a.update(shape=[4, 2, -1], inner=[4, 2, 1])),
        {"sample": "CorruptStoreError"},
    ),
    "description_structured_dtype": (
        ("zarr",),
        _layout("rewards", lambda a: a.update(dtype="V8")),
        {"sample": "CorruptStoreError"},
    ),
    "description_object_dtype": (
        ("zarrz",),
        _layout("rewards", lambda a: a.update(dtype="|O")),
        {"sample": "CorruptStoreError"},
    ),
    "description_shape_infinity": (
        ("zarr",),
        lambda c: replace_text(
            group(c) / "zarr.json", r'"shard_bytes": ?\d+', '"shard_bytes": Infinity'
        ),
        {"sample": "CorruptStoreError"},
    ),
    "shard_index_past_file": (("zarrz",), _forge_index, {}),
    "shard_truncated": (("zarr", "zarrz"), lambda c: _shard(c).write_bytes(b"\x00" * 7), {}),
    # arrays zarr reads (layout 1 and other codecs)
    "zarr_grid_of_1e10": (
        ("zarr1",),
        _array_document("rewards", lambda d: d.update(shape=[4, 2, 10**10])),
        {"sample": "CorruptStoreError"},
    ),
    "zarr_vlen_dtype": (
        ("zarr1",),
        _array_document("rewards", lambda d: d.update(data_type="string")),
        {},
    ),
    # pickles
    "pkl_numpy_dtype_forgery": (
        ("pkl",),
        _pkl_record(lambda c: numpy_dtype_forgery()),
        {"sample": "UnsafePickleError", "load_auto_save": "UnsafePickleError"},
    ),
    "pkl_numpy_scalar_forgery": (
        ("pkl",),
        _pkl_record(lambda c: numpy_scalar_forgery(), "max_episode_length"),
        {"sample": "UnsafePickleError", "load_auto_save": "UnsafePickleError"},
    ),
    "pkl_bytearray_bomb": (
        ("pkl",),
        _pkl_record(lambda c: Reduce(bytearray, (1_300_000_000,))),
        {"sample": "UnsafePickleError", "load_auto_save": "UnsafePickleError"},
    ),
    "pkl_os_system": (
        ("pkl",),
        _pkl_record(lambda c: Reduce(os.system, (f"touch {c.outside}/pwned",))),
        {"sample": "UnsafePickleError", "load_auto_save": "UnsafePickleError"},
    ),
    "pkl_stride_zero_view": (
        ("pkl",),
        _pkl_record(lambda c: Strided((4, 2, 10**8), (0, 0, 0))),
        {"sample": "CorruptStoreError"},
    ),
    "pkl_deeply_nested": (
        ("pkl",),
        lambda c: first_file(c).write_bytes(deep_pickle(20_000)),
        {"sample": "CorruptStoreError"},
    ),
    "pkl_huge_binbytes8": (
        ("pkl",),
        lambda c: first_file(c).write_bytes(
            huge_length_pickle(b"\x8e", (2**62).to_bytes(8, "little"))
        ),
        {"sample": "CorruptStoreError", "load_plain": "CorruptStoreError"},
    ),
    "pkl_huge_binunicode": (
        ("pkl",),
        lambda c: first_file(c).write_bytes(
            huge_length_pickle(b"X", (2**32 - 1).to_bytes(4, "little"))
        ),
        {"sample": "CorruptStoreError", "load_plain": "CorruptStoreError"},
    ),
    "scalar_deeply_nested": (
        FILES,
        lambda c: deep_scalar(c, "max_episode_length", 50_000),
        {"sample": "CorruptStoreError", "load_plain": "CorruptStoreError"},
    ),
    "pkl_garbage": (("pkl",), lambda c: first_file(c).write_bytes(b"\x80\x05garbage"), {}),
    # .pt files
    "pt_deflate_bomb": (
        ("pt",),
        lambda c: deflate_bomb(c, 256 << 20),
        {"sample": "CorruptStoreError"},
    ),
    "pt_lying_shape": (("pt", "pkl"), _lying_pt_shape, {"sample": "CorruptStoreError"}),
    "pt_stride_zero_view": (("pt",), _stride_zero_pt, {"sample": "CorruptStoreError"}),
    "pt_truncated": (
        ("pt",),
        lambda c: first_file(c).write_bytes(first_file(c).read_bytes()[:300]),
        {},
    ),
    "pt_legacy_format": (
        ("pt",),
        lambda c: torch.save(record_of(c), first_file(c), _use_new_zipfile_serialization=False),
        {"sample": "CorruptStoreError"},
    ),
    # links
    "linked_trajectories_folder": (
        (*ZARR, *LOG),
        _symlinked_folder("trajectories"),
        {"sample": "UnsafePathError", "info": "UnsafePathError", "repair": "ok"},
    ),
    "linked_trajectories_with_orphans": (
        ("zarr",),
        _linked_trajectories_with_orphans,
        {"sample": "UnsafePathError"},
    ),
    "linked_trajectory_group": (
        ("zarr", "zarr1", "zarrlog"),
        _symlinked_folder("trajectories/0"),
        {"sample": "UnsafePathError", "info": "UnsafePathError"},
    ),
    "linked_shard_file": (
        ("zarr",),
        lambda c: link(_shard(c), c.outside / "id_rsa"),
        {"sample": "UnsafePathError"},
    ),
    "linked_chunk_file": (
        ("zarr1",),
        lambda c: link(
            _shard(c),
            c.outside / "other" / "trajectories" / "0" / "rewards" / "c" / "0" / "0" / "0",
        ),
        {"sample": "UnsafePathError"},
    ),
    "linked_array_folder": (
        ("zarr1",),
        _symlinked_folder("trajectories/0/rewards"),
        {"sample": "UnsafePathError"},
    ),
    "linked_trajectory_file": (FILES, _secret_pt, {"load_auto_save": "UnsafePathError"}),
    "linked_metadata": (ALL, _symlinked_file("metadata.json"), {"sample": "UnsafePathError"}),
    "linked_index": (
        ("zarr", "pt"),
        _symlinked_file("trajectory_index.json"),
        {"sample": "UnsafePathError"},
    ),
    "linked_writer_slot": (("zarr", "pkl"), _linked_writer_slot, {"sample": "UnsafePathError"}),
    # FIFOs, sockets: refused before they are opened (a FIFO would block every reader)
    "fifo_shard": (
        ("zarr", "zarrz", "zarrlog"),
        _fifo(_shard),
        {"sample": "UnsafePathError", "load_plain": "UnsafePathError", "export": "UnsafePathError"},
    ),
    "fifo_chunk": (("zarr1",), _fifo(_shard), {"sample": "UnsafePathError"}),
    "fifo_group_document": (
        ("zarr", "zarr1"),
        _fifo(lambda c: group(c) / "zarr.json"),
        {"sample": "UnsafePathError", "info": "UnsafePathError"},
    ),
    "fifo_array_document": (
        ("zarr",),
        _fifo(lambda c: group(c) / "rewards" / "zarr.json"),
        {"info": "UnsafePathError"},
    ),
    "fifo_trajectory_file": (
        FILES,
        _fifo(first_file),
        {"sample": "UnsafePathError", "verify": "ok", "load_auto_save": "UnsafePathError"},
    ),
    "socket_trajectory_file": (("pt",), _socket_file, {"sample": "UnsafePathError"}),
    "fifo_metadata": (("zarr", "pt"), _fifo(_metadata), {"sample": "UnsafePathError"}),
    "fifo_head": (LOG, _fifo(_head), {"sample": "UnsafePathError"}),
    "fifo_record": (LOG, _fifo(_record), {"sample": "UnsafePathError"}),
    # the index log (head, blocks, records) of a store written today
    "head_not_json": (LOG, lambda c: _head(c).write_bytes(b"{"), {"sample": "CorruptStoreError"}),
    "head_deeply_nested": (
        LOG,
        lambda c: _head(c).write_bytes(b"[" * 100_000 + b"]" * 100_000),
        {"sample": "CorruptStoreError"},
    ),
    "head_version_future": (
        LOG,
        lambda c: edit_json(_head(c), lambda h: h.update(version=99)),
        {"sample": "CorruptStoreError"},
    ),
    "head_block_escaping": (
        LOG,
        lambda c: edit_json(_head(c), lambda h: h.update(blocks=[["../../outside/other", 2]])),
        {"sample": "CorruptStoreError"},
    ),
    "head_block_absolute": (
        LOG,
        lambda c: edit_json(
            _head(c), lambda h: h.update(blocks=[[str(c.outside / "other" / "index"), 2]])
        ),
        {"sample": "CorruptStoreError"},
    ),
    "head_block_unicode_digits": (
        LOG,
        lambda c: edit_json(
            _head(c), lambda h: h.update(blocks=[["\u0661" * 12 + "-" + "1" * 12, 2]])
        ),
        {"sample": "CorruptStoreError"},
    ),
    "head_block_repeated": (LOG, _head_repeating_block, {"sample": "CorruptStoreError"}),
    "head_size_past_blocks": (
        LOG,
        lambda c: edit_json(_head(c), lambda h: h.update(size=2**62)),
        {"sample": "CorruptStoreError"},
    ),
    "head_max_rows_huge": (
        LOG,
        lambda c: edit_json(_head(c), lambda h: h.update(max_rows=2**40)),
        {},
    ),
    "head_counts_infinity": (
        LOG,
        lambda c: replace_text(_head(c), r'"total_samples": ?\d+', '"total_samples": Infinity'),
        {"sample": "CorruptStoreError"},
    ),
    "block_count_lies": (
        LOG,
        lambda c: edit_json(_head(c), lambda h: h["blocks"][0].__setitem__(1, 1)),
        {"sample": "CorruptStoreError"},
    ),
    "block_linked_outside": (LOG, _block_outside, {"sample": "UnsafePathError"}),
    "block_missing": (LOG, lambda c: _block(c).unlink(), {"sample": "CorruptStoreError"}),
    "block_entry_shape_nan": (
        LOG,
        lambda c: replace_text(_block(c), r'"shape": ?\[4', '"shape": [NaN'),
        {"sample": "CorruptStoreError"},
    ),
    "block_entry_claims_other_id": (
        LOG,
        _edit_block_entry(lambda e: e.update(trajectory_id=1)),
        {"sample": "CorruptStoreError"},
    ),
    "record_claims_other_id": (LOG, _record_claims_other_id, {"sample": "CorruptStoreError"}),
    "record_not_json": (
        LOG,
        lambda c: _record(c).write_bytes(b"{"),
        {"sample": "CorruptStoreError"},
    ),
    "record_gap": (LOG, lambda c: _record(c, 2).unlink(), {"sample": "CorruptStoreError"}),
    "record_entry_id_past_int64": (
        LOG,
        lambda c: edit_json(_record(c), lambda r: r["entries"][0].update(trajectory_id=2**64)),
        {"sample": "CorruptStoreError"},
    ),
    "record_entry_escaping_weights_id": (
        LOG,
        lambda c: edit_json(
            _record(c), lambda r: r["entries"][0].update(model_weights_id="../../outside")
        ),
        {},
    ),
    "record_time_nan": (
        LOG,
        lambda c: replace_text(_record(c), r'"time": ?[\d.e+]+', '"time": NaN'),
        {"sample": "CorruptStoreError"},
    ),
    "record_named_with_unicode_digits": (
        LOG,
        lambda c: _record(c, 3).rename(_log(c) / "log" / ("\u0663" * 12 + ".json")),
        {},
    ),
    "slot_named_dotdot": (
        ("zarrlog", "pkl"),
        lambda c: _digit_folder(c, "writers", "..1"),
        {"sample": "ok"},
    ),
    # names: digits are ASCII digits
    "slot_named_superscript": (
        ("zarr", "pkl", "zarrlog"),
        lambda c: _digit_folder(c, "writers", "\u00b9"),
        {"sample": "ok"},
    ),
    "trajectory_named_superscript": (
        ("zarr", "zarrlog"),
        lambda c: _digit_folder(c, "trajectories", "\u00b2"),
        {"sample": "ok"},
    ),
    "trajectory_named_arabic_digit": (
        ("zarrlog",),
        lambda c: _digit_folder(c, "trajectories", "\u0665"),
        {"sample": "ok"},
    ),
    # repair rebuilds entries from groups' attributes: checked as every reader checks them
    "lost_log_group_shape_infinity": (
        LOG,
        _lost_log_with(_group0_shape("[Infinity, 2]")),
        {"repair": "ok"},
    ),
    "lost_log_group_shape_nan": (LOG, _lost_log_with(_group0_shape("[NaN, 2]")), {"repair": "ok"}),
    "lost_log_group_deeply_nested": (
        LOG,
        _lost_log_with(_group_attrs("[" * 5000 + "]" * 5000)),
        {"repair": "ok"},
    ),
    "lost_log_group_claims_other_id": (
        LOG,
        _lost_log_with(
            lambda c: edit_json(
                group(c) / "zarr.json", lambda d: d["attributes"].update(trajectory_id=1)
            )
        ),
        {"repair": "ok"},
    ),
    "group_document_deeply_nested": (
        ("zarr", "zarrlog"),
        _group_attrs("[" * 5000 + "]" * 5000),
        {"sample": "CorruptStoreError", "info": "CorruptStoreError"},
    ),
    "array_document_deeply_nested": (
        ("zarr1",),
        _array_document("rewards", lambda d: d["attributes"].update(x="@@")),
        {},
    ),
    # sizes a schema or head declares are checked against the data before allocating
    "schema_huge_trailing": (
        ("zarr", "pt", "zarrlog"),
        _schema(lambda m: m.update(rewards=["float64", [2**30]])),
        {"sample": "CorruptStoreError", "export": "CorruptStoreError"},
    ),
    "schema_lying_trailing": (
        ("zarr", "pkl", "zarrlog"),
        _schema(lambda m: m.update(rewards=["float64", [3]])),
        {"sample": "CorruptStoreError", "export": "CorruptStoreError"},
    ),
    "schema_lying_dtype": (
        ("zarr", "pt"),
        _schema(lambda m: m.update(rewards=["int8", [1]])),
        {"sample": "CorruptStoreError", "export": "CorruptStoreError"},
    ),
    "pkl_huge_episode_length": (
        ("pkl",),
        _pkl_record(lambda c: 1 << 100_000, "max_episode_length"),
        {},
    ),
    "pkl_deep_list": (
        ("pkl",),
        lambda c: first_file(c).write_bytes(
            b"\x80\x02}X\x07\x00\x00\x00rewards" + b"]" * 50_000 + b"a" * 49_999 + b"s."
        ),
        {"sample": "CorruptStoreError"},
    ),
}

# The repros, one store kind each, run in the quick subset (``-m "not slow"``); the
# full run (CI's) has every case.
QUICK = {
    ("pkl_numpy_dtype_forgery", "pkl"),
    ("field_key_escapes", "zarr"),
    ("linked_trajectories_with_orphans", "zarr"),
    ("linked_writer_slot", "zarr"),
    ("linked_trajectory_file", "pt"),
    ("zarr_grid_of_1e10", "zarr1"),
    ("description_huge_inner_chunk", "zarrz"),
    ("pkl_bytearray_bomb", "pkl"),
    ("counter_infinity", "zarr"),
    ("duplicate_ids", "pt"),
    ("pt_lying_shape", "pt"),
    ("index_deeply_nested", "zarr"),
    ("linked_trajectory_group", "zarrlog"),
    ("fifo_shard", "zarr"),
    ("fifo_trajectory_file", "pt"),
    ("lost_log_group_deeply_nested", "zarrlog"),
    ("slot_named_superscript", "zarr"),
    ("schema_huge_trailing", "zarrlog"),
    ("head_block_repeated", "zarrlog"),
    ("pkl_os_system", "pkl"),
    ("pkl_huge_binbytes8", "pkl"),
    ("scalar_deeply_nested", "pkl"),
    ("scalar_deeply_nested", "pt"),
    ("record_claims_other_id", "zarrlog"),
}
CASES = [
    pytest.param(
        name,
        kind,
        id=f"{name}-{kind}",
        marks=() if (name, kind) in QUICK else pytest.mark.slow,
    )
    for name, (kinds, _, _) in MUTATIONS.items()
    for kind in kinds
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_bases(tmp_path_factory.mktemp("bases"))


def _run(
    tmp_path: Path, bases: dict[str, Path], name: str, kind: str, **options: Any
) -> dict[str, str]:
    _, mutate, expected = MUTATIONS[name]
    case = prepare(tmp_path, kind, bases)
    mutate(case)
    before = snapshot(case.outside)
    outcome = run_case(case, **options)
    found = check_case(case, before, outcome)
    for operation, want in expected.items():
        assert found[operation] == want, (operation, found, outcome.reports)
    report = os.environ.get("RBZARR_HOSTILE_REPORT")
    if report:  # a table of every case's outcomes, for people
        with open(report, "a") as handle:
            handle.write(json.dumps({"case": f"{name}-{kind}", **found}) + "\n")
    return found


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_a_hostile_store_gets_named_errors_and_touches_nothing_outside(
    tmp_path: Path, bases: dict[str, Path], name: str, kind: str
) -> None:
    _run(tmp_path, bases, name, kind)


@pytest.mark.parametrize("kind", ALL)
def test_the_valid_stores_pass_every_operation(
    tmp_path: Path, bases: dict[str, Path], kind: str
) -> None:
    case = prepare(tmp_path, kind, bases)
    before = snapshot(case.outside)
    found = check_case(case, before, run_case(case))
    assert found == dict.fromkeys(OPERATIONS, "ok")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("field_key_escapes", "zarr"),
        ("index_not_json", "pt"),
        ("shape_negative", "zarr"),
        ("pkl_numpy_dtype_forgery", "pkl"),
        ("description_structured_dtype", "zarr"),
    ],
)
def test_a_hostile_store_on_an_object_store_gets_named_errors(
    tmp_path: Path, bases: dict[str, Path], name: str, kind: str
) -> None:
    _run(tmp_path, bases, name, kind, url=f"memory://hostile-{name}-{kind}/store")


def test_the_size_bound_of_json_documents_is_raised_by_its_variable(
    tmp_path: Path, bases: dict[str, Path]
) -> None:
    case = prepare(tmp_path, "zarr", bases)
    _huge_index(case)
    before = snapshot(case.outside)
    outcome = run_case(case, env={"RBZARR_MAX_JSON_BYTES": str(128 << 20)})
    assert check_case(case, before, outcome)["sample"] == "ok"


def test_repair_leaves_another_store_linked_in_alone(
    tmp_path: Path, bases: dict[str, Path]
) -> None:
    """The issue's repro: ``trajectories/`` linked to another store's, the index listing 0 and
    1; even with ``follow_links`` a repair deletes nothing through the link."""
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415

    case = prepare(tmp_path, "zarr", bases)
    _linked_trajectories_with_orphans(case)
    before = snapshot(case.outside)
    report = verify_store(str(case.store), repair=True, drop_damaged=True, follow_links=True)
    assert snapshot(case.outside) == before
    assert {p.kind for p in report.problems} == {"unsafe_path"}
    plain = verify_store(str(case.store))
    assert {p.kind for p in plain.problems} == {"unsafe_path"}


def _with_linked_trajectories(case: Case) -> Case:
    """``case`` with its store's ``trajectories`` folder moved outside and linked back."""
    moved = case.outside / "disk2"
    (case.store / "trajectories").rename(moved)
    (case.store / "trajectories").symlink_to(moved)
    return case


def test_follow_links_reads_a_trusted_store_with_linked_folders(
    tmp_path: Path, bases: dict[str, Path]
) -> None:
    from rbzarr import TrajectoryReplayBuffer, UnsafePathError  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    case = _with_linked_trajectories(prepare(tmp_path, "zarr", bases))
    with pytest.raises(UnsafePathError, match="follow_links=True"):
        open_buffer(str(case.store)).sample(8)
    assert (
        open_buffer(str(case.store), seed=0, follow_links=True).sample(8)["rewards"].shape[0] == 8
    )
    buffer = TrajectoryReplayBuffer(seed=0)
    buffer.load_checkpoint(str(case.store), follow_links=True)
    assert buffer.get_stats()["num_trajectories"] == 4
    # The store's root itself may be a link.
    root_link = tmp_path / "root-link"
    root_link.symlink_to(bases["pt"])
    assert open_buffer(str(root_link), seed=0).sample(8)["rewards"].shape[0] == 8


def test_the_cli_names_the_opt_in_and_follows_links_with_it(
    tmp_path: Path, bases: dict[str, Path]
) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    case = _with_linked_trajectories(prepare(tmp_path, "zarr", bases))
    command = [sys.executable, "-c", "from rbzarr.cli.main import main; main()"]
    refused = subprocess.run(
        [*command, "verify", str(case.store)], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1 and "--follow-links" in refused.stdout + refused.stderr
    followed = subprocess.run(
        [*command, "--follow-links", "verify", "--json", str(case.store)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert followed.returncode == 0, followed.stderr
    assert json.loads(followed.stdout)["ok"] is True
    assert SECRET not in followed.stdout.encode()


@pytest.mark.parametrize(
    ("shape", "inner", "shard_bytes", "message"),
    [
        ([4, 2, 2**24], [4, 2, 2**24], 10**6, "a decoded chunk may have"),
        ([2500 * 4, 2, 2**20], [4, 2, 2**20], 40_004 + 10, "times its size"),
        ([4, 2, 1], [4, 2, 1], 8, "cannot hold"),
    ],
)
def test_a_layout_description_cannot_ask_for_more_than_its_shard_holds(
    shape: list[int], inner: list[int], shard_bytes: int, message: str
) -> None:
    """A 40 KB zstd shard may not declare chunks decoding to more than 64 MiB each, nor
    more than 4096 times its bytes in all (past 64 MiB)."""
    from rbzarr import CorruptStoreError  # noqa: PLC0415
    from rbzarr.storage.zarr.spec import ArraySpec  # noqa: PLC0415

    description = {
        "kind": "chunked",
        "shape": shape,
        "dtype": "<f8",
        "inner": inner,
        "shard_bytes": shard_bytes,
    }
    with pytest.raises(CorruptStoreError, match=message):
        ArraySpec.parse("rewards", description, "store/trajectories/0/rewards")


@pytest.mark.parametrize("kind", ["zarr", "pt"])
def test_repeated_ids_are_refused_until_repair_keeps_one_of_each(
    tmp_path: Path, bases: dict[str, Path], kind: str
) -> None:
    from rbzarr import CorruptStoreError, TrajectoryReplayBuffer  # noqa: PLC0415
    from rbzarr.analysis.export import export_store  # noqa: PLC0415
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    case = prepare(tmp_path, kind, bases)
    edit_json(_index(case), lambda d: d.update(trajectory_id_list=[0, 1, 1, 2, 3, 3]))
    before = snapshot(case.store)
    refused = r"trajectory_id_list names trajectories \[1, 3\] more than once.*verify --repair"
    with pytest.raises(CorruptStoreError, match=refused):
        open_buffer(str(case.store), seed=0).sample(8)
    with pytest.raises(CorruptStoreError, match=refused):
        TrajectoryReplayBuffer(seed=0).load_checkpoint(str(case.store))
    with pytest.raises(CorruptStoreError, match=refused):
        export_store(str(case.store), str(case.work / "export"), "pkl")
    assert snapshot(case.store) == before
    assert not (case.work / "export").exists()
    assert {p.kind for p in verify_store(str(case.store)).problems} == {"duplicate_ids"}
    assert verify_store(str(case.store), repair=True).ok
    listed = json.loads(_index(case).read_text())["trajectory_id_list"]
    assert listed == [0, 1, 2, 3]
    assert len(open_buffer(str(case.store), seed=0)) == 4


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("pkl_huge_binbytes8", "pkl", r"not a readable pickle.*declares 4611686018427387904 bytes"),
        ("scalar_deeply_nested", "pkl", r"expected an int max_episode_length.*got \[\[\[\[\[\["),
        ("scalar_deeply_nested", "pt", r"expected an int max_episode_length.*got \[\[\[\[\[\["),
    ],
)
def test_a_hostile_trajectory_file_is_named_in_the_error_and_left_as_it_is(
    tmp_path: Path, bases: dict[str, Path], name: str, kind: str, message: str
) -> None:
    from rbzarr import CorruptStoreError, TrajectoryReplayBuffer  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    case = prepare(tmp_path, kind, bases)
    MUTATIONS[name][1](case)
    before = snapshot(case.store)
    where = re.escape(str(first_file(case)))
    with pytest.raises(CorruptStoreError, match=f"{where}: {message}"):
        open_buffer(str(case.store), seed=0).sample(64)
    with pytest.raises(CorruptStoreError, match=f"{where}: {message}"):
        TrajectoryReplayBuffer(seed=0).load_checkpoint(str(case.store))
    assert snapshot(case.store) == before


def test_verify_reports_a_bad_schema(tmp_path: Path, bases: dict[str, Path]) -> None:
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415

    case = prepare(tmp_path, "pt", bases)
    edit_json(_metadata(case), lambda m: m.update(schema={"rewards": 5}))
    assert {p.kind for p in verify_store(str(case.store)).problems} == {"unreadable_schema"}


@pytest.mark.parametrize("attrs", ["shape_infinity", "deeply_nested", "claims_other_id"])
def test_repair_rebuilds_from_group_attributes_only_what_every_reader_accepts(
    tmp_path: Path, bases: dict[str, Path], attrs: str
) -> None:
    """A log that lost its block: trajectories 0 and 1 are rebuilt from their groups'
    attributes, checked as every reader checks an entry; group 0's tampered ones are not
    listed (the report names it), and the store reads."""
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    case = prepare(tmp_path, "zarrlog", bases)
    _, mutate, _ = MUTATIONS[f"lost_log_group_{attrs}"]
    mutate(case)
    report = verify_store(str(case.store), repair=True)
    assert "damaged_log" in {p.kind for p in report.repaired}
    view = open_buffer(str(case.store), seed=0)
    assert view.ids == [1, 2, 3]
    assert view.sample(8)["rewards"].shape[0] == 8
    assert {p.kind for p in verify_store(str(case.store)).problems} <= {"orphan"}


def test_a_head_naming_one_block_twice_is_refused(tmp_path: Path, bases: dict[str, Path]) -> None:
    from rbzarr import CorruptStoreError  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    case = prepare(tmp_path, "zarrlog", bases)
    edit_json(_head(case), lambda h: h.update(blocks=h["blocks"] * 2, size=4))
    with pytest.raises(CorruptStoreError, match="named twice or out of order"):
        open_buffer(str(case.store))
