"""Layout 2 (one Zarr v3 shard per array): zarr compatibility, xarray, versions, damage, fork."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import multiprocessing
import os
import re
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

import fsspec
import google_crc32c
import numpy as np
import pytest
import torch
import xarray
import zarr
from conftest import (
    assert_rows_consistent,
    assert_same_trajectory,
    index_entry,
    make_trajectory,
    store_reader,
)
from faults import HANG_SECONDS, OUTAGE_CALLS, InjectedFault
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import ZstdCodec

from benchmarks.accounting import StoreGeometry
from benchmarks.page_cache import evict
from benchmarks.workloads import image_trajectory
from rbzarr import (
    CorruptStoreError,
    StorageUnavailableError,
    Trajectory,
    TrajectoryReplayBuffer,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer
from rbzarr.storage.io.local_store import RegularFileStore
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import open as open_module
from rbzarr.storage.zarr import shard_index
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.storage.zarr.local import decode_whole
from rbzarr.storage.zarr.rows import reset_row_elements
from rbzarr.storage.zarr.spec import ArraySpec
from rbzarr.trajectory.dtypes import to_numpy
from rbzarr.trajectory.model import raw_time_rows

pytestmark = pytest.mark.timeout(120)

KEY = "curr_obs/state"
IMAGE = "curr_obs/image"
ZSTD = {"curr_obs/state": ZstdCodec(level=1, checksum=True)}


LAYOUT1 = Path(__file__).parent / "data" / "layout1" / "buffer"


def build(path: Path, codecs: dict[str, Any] | None = None) -> Path:
    """Three trajectories, each in its own group (no pack: test_packs reads packs)."""
    options: dict[str, Any] = {"pack_bytes": 0, **({"codecs": codecs} if codecs else {})}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, layout_options=options
    ) as buffer:
        buffer.add_trajectories([make_trajectory(4, 3, 100 * i, epochs=2) for i in range(3)])
    return path


def shard(store: Path, tid: int = 1, key: str = KEY) -> Path:
    return store / "trajectories" / str(tid) / key / "c.0.0.0"


def description(store: Path, tid: int = 1, key: str = KEY) -> dict[str, Any]:
    group = json.loads((store / "trajectories" / str(tid) / "zarr.json").read_bytes())
    return group["attributes"]["rbzarr_layout"]["arrays"][key]


def sample_from_storage(store: Path) -> dict[str, Any]:
    with store_reader(store) as buffer:
        return buffer.sample(64)


# -- zarr and xarray read what rbzarr writes --------------------------------------------
def test_plain_zarr_reads_every_array(tmp_path: Path) -> None:
    store = build(tmp_path / "s", codecs=ZSTD)
    root = zarr.open_group(str(store), mode="r")
    for tid in range(3):
        want = make_trajectory(4, 3, 100 * tid, epochs=2).tensors()
        group = root[f"trajectories/{tid}"]
        assert isinstance(group, zarr.Group)
        for key, value in want.items():
            array = group[key]
            assert isinstance(array, zarr.Array)
            assert array.shards == tuple(value.shape)  # one shard: the whole array
            np.testing.assert_array_equal(array[...], to_numpy(value))
    metadata = json.loads((store / "metadata.json").read_bytes())
    assert metadata["layout_version"] == 2
    assert root.attrs["rbzarr"]["metadata"]["layout_version"] == 2


@pytest.mark.parametrize("level", [None, 1])
def test_shards_match_zarrs_own_writer(tmp_path: Path, level: int | None) -> None:
    data = np.arange(6 * 3 * 4, dtype="<f4").reshape(6, 3, 4)
    inner = (6, 3, 4) if level is None else (6, 1, 4)  # small rows: k steps of one env
    codecs = {} if level is None else {"default": ZstdCodec(level=level)}
    layout = ZarrLayout(Location.from_url(tmp_path / "ours"), codecs=codecs)
    trajectory = make_trajectory(6, 3, 0)
    trajectory.curr_obs["state"] = torch.from_numpy(data)
    entry = _entry(trajectory)
    layout.write(entry, trajectory)
    ours = shard(tmp_path / "ours", 0).read_bytes()

    theirs_array = zarr.create_array(
        zarr.storage.LocalStore(tmp_path / "theirs"),
        name="a",
        shape=data.shape,
        dtype=data.dtype,
        chunks=inner,
        shards=data.shape,
        compressors=None if level is None else ZstdCodec(level=level),
    )
    theirs_array[...] = data
    theirs = (tmp_path / "theirs" / "a" / "c" / "0" / "0" / "0").read_bytes()
    assert len(ours) == len(theirs)
    chunks = int(np.prod([s // i for s, i in zip(data.shape, inner, strict=True)]))
    ours_index, theirs_index = (_index(blob, chunks) for blob in (ours, theirs))
    if level is None:
        assert ours == theirs  # one inner chunk: byte for byte
    # zarr may store inner chunks in another order; each one's bytes are the same.
    for (a, n), (b, m) in zip(ours_index, theirs_index, strict=True):
        assert ours[a : a + n] == theirs[b : b + m]
    # And rbzarr's reader reads zarr's shard.
    spec = ArraySpec.parse(KEY, {**description(tmp_path / "ours", 0)}, "t")
    np.testing.assert_array_equal(decode_whole(spec, theirs, "theirs"), data)


def _index(blob: bytes, chunks: int) -> list[tuple[int, int]]:
    raw = blob[-shard_index.index_size(chunks) :]
    assert google_crc32c.value(raw[:-4]) == int.from_bytes(raw[-4:], "little")
    values = struct.unpack(f"<{2 * chunks}Q", raw[:-4])
    return list(zip(values[::2], values[1::2], strict=True))


def _entry(trajectory: Any, tid: int = 0) -> dict[str, Any]:
    T, B = trajectory.rewards.shape[:2]
    return index_entry(tid, T, B, 1)


def test_xarray_opens_a_trajectory(tmp_path: Path) -> None:
    store = build(tmp_path / "s")
    # the group's document consolidates its arrays' documents, which xarray reads
    group = xarray.open_zarr(str(store / "trajectories" / "1"))
    assert group["rewards"].dims == ("time", "env", "rewards_dim2")
    assert group["dones"].dims == ("time_with_resets", "env", "dones_dim2")
    assert dict(group.sizes)["time"] == 4 and dict(group.sizes)["time_with_resets"] == 6
    want = make_trajectory(4, 3, 100, epochs=2)
    np.testing.assert_array_equal(group["prev_logprobs"].values, want.prev_logprobs.numpy())

    dataset = open_buffer(store).xarray_dataset(1)
    assert dataset["curr_obs/state"].dims == ("time", "env", "curr_obs_state_dim2")
    np.testing.assert_array_equal(dataset["curr_obs/state"].values, want.curr_obs["state"])
    np.testing.assert_array_equal(dataset["dones"].values, want.dones.numpy())


# -- versions ---------------------------------------------------------------------------
def test_v1_store_opens_loads_samples_and_appends_in_v2(tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(LAYOUT1, store)  # as build() wrote it with the last layout-1 writer
    assert "layout_version" not in json.loads((store / "metadata.json").read_bytes())
    assert not (store / "trajectories" / "0" / "rewards" / "c" / "0" / "0").is_file()
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, enable_cache=False, cache_size=0
    )
    buffer.load_checkpoint(store)
    buffer.add_trajectories([make_trajectory(4, 3, 300, epochs=2)])
    buffer.flush()
    assert description(store, 3, "rewards")["kind"] == "mapped"  # appended in layout 2
    numbers = assert_rows_consistent(buffer.sample(200))
    assert set(numbers.tolist()) <= {100 * i + r for i in range(4) for r in range(12)}
    assert len({int(n) // 100 for n in numbers}) == 4  # rows of both versions
    buffer.save_checkpoint(tmp_path / "ckpt", copy=True)
    buffer.close()
    # The checkpoint is written in layout 2, the v1 trajectories converted on the way.
    for tid in range(4):
        assert description(tmp_path / "ckpt", tid, "rewards")["kind"] == "mapped"
        got = open_buffer(tmp_path / "ckpt").trajectory(tid)
        assert_same_trajectory(got, make_trajectory(4, 3, 100 * tid, epochs=2))
    info = json.loads((tmp_path / "ckpt" / "metadata.json").read_bytes())
    assert info["layout_version"] == 2


def test_rewritten_trajectory_is_not_read_through_a_stale_map(tmp_path: Path) -> None:
    layout = ZarrLayout(Location.from_url(tmp_path))
    first, second = make_trajectory(4, 3, 0), make_trajectory(4, 3, 500)
    entry = _entry(first)
    layout.write(entry, first)
    rows = np.array([0, 7, 11])
    assert layout.read_rows(entry, rows, ["prev_logprobs"])["prev_logprobs"].tolist() == [0, 7, 11]
    layout.write(entry, second)  # same id and uuid
    got = layout.read_rows(entry, rows, ["prev_logprobs"])["prev_logprobs"]
    assert got.tolist() == [500, 507, 511]


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (``mincore`` of a fresh shared mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
    size, pages = path.stat().st_size, -(-path.stat().st_size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
        libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(v & 1 for v in vector)


@pytest.mark.skipif(sys.platform != "linux", reason="page-cache residency is Linux's mincore")
def test_a_cold_small_row_reads_its_own_page_not_its_whole_shard(tmp_path: Path) -> None:
    # Without MADV_RANDOM a fault on a mapped shard reads the kernel's read-around window
    # (read_ahead_kb, up to MiBs), so one 24-byte row read its whole 96 KiB shard.
    layout = ZarrLayout(Location.from_url(tmp_path))
    trajectory = make_trajectory(64, 64, 0)
    entry = _entry(trajectory)
    layout.write(entry, trajectory)
    path = shard(tmp_path, tid=0)
    rows = np.array([2049])
    assert layout.read_rows(entry, rows, [KEY])[KEY][0, 0].item() == 2049  # maps it
    evict([tmp_path], whole_cache=False)
    if _resident_pages(path) != 0:
        pytest.skip("this filesystem keeps the shard cached after posix_fadvise(DONTNEED)")
    got = layout.read_rows(entry, np.array([2050]), [KEY])[KEY]
    assert got[0].tolist() == [2050.0] * 3
    resident, pages = _resident_pages(path), -(-path.stat().st_size // mmap.PAGESIZE)
    assert resident <= 2, f"one row read {resident} of its shard's {pages} pages"


def _cold_frames(tmp_path: Path) -> tuple[int, int]:
    """Read four neighbouring QOI frames of a shard cold; its pages then resident, and the
    pages those frames' inner chunks span."""
    layout = ZarrLayout(Location.from_url(tmp_path))
    trajectory = image_trajectory(3, T=32, B=16)
    entry = _entry(trajectory)
    layout.write(entry, trajectory)
    layout.read_rows(entry, np.array([0]), [IMAGE])  # opens the shard: its index is read
    evict([tmp_path], whole_cache=False)
    path = shard(tmp_path, tid=0, key=IMAGE).with_name("c.0.0.0.0.0")
    if _resident_pages(path) != 0:
        pytest.skip("this filesystem keeps the shard cached after posix_fadvise(DONTNEED)")
    rows = np.arange(5 * 16, 5 * 16 + 4)  # step 5, envs 0-3: inner chunks side by side
    got = layout.read_rows(entry, rows, [IMAGE])[IMAGE]
    assert np.array_equal(got, trajectory.curr_obs["image"][5, :4].numpy())
    geometry = StoreGeometry(fsspec.filesystem("file"), str(tmp_path), [IMAGE], T=32, B=16)
    return _resident_pages(path), geometry.needed({0: rows.tolist()}).page_bytes // mmap.PAGESIZE


@pytest.mark.skipif(sys.platform != "linux", reason="page-cache residency is Linux's mincore")
def test_cold_compressed_chunks_read_their_own_pages_not_a_read_ahead(tmp_path: Path) -> None:
    # Without POSIX_FADV_RANDOM the kernel saw neighbouring chunks as a stream and read
    # ahead: 41 pages for these 9.
    resident, needed = _cold_frames(tmp_path)
    assert resident <= needed, f"4 frames on {needed} pages read {resident}"


def test_reads_go_on_where_the_random_read_advice_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(fd: int, offset: int, length: int, advice: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")  # as a filesystem that refuses it

    monkeypatch.setattr(os, "posix_fadvise", refused, raising=False)
    layout = ZarrLayout(Location.from_url(tmp_path))
    trajectory = image_trajectory(3, T=4, B=2)
    entry = _entry(trajectory)
    layout.write(entry, trajectory)
    got = layout.read_rows(entry, np.array([1, 6]), [IMAGE])[IMAGE]
    assert np.array_equal(got, trajectory.curr_obs["image"].flatten(0, 1)[[1, 6]].numpy())


def _sample_in_child(store: str, queue: Any) -> None:
    try:
        generator = torch.Generator().manual_seed(5)
        queue.put(assert_rows_consistent(_SHARED[0].sample(50, generator=generator)).tolist())
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


_SHARED: list[TrajectoryReplayBuffer] = []


def test_handles_survive_fork(tmp_path: Path) -> None:
    store = build(tmp_path / "s")
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, enable_cache=False, cache_size=0
    )
    buffer.load_checkpoint(store)
    buffer.sample(64)  # opens and caches every shard in the parent
    _SHARED[:] = [buffer]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_sample_in_child, args=(str(store), queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    want = assert_rows_consistent(buffer.sample(50, generator=torch.Generator().manual_seed(5)))
    assert got == want.tolist()
    buffer.close()
    _SHARED.clear()


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 12), B=st.integers(1, 5), epochs=st.integers(1, 4), data=st.data())
def test_reset_row_elements_match_raw_time_rows(T: int, B: int, epochs: int, data: Any) -> None:
    T = T * epochs
    flat = np.array(data.draw(st.lists(st.integers(0, T * B - 1), max_size=20)), dtype=np.int64)
    raw = raw_time_rows(torch.from_numpy(flat // B), T, T + epochs).numpy()
    np.testing.assert_array_equal(reset_row_elements(flat, T, B, epochs), raw * B + flat % B)


# -- opening a local store: no round through zarr's event loop ----------------------------
def test_a_local_view_opens_its_trajectories_in_the_calling_thread(tmp_path: Path, monkeypatch):
    # A round to zarr's loop (and its reading threads) per trajectory costs more than the
    # reads themselves, and much more on a busy host: local layout-2 groups make none.
    store = build(tmp_path / "s")
    rounds: list[object] = []
    real_sync = open_module.sync

    def counted(coroutine: Any, nbytes: int = 0) -> Any:
        rounds.append(coroutine)
        return real_sync(coroutine, nbytes)

    monkeypatch.setattr(open_module, "sync", counted)
    view = open_buffer(store, seed=1)
    assert_rows_consistent(view.sample(64))
    assert view.trajectory(2) is not None
    assert rounds == []


@pytest.mark.parametrize("kind", ["fail", "outage", "hang"])
def test_a_failing_group_document_read_is_a_storage_error_and_heals(
    tmp_path: Path, monkeypatch, kind: str
) -> None:
    # The local group documents are read with the store's get_sync: its faults, as at the seam.
    store = build(tmp_path / "s")
    failing = {"fail": 1, "outage": OUTAGE_CALLS, "hang": 0}[kind]
    reads: list[str] = []
    real_get = RegularFileStore.get_sync

    def flaky(self: RegularFileStore, key: str, **kwargs: Any) -> Any:
        if key.startswith("trajectories/") and key.endswith("/zarr.json"):
            reads.append(key)
            if kind == "hang" and len(reads) == 1:
                time.sleep(HANG_SECONDS)
            if len(reads) <= failing:
                raise InjectedFault(f"get_sync({key})")
        return real_get(self, key, **kwargs)

    monkeypatch.setattr(RegularFileStore, "get_sync", flaky)
    view = open_buffer(store, seed=1)
    for _ in range(failing):  # each sample meets one failed read, then gives up
        with pytest.raises(StorageUnavailableError, match=re.escape(str(store))):
            view.sample(64)
    assert_rows_consistent(view.sample(64))  # storage healed: nothing was cached broken
    assert len(reads) == failing + 3


# -- bad input: one test per kind of damage ---------------------------------------------
def _rewrite_index(blob: bytes, transform: Any) -> bytes:
    """A one-chunk shard whose index entry is ``transform(offsets, nbytes)``, crc intact."""
    size = shard_index.index_size(1)
    index = np.frombuffer(blob[-size:-4], "<u8")
    offsets, nbytes = transform(index[0::2].copy(), index[1::2].copy())
    return blob[:-size] + shard_index.encode_index(offsets, nbytes)


def _empty(offsets: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return offsets * 0 + shard_index.EMPTY, nbytes * 0 + shard_index.EMPTY


# Damage to a shard's bytes, and the words its error names.
DAMAGE = {
    "truncated": (lambda b: b[:-30], "truncated"),
    "wrong_size": (lambda b: b + b"\0" * 16, "larger than written"),
    "damaged_index": (lambda b: b[:-6] + b"\xff\xff" + b[-4:], "crc32c"),
    "index_out_of_range": (lambda b: _rewrite_index(b, lambda o, n: (o, n + 4096)), "points past"),
    "index_marks_empty": (lambda b: _rewrite_index(b, _empty), "missing"),
}


def undecodable(blob: bytes, described: dict[str, Any]) -> bytes:
    """A zstd shard whose second inner chunk keeps its frame magic, then garbage."""
    chunks = int(np.prod(described["shape"]) // np.prod(described["inner"]))
    offset, nbytes = _index(blob, chunks)[1]
    return blob[: offset + 4] + b"\x55" * (nbytes - 4) + blob[offset + nbytes :]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_shard_is_a_named_error(tmp_path: Path, damage: str) -> None:
    store = build(tmp_path / "s")
    transform, message = DAMAGE[damage]
    shard(store).write_bytes(transform(shard(store).read_bytes()))
    with pytest.raises(CorruptStoreError, match=message) as info:
        sample_from_storage(store)
    assert "trajectories/1/curr_obs/state" in str(info.value)
    with pytest.raises(CorruptStoreError, match="trajectories/1/curr_obs/state"):
        open_buffer(store).trajectory(1)


def test_inner_chunk_that_does_not_decode_is_a_named_error(tmp_path: Path) -> None:
    store = build(tmp_path / "s", codecs=ZSTD)
    shard(store).write_bytes(undecodable(shard(store).read_bytes(), description(store)))
    with pytest.raises(CorruptStoreError, match="does not decode") as info:
        sample_from_storage(store)  # 64 draws of 36 rows: the damaged chunk's 4 are hit
    assert "trajectories/1/curr_obs/state" in str(info.value)
    with pytest.raises(CorruptStoreError, match="trajectories/1/curr_obs/state"):
        open_buffer(store).trajectory(1)


def test_damaged_layout_description_is_a_named_error(tmp_path: Path) -> None:
    store = build(tmp_path / "s")
    group = store / "trajectories" / "1" / "zarr.json"
    document = json.loads(group.read_bytes())
    document["attributes"]["rbzarr_layout"]["arrays"][KEY]["inner"] = [3, 1, 1]
    group.write_text(json.dumps(document))
    with pytest.raises(CorruptStoreError, match="trajectories/1"):
        sample_from_storage(store)


# -- arrays of fill values store no shard ------------------------------------------------
def fill_trajectory() -> Any:
    """Two arrays with data (``actions`` holds -0.0: not the fill value's bytes), three whose
    every element is the fill value."""
    T, B = 4, 2
    return Trajectory(
        rewards=torch.arange(T * B, dtype=torch.float32).reshape(T, B, 1),
        actions=torch.full((T, B, 2), -0.0),
        dones=torch.zeros(T, B, 1, dtype=torch.bool),
        prev_logprobs=torch.zeros(T, B, 7),
        forward_inputs={"tokens": torch.zeros(T, B, 2, dtype=torch.bfloat16)},
    )


FILLED = ("dones", "prev_logprobs", "forward_inputs/tokens")


def bits(value: torch.Tensor) -> torch.Tensor:
    """The bytes of ``value`` (``-0.0`` and ``0.0`` differ)."""
    return value.contiguous().view(torch.uint8)


def test_an_array_of_fill_values_stores_no_shard_and_every_reader_reads_it(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    want = fill_trajectory()
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([want])
    group = store / "trajectories" / "0"
    assert sorted(p.name for p in group.iterdir()) == ["actions", "rewards", "zarr.json"]
    for key in FILLED:
        assert description(store, 0, key)["fill"] is True
    plain = zarr.open_group(str(store), mode="r")["trajectories/0"]
    assert isinstance(plain, zarr.Group)
    for key, value in want.tensors().items():  # plain zarr: a missing chunk is its fill
        got = torch.from_numpy(np.asarray(plain[key][...]))
        assert torch.equal(bits(got), bits(to_numpy_tensor(value))), key
    with store_reader(store) as reader:
        got = reader.trajectory(0).tensors()
        for key, value in want.tensors().items():
            assert got[key].dtype == value.dtype and torch.equal(bits(got[key]), bits(value)), key
        batch = reader.sample(16)
        assert not batch["dones"].any() and not batch["prev_logprobs"].any()
        assert torch.equal(bits(batch["actions"]), bits(torch.full(batch["actions"].shape, -0.0)))
    assert verify_store(str(store)).ok


def test_a_fill_array_described_without_its_copy_is_a_named_error(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store) as buffer:
        buffer.add_trajectories([fill_trajectory()])
    path = store / "trajectories" / "0" / "zarr.json"
    document = json.loads(path.read_bytes())
    del document["attributes"]["rbzarr_layout"]["arrays"]["dones"]["inline"]
    path.write_text(json.dumps(document))
    with pytest.raises(CorruptStoreError, match="trajectories/0/dones: described as all fill"):
        open_buffer(store).trajectory(0)


def to_numpy_tensor(value: torch.Tensor) -> torch.Tensor:
    """``value`` as zarr holds it (bfloat16 as its uint16 bits)."""
    return torch.from_numpy(np.ascontiguousarray(to_numpy(value)))
