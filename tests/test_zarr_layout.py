"""ZarrLayout: exact round trips, row reads touching only needed chunks, documents, errors.

Layout-1 stores are only read: ``tests/data/layout1/`` holds two written by the last
layout-1 writer.  Shard-level tests of layout 2 are in ``test_shards.py``.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
import zarr
from conftest import make_trajectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, ZstdCodec

from rbzarr.errors import CorruptStoreError
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.io.location import Location
from rbzarr.storage.layout import TrajectoryLayout
from rbzarr.storage.registry import layout_class
from rbzarr.storage.rlinf.documents import Documents
from rbzarr.storage.row_groups import RowGroups
from rbzarr.storage.zarr import layout as zarr_layout
from rbzarr.storage.zarr import open as zarr_open
from rbzarr.storage.zarr import publish
from rbzarr.storage.zarr.chunking import chunk_shape
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.dtypes import dtype_from_name, dtype_name, from_numpy, to_numpy
from rbzarr.trajectory.flat_view import flatten_trajectory
from rbzarr.trajectory.model import Trajectory, validate

T, B, E = 6, 3, 2


@pytest.fixture(params=["local", "memory"])
def location(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Location]:
    if request.param == "local":
        yield Location.from_url(tmp_path / "store")
        return
    name = f"rbzarr-test-{uuid.uuid4().hex}"
    yield Location.from_url(f"memory://{name}")
    _clear_memory(name)


def _clear_memory(name: str) -> None:
    fs = fsspec.filesystem("memory")
    for key in [key for key in fs.store if key.lstrip("/").startswith(name)]:
        del fs.store[key]
    fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not d.lstrip("/").startswith(name)]


def _entry(tid: int, traj: Trajectory) -> dict[str, Any]:
    spec = validate(traj)
    return {
        "uuid": str(uuid.uuid4()),
        "trajectory_id": tid,
        "num_samples": spec.num_samples,
        "shape": list(spec.shape),
        "max_episode_length": traj.max_episode_length,
        "model_weights_id": traj.model_weights_id,
    }


def _every_dtype(seed: int = 0) -> Trajectory:
    gen = torch.Generator().manual_seed(seed)
    return Trajectory(
        max_episode_length=9,
        model_weights_id="weights-3",
        actions=torch.randn(T, B, 4, generator=gen).to(torch.bfloat16),
        intervene_flags=torch.rand(T, B, generator=gen) < 0.5,
        rewards=torch.randn(T, B, generator=gen),
        dones=torch.rand(T + E, B, generator=gen) < 0.5,
        terminations=torch.rand(T + E, B, 1, generator=gen) < 0.5,
        prev_logprobs=torch.randn(T, B, 2, generator=gen).to(torch.float16),
        prev_values=torch.randn(T, B, 1, generator=gen).double(),
        versions=torch.arange(T, dtype=torch.int64),  # a 1-D field
        curr_obs={
            "image": torch.randint(0, 256, (T, B, 3, 5, 4), dtype=torch.uint8, generator=gen),
            "empty": torch.zeros(T, B, 0),
        },
        next_obs={"state": torch.randint(-9, 9, (T, B, 7), dtype=torch.int64, generator=gen)},
        forward_inputs={"policy": {"tokens": torch.randint(0, 99, (T, B, 3), generator=gen)}},
    )


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert got[key].shape == value.shape, key
        assert torch.equal(_bits(got[key]), _bits(value)), key


def test_registered() -> None:
    assert layout_class("zarr") is ZarrLayout
    # Reads only the chunks of the sampled rows: its own read_rows, not the whole-read default.
    assert ZarrLayout.read_rows is not TrajectoryLayout.read_rows


def test_round_trip_every_dtype(location: Location) -> None:
    traj = _every_dtype()
    entry = _entry(3, traj)
    layout = ZarrLayout(location)
    layout.write(entry, traj)

    back = layout.read(entry)
    _assert_same(back.tensors(), traj.tensors())
    assert (back.max_episode_length, back.model_weights_id) == (9, "weights-3")
    _assert_same(layout.read(entry, ["rewards"]).tensors(), {"rewards": traj.rewards})

    # A plain zarr user sees the same data, the torch dtype beside it, and the entry.
    group = zarr.open_group(location.url, mode="r")
    node = group["trajectories/3"]
    assert isinstance(node, zarr.Group)
    attrs = node.attrs.asdict()
    assert {k: attrs[k] for k in entry} == entry
    for key, value in traj.tensors().items():
        array = node[key]
        assert isinstance(array, zarr.Array)
        assert array.attrs["torch_dtype"] == dtype_name(value.dtype)
        np.testing.assert_array_equal(array[...], to_numpy(value))
        assert array.dtype == to_numpy(value).dtype
    assert node["actions"].dtype == np.uint16
    assert node["dones"].shape == (T + E, B)
    arrays = {
        name for name, member in node.members(max_depth=None) if isinstance(member, zarr.Array)
    }
    assert arrays == set(traj.tensors())
    assert "trajectories" in dict(group.members())
    assert layout.list_ids() == [3]


def test_documents_and_the_root_head(location: Location) -> None:
    layout = ZarrLayout(location)
    traj = _every_dtype()
    entry = _entry(0, traj)
    layout.write(entry, traj)
    documents = Documents(
        metadata={"format_version": 1, "trajectory_format": "zarr", "size": 18},
        trajectory_index={"trajectory_index": {"0": entry}, "trajectory_id_list": [0]},
    )
    written = layout.write_documents(documents)
    layout.write_documents(documents)  # idempotent rewrite

    root = zarr.open_group(location.url, mode="r")
    stored = root.attrs["rbzarr"]
    # The root's attributes are a small head: the metadata and the size, never the index.
    assert stored == {
        "metadata": json.loads(location.read_bytes("metadata.json")),
        "head": {"size": 1, "index": "log"},
    }
    codecs = stored["metadata"]["codecs"]
    assert stored["metadata"] == {**documents.metadata, "layout_version": 2, "codecs": codecs}
    # Every key written in a shard is recorded with its codec (none image-like here: all
    # raw); the empty array zarr writes itself is not.
    assert set(codecs) == set(layout.fields(entry)) - {"curr_obs/empty"}
    assert set(codecs.values()) == {"raw"}
    assert StoreIndex.assumed(layout.location).read() == written
    assert "consolidated_metadata" not in json.loads(location.read_bytes("zarr.json"))


def test_the_root_head_keeps_other_attributes_and_leaves_a_replaced_root_alone(
    location: Location,
) -> None:
    layout = ZarrLayout(location)
    documents = Documents(
        metadata={"trajectory_format": "zarr"},
        trajectory_index={"trajectory_index": {}, "trajectory_id_list": []},
    )
    layout.write_documents(documents)  # a missing root is created
    assert zarr.open_group(location.url, mode="r").attrs["rbzarr"]["head"]["size"] == 0
    # Attributes zarr wrote, NaN included, stay as they were.
    zarr.open_group(location.url, mode="a").attrs.update({"note": "mine", "gain": float("nan")})
    layout.write_documents(documents)
    attrs = zarr.open_group(location.url, mode="r").attrs.asdict()
    assert attrs["note"] == "mine" and np.isnan(attrs["gain"])
    assert attrs["rbzarr"]["metadata"]["layout_version"] == 2
    for replaced in (b'{"zarr_format": 3, "node_type": "array"}', b"[1, 2]", b"\x8fgarbage"):
        location.write_bytes(replaced, "zarr.json")
        location.delete("metadata.json")
        with pytest.warns(UserWarning, match=r"zarr\.json.*left as it is"):
            layout.write_documents(documents)
        assert location.read_bytes("zarr.json") == replaced
        assert json.loads(location.read_bytes("metadata.json"))["trajectory_format"] == "zarr"


def test_a_first_publication_never_replaces_a_root_another_writer_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's first trajectory creates the root group if missing; a root another writer
    made (its close writing the head) between that check and the write is kept."""
    location = Location.from_url(tmp_path / "store")
    documents = Documents(
        metadata={"trajectory_format": "zarr"},
        trajectory_index={"trajectory_index": {}, "trajectory_id_list": []},
    )
    ZarrLayout(location).write_documents(documents)  # the other writer's close
    head = json.loads(location.read_bytes("zarr.json"))["attributes"]["rbzarr"]
    # This writer checked before that root existed.
    monkeypatch.setattr(publish.os.path, "exists", lambda path: False)
    traj = make_trajectory(4, 2, 0)  # written by the local publisher (no array through zarr)
    ZarrLayout(location).write(_entry(0, traj), traj)
    assert json.loads(location.read_bytes("zarr.json"))["attributes"]["rbzarr"] == head


def test_read_rows_matches_flat_view(location: Location) -> None:
    traj = _every_dtype(seed=1)
    spec = validate(traj)
    flat = flatten_trajectory(traj, spec)
    layout = ZarrLayout(location, chunk_bytes=64)
    entry = _entry(1, traj)
    layout.write(entry, traj)
    rows = torch.tensor([17, 0, 5, 5, 12, 3, 17], dtype=torch.int64)
    got = _rows(layout, entry, rows, list(spec.schema))
    _assert_same(got, {key: flat[key].index_select(0, rows) for key in spec.schema})
    _assert_same_arrays(layout, entry, traj, rows)
    empty = _rows(layout, entry, torch.empty(0, dtype=torch.int64), ["curr_obs/image"])
    assert empty["curr_obs/image"].shape == (0, 3, 5, 4)
    assert empty["curr_obs/image"].dtype == torch.uint8
    with pytest.raises(IndexError, match=r"\[0, 18\)"):
        _rows(layout, entry, torch.tensor([18]), ["rewards"])
    with pytest.raises(ValueError, match="versions"):
        _rows(layout, entry, rows, ["versions"])
    with pytest.raises(CorruptStoreError, match="nope"):
        _rows(layout, entry, rows, ["nope"])


@pytest.mark.parametrize(
    ("key", "out", "message"),
    [
        ("rewards", torch.zeros(2, dtype=torch.float64), r"holds float32 rows of \[\], .*float64"),
        (
            "curr_obs/image",
            torch.zeros(2, 3, 5, 5, dtype=torch.uint8),
            r"holds uint8 rows of \[3, 5, 4\], .*\[3, 5, 5\]",
        ),
    ],
)
def test_rows_unlike_the_batchs_are_refused_before_any_is_read(
    tmp_path: Path, key: str, out: torch.Tensor, message: str
) -> None:
    layout = ZarrLayout(Location.from_url(str(tmp_path / "s")))
    entry = _entry(1, _every_dtype())
    layout.write(entry, _every_dtype())
    groups = RowGroups.of([(entry, torch.tensor([0, 1]), torch.tensor([0, 1]))])
    with pytest.raises(CorruptStoreError, match=rf"trajectories/1: field {key!r} {message}"):
        layout.read_groups_into(groups, [key], {key: out})
    assert not out.any()  # nothing was read into the batch


def _rows(
    layout: ZarrLayout, entry: dict[str, Any], rows: torch.Tensor, keys: list[str]
) -> dict[str, torch.Tensor]:
    """``read_rows`` (numpy bits) as tensors of the dtypes the layout names."""
    got = layout.read_rows(entry, rows.numpy(), keys)
    names = layout.fields(entry)
    return {key: from_numpy(value, dtype_from_name(names[key])) for key, value in got.items()}


def _assert_same_arrays(
    layout: ZarrLayout, entry: dict[str, Any], traj: Trajectory, rows: torch.Tensor
) -> None:
    """The numpy reads (no torch) hold the bits of the tensor reads, and the dtypes named."""
    fields = traj.tensors()
    assert layout.fields(entry) == {k: dtype_name(v.dtype) for k, v in fields.items()}
    whole = layout.read_arrays(entry)
    assert list(whole) == list(fields)
    for key, value in fields.items():
        assert whole[key].dtype == to_numpy(value).dtype, key
        np.testing.assert_array_equal(whole[key], to_numpy(value), err_msg=key)
    schema = list(validate(traj).schema)
    flat = flatten_trajectory(traj, validate(traj))
    some = layout.read_rows(entry, rows.numpy(), schema)
    for key in schema:
        np.testing.assert_array_equal(some[key], to_numpy(flat[key][rows]), err_msg=key)


_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16]
_DTYPES += [torch.float32, torch.float64]


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 120, shape, generator=gen).to(dtype)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Trajectory, torch.Tensor, int]:
    epochs = draw(st.integers(1, 3))
    steps = epochs * draw(st.integers(1, 4))
    envs = draw(st.integers(1, 4))
    trailing = st.lists(st.integers(0, 3), max_size=2).map(tuple)
    fields: dict[str, Any] = {"rewards": _tensor((steps, envs), torch.float32, 0)}
    if draw(st.booleans()):
        fields["dones"] = _tensor((steps + epochs, envs), torch.bool, 1)
    for i, name in enumerate(draw(st.sets(st.sampled_from(["actions", "prev_values"])))):
        dtype = draw(st.sampled_from(_DTYPES))
        fields[name] = _tensor((steps, envs, *draw(trailing)), dtype, 2 + i)
    obs = {
        f"k{i}": _tensor((steps, envs, *draw(trailing)), draw(st.sampled_from(_DTYPES)), 9 + i)
        for i in range(draw(st.integers(0, 2)))
    }
    rows = draw(st.lists(st.integers(0, steps * envs - 1), max_size=12))
    chunk_bytes = draw(st.sampled_from([1, 16, 100, 2**20]))
    traj = Trajectory(**fields, curr_obs=obs)
    return traj, torch.tensor(rows, dtype=torch.int64), chunk_bytes


# zstd and no compressor are read and written directly; blosc goes through zarr's pipeline.
# Layout 2 also reads and writes zstd inner chunks itself (one frame per inner chunk).
_CODECS = st.sampled_from(
    [{}, {"default": None}, {"default": BloscCodec(cname="lz4")}, {"default": ZstdCodec()}]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases(), codecs=_CODECS)
def test_property_round_trip(
    tmp_path_factory: pytest.TempPathFactory, case: Any, codecs: dict[str, Any]
) -> None:
    traj, rows, chunk_bytes = case
    layout = ZarrLayout(
        Location.from_url(tmp_path_factory.mktemp("prop")),
        chunk_bytes=chunk_bytes,
        codecs=codecs,
    )
    entry = _entry(0, traj)
    layout.write(entry, traj)
    _assert_same(layout.read(entry).tensors(), traj.tensors())
    spec = validate(traj)
    flat = flatten_trajectory(traj, spec)
    got = _rows(layout, entry, rows, list(spec.schema))
    _assert_same(got, {key: flat[key].index_select(0, rows) for key in spec.schema})
    _assert_same_arrays(layout, entry, traj, rows)


def test_missing_and_incomplete_trajectories(location: Location) -> None:
    layout = ZarrLayout(location)
    traj = _every_dtype()
    # An index entry whose data is gone is damage: the trajectory, its path and the repair.
    with pytest.raises(CorruptStoreError, match=r"trajectory 42: .*trajectories/42") as info:
        layout.read(_entry(42, traj))
    assert f"`rbzarr verify --repair --drop-damaged {location.url}`" in str(info.value)
    with pytest.raises(CorruptStoreError, match=r"trajectory 42: .*is missing"):
        _rows(layout, _entry(42, traj), torch.tensor([0]), ["rewards"])

    # Arrays written, group attributes (the commit marker) not: an unfinished write.
    zarr.create_array(location.zarr_store(), name="trajectories/7/rewards", data=np.zeros((2, 2)))
    with pytest.raises(CorruptStoreError, match=r"trajectory 7: .*incomplete"):
        layout.read(_entry(7, traj))


def test_list_delete_and_replace(location: Location) -> None:
    layout = ZarrLayout(location)
    first, second = _every_dtype(seed=3), _every_dtype(seed=4)
    for tid in (10, 2):
        layout.write(_entry(tid, first), first)
    zarr.create_group(location.zarr_store(), path="trajectories/scratch")
    zarr.create_group(location.zarr_store(), path="trajectories/007")
    assert layout.list_ids() == [2, 10]

    entry = _entry(2, first)
    _rows(layout, entry, torch.tensor([1]), ["rewards"])  # caches handles of id 2
    layout.write(entry, second)  # same id and uuid: replaced, cache dropped
    _assert_same(layout.read(entry).tensors(), second.tensors())
    got = _rows(layout, entry, torch.tensor([1]), ["rewards"])
    assert torch.equal(got["rewards"], second.rewards.reshape(-1)[1:2])

    layout.delete(entry)
    layout.delete(entry)  # missing is not an error
    assert layout.list_ids() == [10]
    with pytest.raises(CorruptStoreError, match="is missing"):
        layout.read(entry)
    assert ZarrLayout(location.child("nothing-here")).list_ids() == []


def test_codecs_per_key(tmp_path: Any) -> None:
    location = Location.from_url(tmp_path)
    layout = ZarrLayout(
        location, codecs={"curr_obs/image": None, "default": BloscCodec(cname="lz4")}
    )
    traj = _every_dtype()
    entry = _entry(0, traj)
    layout.write(entry, traj)
    group = zarr.open_group(location.url, mode="r")["trajectories/0"]
    assert isinstance(group, zarr.Group)
    image, rewards = group["curr_obs/image"], group["rewards"]
    assert isinstance(image, zarr.Array) and isinstance(rewards, zarr.Array)
    assert image.compressors == ()
    assert isinstance(rewards.compressors[0], BloscCodec)
    _assert_same(layout.read(entry).tensors(), traj.tensors())
    with pytest.raises(ValueError, match="chunk_bytes"):
        ZarrLayout(location, chunk_bytes=0)


def test_chunk_shape_policy() -> None:
    mib = 2**20
    # One image step for 16 envs is 338,688 bytes: 6 steps fit in 2 MiB, 4 divide T=32.
    assert chunk_shape((32, 16, 3, 84, 84), 1, 2 * mib) == (4, 16, 3, 84, 84)
    assert chunk_shape((31, 16, 3, 84, 84), 1, 2 * mib) == (6, 16, 3, 84, 84)  # 6 chunks
    assert chunk_shape((25, 16, 3, 84, 84), 1, 2 * mib) == (5, 16, 3, 84, 84)
    assert chunk_shape((13, 16, 3, 84, 84), 1, 2 * mib) == (5, 16, 3, 84, 84)  # 5+5+3
    assert chunk_shape((32, 16), 4, 2 * mib) == (32, 16)  # small: one chunk
    assert chunk_shape((4, 16, 3, 1024, 1024), 1, 2 * mib) == (1, 16, 3, 1024, 1024)
    assert chunk_shape((5, 2, 0), 4, 2 * mib) == (5, 2, 1)
    assert chunk_shape((0,), 4, 2 * mib) == (1,)
    assert chunk_shape((), 8, 2 * mib) == ()
    with pytest.raises(ValueError, match="chunk_bytes"):
        chunk_shape((3, 2), 4, 0)


def test_reads_while_another_thread_writes(tmp_path: Any) -> None:
    layout = ZarrLayout(Location.from_url(tmp_path), chunk_bytes=128, handle_cache_size=2)
    trajs = [_every_dtype(seed=s) for s in range(6)]
    entries = [_entry(i, t) for i, t in enumerate(trajs)]
    layout.write(entries[0], trajs[0])
    flat = flatten_trajectory(trajs[0], validate(trajs[0]))
    keys = list(flat)
    rows = torch.tensor([0, 17, 9, 4])
    errors: list[BaseException] = []

    def write_rest() -> None:
        try:
            for entry, traj in zip(entries[1:], trajs[1:], strict=True):
                layout.write(entry, traj)
        except BaseException as exc:  # re-raised below in the test thread
            errors.append(exc)

    writer = threading.Thread(target=write_rest)
    writer.start()
    for _ in range(20):
        _assert_same(
            _rows(layout, entries[0], rows, keys),
            {k: flat[k].index_select(0, rows) for k in keys},
        )
    writer.join()
    assert errors == []
    assert layout.list_ids() == list(range(6))
    for entry, traj in zip(entries, trajs, strict=True):
        _assert_same(layout.read(entry).tensors(), traj.tensors())


@pytest.mark.parametrize("explicit", [False, True])
def test_the_handles_kept_follow_the_sample_window(tmp_path: Any, monkeypatch, explicit) -> None:
    """Without ``handle_cache_size`` a window larger than the default stays open: a second
    pass over its trajectories opens none (with an explicit size, those past it reopen)."""
    monkeypatch.setattr(zarr_layout, "DEFAULT_HANDLES", 2)
    monkeypatch.setattr(zarr_layout, "_HANDLE_SLACK", 0)
    opened: list[int] = []
    real_open = zarr_open.TrajectoryOpener._open_new

    def open_new(opener: Any, entries: Any) -> Any:
        opened.extend(int(e["trajectory_id"]) for e in entries)
        return real_open(opener, entries)

    monkeypatch.setattr(zarr_open.TrajectoryOpener, "_open_new", open_new)
    options = {"handle_cache_size": 2} if explicit else {}
    layout = ZarrLayout(Location.from_url(tmp_path), **options)
    trajs = [_every_dtype(seed=s) for s in range(6)]
    entries = [_entry(i, t) for i, t in enumerate(trajs)]
    for entry, traj in zip(entries, trajs, strict=True):
        layout.write(entry, traj)
    keys = list(flatten_trajectory(trajs[0], validate(trajs[0])))
    layout.sample_window(len(entries))
    for _ in range(2):
        for entry in entries:
            layout.read_rows(entry, np.array([0, 3]), keys)
    assert sorted(opened) == sorted(list(range(6)) * (2 if explicit else 1))


LAYOUT1 = Path(__file__).parent / "data" / "layout1"


def _layout1_copy(tmp_path: Path, name: str) -> tuple[ZarrLayout, dict[str, Any]]:
    """A copy of a layout-1 fixture store (written by the last layout-1 writer)."""
    root = tmp_path / name
    shutil.copytree(LAYOUT1 / name, root)
    layout = ZarrLayout(Location.from_url(root))
    return layout, StoreIndex.assumed(layout.location).read().trajectory_index["trajectory_index"][
        "0"
    ]


def test_layout1_store_reads_whole_and_by_rows(tmp_path: Path) -> None:
    layout, entry = _layout1_copy(tmp_path, "every_dtype")
    traj = _every_dtype(seed=7)
    _assert_same(layout.read(entry).tensors(), traj.tensors())
    spec = validate(traj)
    flat = flatten_trajectory(traj, spec)
    rows = torch.tensor([17, 0, 5, 5, 12, 3, 17, 9], dtype=torch.int64)
    got = _rows(layout, entry, rows, list(spec.schema))
    _assert_same(got, {key: flat[key].index_select(0, rows) for key in spec.schema})
    assert "layout_version" not in StoreIndex.assumed(layout.location).read().metadata


def test_layout1_trajectory_copied_into_zarr_is_layout2(tmp_path: Path) -> None:
    layout, entry = _layout1_copy(tmp_path, "every_dtype")
    target = ZarrLayout(Location.from_url(tmp_path / "target"))
    layout.copy_to(target, entry)
    group = json.loads((tmp_path / "target" / "trajectories" / "0" / "zarr.json").read_bytes())
    assert group["attributes"]["rbzarr_layout"]["version"] == 2
    _assert_same(target.read(entry).tensors(), _every_dtype(seed=7).tensors())


def test_damaged_layout1_chunk_raises(tmp_path: Path) -> None:
    layout, entry = _layout1_copy(tmp_path, "every_dtype")
    traj = _every_dtype(seed=7)
    chunk = tmp_path / "every_dtype/trajectories/0/curr_obs/image/c/2/0/0/0/0"  # steps 4-5
    chunk.write_bytes(chunk.read_bytes()[:-8])
    message = r"trajectories/0/curr_obs/image"
    with pytest.raises(CorruptStoreError, match=message):
        _rows(layout, entry, torch.tensor([14]), ["curr_obs/image"])
    with pytest.raises(CorruptStoreError, match=message):
        layout.read(entry)
    # Rows in intact chunks still read.
    got = _rows(layout, entry, torch.tensor([1]), ["curr_obs/image"])
    assert torch.equal(got["curr_obs/image"], traj.curr_obs["image"][0, 1:2])


def test_missing_layout1_chunk_is_damage_not_zeros(tmp_path: Path) -> None:
    layout, entry = _layout1_copy(tmp_path, "every_dtype")
    (tmp_path / "every_dtype/trajectories/0/curr_obs/image/c/2/0/0/0/0").unlink()
    with pytest.raises(CorruptStoreError, match=r"curr_obs/image: 1 of its \d+ chunks are missing"):
        _rows(layout, entry, torch.tensor([1]), ["curr_obs/image"])
    with pytest.raises(CorruptStoreError, match="chunks are missing"):
        layout.read(entry)


def test_missing_chunk_of_an_array_zarr_reads_is_damage(tmp_path: Path) -> None:
    location = Location.from_url(tmp_path / "store")
    layout = ZarrLayout(location, codecs={"default": BloscCodec(cname="lz4")})
    traj = _every_dtype()
    entry = _entry(0, traj)
    layout.write(entry, traj)
    chunks = (tmp_path / "store/trajectories/0/rewards/c").rglob("*")
    chunk = next(path for path in chunks if path.is_file())
    chunk.unlink()
    fresh = ZarrLayout(location)
    with pytest.raises(CorruptStoreError, match="rewards: 1 of its"):
        _rows(fresh, entry, torch.tensor([0]), ["rewards"])
    with pytest.raises(CorruptStoreError, match="chunks are missing"):
        fresh.read(entry)


def _small_fields(seed: int = 0) -> Trajectory:
    gen = torch.Generator().manual_seed(seed)
    return Trajectory(
        rewards=torch.randn(T, B, 1, generator=gen),
        dones=torch.rand(T + E, B, 1, generator=gen) < 0.5,
        curr_obs={"arm": {"joints": torch.randn(T, B, 7, generator=gen)}},
        versions=torch.arange(T, dtype=torch.int64),
    )


@pytest.mark.parametrize("durable", [False, True])
def test_local_files_of_a_trajectory(tmp_path: Path, durable: bool) -> None:
    """Locally a trajectory is its group document (every subgroup's and array's document
    consolidated in it) and, per array, a folder holding one shard ``c.0...`` (no folder per
    dimension, no document): a file per array and one more.  Plain zarr reads it, and a
    durable location writes the same files."""
    location = Location.from_url(tmp_path / "store").with_durable(durable)
    assert location.child("trajectories").durable is durable
    layout = ZarrLayout(location)
    traj = _small_fields()
    entry = _entry(4, traj)
    layout.write(entry, _small_fields(seed=1))  # replaced by the next write
    layout.write(entry, traj)
    group = tmp_path / "store" / "trajectories" / "4"
    found = {str(p.relative_to(group)) for p in group.rglob("*")}
    shards = {key: ".".join(["c", *"0" * value.dim()]) for key, value in traj.tensors().items()}
    assert found == {
        "zarr.json",
        "curr_obs",
        "curr_obs/arm",
        *shards,
        *(f"{key}/{name}" for key, name in shards.items()),
    }
    assert sum(p.is_file() for p in group.rglob("*")) == len(shards) + 1
    node = zarr.open_group(location.url, mode="r")["trajectories/4"]
    assert isinstance(node, zarr.Group)
    for key, value in traj.tensors().items():
        array = node[key]
        assert isinstance(array, zarr.Array)
        np.testing.assert_array_equal(array[...], to_numpy(value))
    _assert_same(layout.read(entry).tensors(), traj.tensors())
    rows = _rows(layout, entry, torch.tensor([0, 5]), ["curr_obs/arm/joints"])
    flat = traj.curr_obs["arm"]["joints"].reshape(T * B, 7)
    assert torch.equal(rows["curr_obs/arm/joints"], flat[[0, 5]])
    assert layout.audit().foreign_files("trajectories/4") == []


def test_durable_writes_sync_the_data_before_the_commit_marker(
    tmp_path: Path, sync_events: list[tuple[str, str]]
) -> None:
    """Every file and folder of a durable local write is synced before the group's
    attributes are renamed into place, and they and their folder after."""
    events = sync_events
    for durable, name in ((False, "plain"), (True, "durable")):
        events.clear()
        layout = ZarrLayout(Location.from_url(tmp_path / name).with_durable(durable))
        traj = _small_fields()
        layout.write(_entry(0, traj), traj)
        if not durable:
            # The two parents created (never over another writer's), the marker renamed.
            assert [kind for kind, _ in events] == ["link", "link", "replace"]
            continue
        group = tmp_path / name / "trajectories" / "0"
        marker = str(group / "zarr.json")
        commit = events.index(("replace", marker))
        synced_before = {path for kind, path in events[:commit] if kind == "fsync"}
        written = {str(p) for p in group.rglob("*")} - {marker}
        assert written | {str(group), str(group.parent)} <= synced_before
        after = [path for kind, path in events[commit:] if kind == "fsync"]
        assert after == [str(group)]  # the marker itself was synced before its rename
        assert any(path.startswith(marker) for path in synced_before)


def test_local_groups_with_nested_chunk_keys_still_read(tmp_path: Path) -> None:
    """Groups whose shards are ``c/0/0...`` (local stores written before ``c.0.0...``, or
    through a given store) read and sample as before, beside new ones."""
    location = Location.from_url(tmp_path / "store")
    older = ZarrLayout(location, store=location.zarr_store())  # writes through zarr's store
    traj = _small_fields()
    older.write(_entry(0, traj), traj)
    group = tmp_path / "store" / "trajectories" / "0"
    assert (group / "rewards" / "c" / "0" / "0" / "0").is_file()
    document = json.loads((group / "zarr.json").read_bytes())
    for description in document["attributes"]["rbzarr_layout"]["arrays"].values():
        assert description.pop("separator") == "/"  # as written before descriptions named it
    (group / "zarr.json").write_text(json.dumps(document))
    layout = ZarrLayout(location)
    layout.write(_entry(1, traj), traj)
    for tid in (0, 1):
        _assert_same(layout.read(_entry(tid, traj)).tensors(), traj.tensors())
        rows = _rows(layout, _entry(tid, traj), torch.tensor([1, 4]), ["rewards"])
        assert torch.equal(rows["rewards"], traj.rewards.reshape(T * B, 1)[[1, 4]])
    assert layout.audit().foreign_files("trajectories/0") == []
