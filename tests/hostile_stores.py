"""Hostile stores: valid stores rbzarr wrote, tampered with, opened every way a user would.

:func:`make_bases` writes one valid store per kind (``zarr`` mapped shards, ``zarrz`` zstd
shards, ``zarr1`` arrays zarr reads itself, ``pt``, ``pkl``).  A *mutation* tampers with a
copy of one (documents, entries, keys, shard indexes, pickles, links, sizes), with
``outside/`` (a sentinel folder holding a secret and another store) beside it.
:func:`run_case` forks a child from a preloaded fork server, caps its address space, and
runs every operation (:data:`OPERATIONS`, or those a case names from :data:`EXTRA_OPERATIONS`)
on the store there, one after another; each reports ``ok`` or the error it raised, and the
peak resident memory it added (``peak_growth``: the high-water mark is reset before each).
:func:`check_case` asserts the promises: no signal exit, no timeout, only named errors,
nothing outside the case's folder changed or copied, no sampled or exported row read from
outside, memory growth under a bound.
"""

from __future__ import annotations

import ctypes
import io
import json
import multiprocessing
import os
import pickle
import re
import resource
import shutil
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from conftest import make_trajectory

# What an operation may raise on a hostile store: the named errors.
NAMED = ("CorruptStoreError", "UnsafePathError", "CheckpointNotFoundError")
# In this order, on the same store: the export sees the store as tampered with, and the
# repair comes last (it may drop what is damaged).
OPERATIONS = (
    "sample",
    "load_plain",
    "load_auto_save",
    "info",
    "export",
    "verify",
    "repair",
)
# More of what a user runs: one sampled row, one trajectory read whole, stats, a recode,
# and a plain zarr read of trajectory 0's image (``curr_obs/image``).
EXTRA_OPERATIONS = ("sample_one", "trajectory", "stats", "recode", "plain_zarr")
# Rows of the valid stores encode 0..31; the store planted outside encodes 1000 and up.
VALID_NUMBERS = 32
OUTSIDE_BASE = 1000
SECRET = b"-----BEGIN HOSTILE TEST KEY----- 7f3a9c2e51d04b86 -----END-----"
# Address space a child may add to what it starts with, and resident memory it may add.
ADDRESS_SPACE_BYTES = 3 << 30
RESIDENT_BYTES = 1 << 30
CASE_TIMEOUT_S = 120


def write_store(path: Path, kind: str, base: int = 0) -> None:
    """A valid store of ``kind`` at ``path``: 4 trajectories ``[4, 2]``, rows ``base``..+31.

    ``zarrlog`` is a ``zarr`` store indexed by its log (``index/``: head, blocks, records),
    as rbzarr writes one today; the other zarr kinds are indexed by their two documents (as
    an earlier rbzarr wrote them), so that the cases can tamper with those.  Every zarr kind
    but ``zarrpack`` keeps each trajectory in its own group (``pack_bytes=0``: the cases
    tamper with one trajectory's arrays); ``zarrpack`` is one pack of the four, indexed by
    its log."""
    from zarr.codecs import BloscCodec, ZstdCodec  # noqa: PLC0415

    from rbzarr import TrajectoryReplayBuffer  # noqa: PLC0415

    options: dict[str, Any] = {"pack_bytes": 0}
    fmt = "zarr" if kind in ("zarrlog", "zarrpack") else kind
    if kind == "zarrpack":
        options = {}
    elif kind == "zarrz":
        fmt, options = "zarr", {**options, "codecs": {"default": ZstdCodec(level=1)}}
    elif kind == "zarr1":
        fmt, options = "zarr", {**options, "codecs": {"default": BloscCodec(cname="lz4")}}
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=str(path),
        trajectory_format=fmt,
        layout_options=options if fmt == "zarr" else {},
    )
    buffer.add_trajectories([make_trajectory(4, 2, base + 8 * i) for i in range(4)])
    buffer.flush()
    buffer.close()
    if kind == "zarrlog":
        split_log(path)
    elif kind != "zarrpack":
        shutil.rmtree(path / "index", ignore_errors=True)


def split_log(path: Path) -> None:
    """Rewrite a closed store's log (one block of 4) as a block of 2 and two records (as a
    running writer leaves it): the cases tamper with each kind of file."""
    index = path / "index"
    head = json.loads((index / "head.json").read_bytes())
    ((name, _),) = head["blocks"]
    block = json.loads((index / "blocks" / f"{name}.json").read_bytes())
    (index / "blocks" / f"{name}.json").unlink()
    first = {**block, "entries": block["entries"][:2], "times": block["times"][:2]}
    (index / "blocks" / "000000000001-000000000001.json").write_text(json.dumps(first))
    for seq, position in ((2, 2), (3, 3)):
        record = {
            "seq": seq,
            "time": block["times"][position],
            "counter": position + 1,
            "entries": [block["entries"][position]],
        }
        (index / "log" / f"{seq:012d}.json").write_text(json.dumps(record))
    head.update(compacted_seq=1, blocks=[["000000000001-000000000001", 2]], size=2)
    head.update(total_samples=16, trajectory_counter=2)
    (index / "head.json").write_text(json.dumps(head))


KINDS = ("zarr", "zarrz", "zarr1", "pt", "pkl", "zarrlog")


def make_bases(root: Path) -> dict[str, Path]:
    """One valid store per kind below ``root``, and one (rows from 1000) to plant outside."""
    bases = {}
    for kind in KINDS:
        bases[kind] = root / kind
        write_store(bases[kind], kind)
        bases[f"outside-{kind}"] = root / f"outside-{kind}"
        write_store(bases[f"outside-{kind}"], kind, base=OUTSIDE_BASE)
    return bases


# -- the case's folder: the store, the sentinel folder beside it --------------------------------
@dataclass
class Case:
    """One hostile store: ``root/store`` (tampered), ``root/outside`` (sentinels), ``root/work``."""

    root: Path
    kind: str

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def fmt(self) -> str:
        return "zarr" if self.kind.startswith("zarr") else self.kind


def prepare(root: Path, kind: str, bases: dict[str, Path]) -> Case:
    """Copy the valid ``kind`` store and plant the sentinel folder beside it."""
    case = Case(root, kind)
    shutil.copytree(bases[kind], case.store, symlinks=True)
    case.outside.mkdir()
    (case.outside / "id_rsa").write_bytes(SECRET)
    (case.outside / "victim.txt").write_bytes(b"do not touch")
    shutil.copytree(bases[f"outside-{kind}"], case.outside / "other", symlinks=True)
    case.work.mkdir()
    return case


def snapshot(folder: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every entry below ``folder``: its bytes (or link target) and mtime."""
    found: dict[str, tuple[bytes | str, int]] = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if path.is_symlink():
            found[str(path.relative_to(folder))] = (os.readlink(path), info.st_mtime_ns)
        elif path.is_file():
            found[str(path.relative_to(folder))] = (path.read_bytes(), info.st_mtime_ns)
        else:
            found[str(path.relative_to(folder)) + "/"] = (b"", 0)
    return found


# -- tampering helpers ----------------------------------------------------------------------------
def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    """Rewrite the JSON document at ``path`` as ``change`` returns it (or changes it in place)."""
    document = json.loads(path.read_bytes())
    changed = change(document)
    path.write_text(json.dumps(document if changed is None else changed))


def replace_text(path: Path, pattern: str, new: str) -> None:
    """Substitute ``pattern`` (a regex) in a text file once at least."""
    text = path.read_text()
    changed, count = re.subn(pattern, new, text)
    assert count, (path, pattern)
    path.write_text(changed)


def link(path: Path, target: Path) -> None:
    """Replace ``path`` (file or folder) by a symbolic link to ``target``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def first_file(case: Case) -> Path:
    """Trajectory 0's file (pt, pkl)."""
    return next(case.store.glob(f"trajectory_0_*.{case.fmt}"))


class Reduce:
    """Pickles as ``function(*args)`` (then ``__setstate__(state)`` when a state is given)."""

    def __init__(self, function: Any, args: tuple[Any, ...], state: Any = None) -> None:
        self.function, self.args, self.state = function, args, state

    def __reduce__(self) -> tuple[Any, ...]:
        if self.state is None:
            return (self.function, self.args)
        return (self.function, self.args, self.state)


class Strided:
    """Pickles as a tensor view ``size`` / ``stride`` over a 4-element float64 storage."""

    def __init__(self, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.size, self.stride = size, stride

    def __reduce__(self) -> tuple[Any, ...]:
        storage = torch.TypedStorage(
            wrap_storage=torch.zeros(4, dtype=torch.float64).untyped_storage(),
            dtype=torch.float64,
            _internal=True,
        )
        args = (storage, 0, self.size, self.stride, False, {})
        return (torch._utils._rebuild_tensor_v2, args)


def record_of(case: Case) -> dict[str, Any]:
    """Trajectory 0's dict, loaded with plain pickle / torch (the test trusts its own file)."""
    data = first_file(case).read_bytes()
    if case.fmt == "pkl":
        return pickle.loads(data)
    return torch.load(io.BytesIO(data), weights_only=True)


def write_record(case: Case, record: Any) -> None:
    """Replace trajectory 0's file by ``record``, pickled as its format does."""
    path = first_file(case)
    if case.fmt == "pkl":
        path.write_bytes(pickle.dumps(record))
    else:
        buffer = io.BytesIO()
        torch.save(record, buffer)
        path.write_bytes(buffer.getvalue())


def numpy_dtype_forgery() -> Reduce:
    """The issue's repro: ``_reconstruct`` of an array whose dtype state forges an object field."""
    import numpy as np  # noqa: PLC0415

    reconstruct = np._core.multiarray._reconstruct  # type: ignore[attr-defined]
    dtype = Reduce(
        np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 1)
    )
    return Reduce(reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), dtype, False, b"A" * 8))


def numpy_scalar_forgery() -> Reduce:
    """A ``multiarray.scalar`` of an object dtype from raw bytes (a forged pointer)."""
    import numpy as np  # noqa: PLC0415

    scalar = np._core.multiarray.scalar  # type: ignore[attr-defined]
    return Reduce(scalar, (np.dtype("O"), b"A" * 8))


def deep_pickle(depth: int) -> bytes:
    """A pickle of ``{"rewards": {"k": {"k": ...}}}`` ``depth`` dicts deep (no recursion)."""
    return (
        b"\x80\x02}X\x07\x00\x00\x00rewards"
        + b"}X\x01\x00\x00\x00k" * depth
        + b"}"
        + b"s" * (depth + 1)
        + b"."
    )


def huge_length_pickle(opcode: bytes, length: bytes) -> bytes:
    """A pickle of ``{"rewards": <value>}`` whose counted value (``opcode``, e.g. BINBYTES8)
    declares ``length`` bytes and holds two."""
    return b"\x80\x02}X\x07\x00\x00\x00rewards" + opcode + length + b"xxs."


DEEP_MARKER = "deeply-nested-value"


def deep_scalar(case: Case, field: str, depth: int) -> None:
    """Rewrite trajectory 0's file (pt or pkl) with ``field`` a list nested ``depth`` deep,
    written as opcodes (pickling one would recurse)."""
    record = record_of(case)
    record[field] = DEEP_MARKER
    marker = b"X" + len(DEEP_MARKER).to_bytes(4, "little") + DEEP_MARKER.encode()
    deep = b"]" * depth + b"a" * (depth - 1)
    if case.fmt == "pkl":
        data = pickle.dumps(record, protocol=2)  # no frames: their lengths would change
        first_file(case).write_bytes(data.replace(marker, deep, 1))
        return
    buffer = io.BytesIO()
    torch.save(record, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source:
        records = [(info.filename, source.read(info)) for info in source.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for name, data in records:
            if name.endswith("/data.pkl"):
                data = data.replace(marker, deep, 1)  # noqa: PLW2901
            target.writestr(name, data, zipfile.ZIP_STORED)
    first_file(case).write_bytes(out.getvalue())


def deflate_bomb(case: Case, inflated: int) -> None:
    """Rewrite trajectory 0's ``.pt`` with its first storage record deflated, declaring
    ``inflated`` zero bytes (torch would inflate it)."""
    path = first_file(case)
    with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as source:
        records = [(info.filename, source.read(info)) for info in source.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for name, data in records:
            if not name.endswith("/data/0"):
                target.writestr(name, data, zipfile.ZIP_STORED)
                continue
            record = zipfile.ZipInfo(name)
            record.compress_type = zipfile.ZIP_DEFLATED
            # deflated: the declared size is what it inflates to
            with target.open(record, "w", force_zip64=True) as handle:
                block = bytes(1 << 20)
                for _ in range(inflated >> 20):
                    handle.write(block)
    path.write_bytes(out.getvalue())


def group(case: Case, tid: int = 0) -> Path:
    """A zarr trajectory group's folder."""
    return case.store / "trajectories" / str(tid)


def rename_key(case: Case, old: str, new: str) -> None:
    """Rename field ``old`` to ``new`` in every group's attributes and in the schema."""
    for tid in range(4):

        def change(document: Any) -> None:
            attrs = document["attributes"]
            attrs["fields"] = {new if k == old else k: v for k, v in attrs["fields"].items()}
            layout = attrs.get("rbzarr_layout")
            if layout is not None:
                arrays = layout["arrays"]
                layout["arrays"] = {new if k == old else k: v for k, v in arrays.items()}

        edit_json(group(case, tid) / "zarr.json", change)
    edit_json(
        case.store / "metadata.json",
        lambda m: m.update(schema={new if k == old else k: v for k, v in m["schema"].items()}),
    )


# -- the child: every operation on one store ------------------------------------------------------
def _rows_ok(batch: dict[str, Any]) -> bool:
    """Whether every sampled row is one of the valid store's (none read from outside)."""
    from rbzarr.trajectory import tree  # noqa: PLC0415

    for value in tree.flatten(batch).values():
        if (
            isinstance(value, torch.Tensor)
            and value.numel()
            and float(value.to(torch.float64).abs().max()) >= OUTSIDE_BASE
        ):
            return False
    return True


def _operation(name: str, url: str, work: Path, fmt: str) -> dict[str, Any]:
    """Run one operation; what it returned worth checking."""
    from rbzarr import TrajectoryReplayBuffer  # noqa: PLC0415
    from rbzarr.analysis.export import export_store  # noqa: PLC0415
    from rbzarr.analysis.listing import StoreListing  # noqa: PLC0415
    from rbzarr.analysis.summary import describe_store  # noqa: PLC0415
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    if name == "sample":
        return {"rows_ok": _rows_ok(open_buffer(url, seed=0).sample(64))}
    if name == "load_plain":
        buffer = TrajectoryReplayBuffer(seed=0)
        buffer.load_checkpoint(url)
        return {"rows_ok": _rows_ok(buffer.sample(64))}
    if name == "load_auto_save":
        target = work / "auto_save"
        # A cache of one: the load reads only the last trajectory to warm it, and copies
        # the others into the user's store (each must be checked on its way).
        buffer = TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=str(target), trajectory_format=fmt, seed=0, cache_size=1
        )
        try:
            buffer.load_checkpoint(url)
            buffer.flush()
            return {"rows_ok": _rows_ok(buffer.sample(64))}
        finally:
            buffer.close()
    if name == "info":
        json.dumps(describe_store(StoreListing(url)), default=str)
        return {}
    if name in ("verify", "repair"):
        report = verify_store(url, repair=name == "repair", drop_damaged=name == "repair")
        return {
            "problems": sorted({p.kind for p in report.problems}),
            "messages": [f"{p.path}: {p.message}"[:2000] for p in report.problems],
        }
    if name == "export":
        target = work / "export"
        export_store(url, str(target), "pt" if fmt == "zarr" else "zarr")
        view = open_buffer(str(target), seed=0)
        return {"rows_ok": len(view) == 0 or _rows_ok(view.sample(64))}
    return _extra_operation(name, url, work)


def _extra_operation(name: str, url: str, work: Path) -> dict[str, Any]:
    """Run one of :data:`EXTRA_OPERATIONS`."""
    from rbzarr.analysis.recode import recode_store  # noqa: PLC0415
    from rbzarr.analysis.stats import compute_stats  # noqa: PLC0415
    from rbzarr.analysis.view import open_buffer  # noqa: PLC0415

    if name == "sample_one":
        return {"rows_ok": _rows_ok(open_buffer(url, seed=0).sample(1))}
    if name == "trajectory":
        open_buffer(url).trajectory(0)
        return {}
    if name == "stats":
        compute_stats(url)
        return {}
    if name == "recode":
        recode_store(url, str(work / "recoded"), {"default": "raw"})
        return {}
    if name == "plain_zarr":
        import zarr  # noqa: PLC0415

        zarr.open_group(f"{url}/trajectories/0", mode="r")["curr_obs/image"][...]
        return {}
    raise ValueError(name)


def _clean(store: Path) -> bool | str:
    """Whether the user's auto-save store verifies clean after a load (refused or not):
    nothing unchecked was copied or listed into it."""
    from rbzarr.analysis.verify import verify_store  # noqa: PLC0415

    if not (store / "metadata.json").exists():
        files = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
        return True if not files else f"files and no store: {files}"
    try:
        report = verify_store(str(store))
    except Exception as exc:
        return f"verify raised {exc!r}"
    return True if report.ok else repr(report.problems)[:2000]


def _resident() -> int:
    """Peak resident bytes of this process."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def proc_status(field: str) -> int:
    """One ``/proc/self/status`` field in bytes (``VmSize``, ``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def reset_peak() -> int:
    """Reset this process's resident high-water mark (``VmHWM``); the resident bytes now.

    Where the kernel refuses the reset, the mark keeps the process's peak so far: growth
    measured from here is then an upper bound (a spike still shows).
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass
    return proc_status("VmRSS")


def _cap(address_space: int) -> None:
    """Let this process's address space grow by ``address_space`` bytes at most, its
    threads sharing one malloc arena (glibc reserves 64 MiB of address space per arena, up
    to 8 per core: a cap would depend on the machine's cores)."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, 1)
    size = proc_status("VmSize")
    resource.setrlimit(resource.RLIMIT_AS, (size + address_space, resource.RLIM_INFINITY))


_M_ARENA_MAX = -8


def _child(
    url: str,
    work: str,
    fmt: str,
    env: dict[str, str],
    results: Any,
    operations: tuple[str, ...],
    address_space: int,
) -> None:
    """The forked child: cap the address space, run every operation, report each."""
    os.environ.update(env)
    _cap(address_space)
    start = _resident()
    if url.startswith("memory://"):
        import fsspec  # noqa: PLC0415

        fsspec.filesystem("memory").put(
            work + "/../store", url.removeprefix("memory://"), recursive=True
        )
    for name in operations:
        os.makedirs(work, exist_ok=True)
        before = reset_peak()
        try:
            found = {"outcome": "ok", **_operation(name, url, Path(work), fmt)}
        except Exception as exc:
            names = [cls.__name__ for cls in type(exc).__mro__]
            found = {
                "outcome": "named" if any(n in NAMED for n in names) else "unclear",
                "error": type(exc).__name__,
                "message": str(exc)[:2000],
                "trace": "" if any(n in NAMED for n in names) else traceback.format_exc()[-3000:],
            }
        found["operation"] = name
        found["resident_growth"] = _resident() - start
        found["peak_growth"] = proc_status("VmHWM") - before
        if name == "load_auto_save":
            found["auto_save_clean"] = _clean(Path(work) / "auto_save")
        results.put(found)


_CONTEXT: Any = None


def _context() -> Any:
    """The fork server context, its server preloaded with torch and rbzarr."""
    global _CONTEXT  # noqa: PLW0603 (one fork server per test process)
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(
            [
                "hostile_stores",
                "rbzarr.analysis.view",
                "rbzarr.analysis.verify",
                "rbzarr.analysis.export",
                "rbzarr.analysis.summary",
                "rbzarr.analysis.stats",
                "rbzarr.analysis.recode",
                "imagecodecs.numcodecs",
                "zarr",
                "fsspec",
            ]
        )
    return _CONTEXT


@dataclass
class Outcome:
    """What one case's child did: its exit code and each operation's report."""

    exitcode: int | None
    reports: list[dict[str, Any]]


def _capped_child(
    function: Callable[..., Any], args: tuple[Any, ...], address_space: int, results: Any
) -> None:
    """The forked child of :func:`run_capped`."""
    _cap(address_space)
    results.put(function(*args))


def run_capped(function: Callable[..., Any], args: tuple[Any, ...], address_space: int) -> Any:
    """``function(*args)`` (a module-level function returning something picklable) in a
    child process whose address space may grow by ``address_space`` bytes; a child that
    dies or hangs fails the test."""
    context = _context()
    results = context.Queue()
    child = context.Process(target=_capped_child, args=(function, args, address_space, results))
    child.start()
    try:
        found = results.get(timeout=CASE_TIMEOUT_S)
    except Exception:
        child.kill()
        child.join()
        raise AssertionError(f"the child reported nothing (exit {child.exitcode})") from None
    child.join(timeout=5)
    if child.exitcode is None:
        child.kill()
        child.join()
    assert child.exitcode == 0, f"child exit {child.exitcode}"
    return found


def run_case(
    case: Case,
    url: str | None = None,
    env: dict[str, str] | None = None,
    operations: tuple[str, ...] = OPERATIONS,
    address_space: int = ADDRESS_SPACE_BYTES,
) -> Outcome:
    """Run ``operations`` on ``case``'s store (or ``url``) in a child process whose address
    space may grow by ``address_space`` bytes."""
    context = _context()
    results = context.Queue()
    child = context.Process(
        target=_child,
        args=(
            url or str(case.store),
            str(case.work),
            case.fmt,
            env or {},
            results,
            operations,
            address_space,
        ),
    )
    child.start()
    reports: list[dict[str, Any]] = []
    while len(reports) < len(operations):
        try:
            reports.append(results.get(timeout=CASE_TIMEOUT_S))
        except Exception:
            break
    child.join(timeout=5)
    if child.exitcode is None:
        child.kill()
        child.join()
    return Outcome(child.exitcode, reports)


def check_case(
    case: Case,
    before: dict[str, Any],
    outcome: Outcome,
    operations: tuple[str, ...] = OPERATIONS,
) -> dict[str, str]:
    """Assert the promises; return each operation's outcome (``ok`` or the error's name)."""
    done = [report["operation"] for report in outcome.reports]
    assert outcome.exitcode == 0, f"child exit {outcome.exitcode} after {done}"
    assert done == list(operations), f"operations done: {done}"
    for report in outcome.reports:
        assert report["outcome"] != "unclear", report
        assert report.get("rows_ok", True), f"{report['operation']} read rows from outside"
        assert report["resident_growth"] < RESIDENT_BYTES, report
        assert report.get("auto_save_clean", True) is True, report
    assert snapshot(case.outside) == before, "the sentinel folder changed"
    for path in case.root.rglob("*"):
        if path.is_file() and not path.is_symlink() and case.outside not in path.parents:
            assert SECRET not in path.read_bytes(), f"the secret was copied to {path}"
    for report in outcome.reports:
        assert SECRET.decode() not in report.get("message", "")
    return {report["operation"]: report.get("error", "ok") for report in outcome.reports}
