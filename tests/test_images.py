"""Image codecs per key and next_obs stored once (issue 38): specs, the store's memory of its
codecs, bit-identical sampling, plain zarr reads, export, and damaged frames."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.accounting import CountingByteSource
from rbzarr import TrajectoryReplayBuffer
from rbzarr.errors import CodecConflictError, CodecUnavailableError, CorruptStoreError
from rbzarr.interop.convert import export_dataset
from rbzarr.storage.registry import open_store
from rbzarr.storage.zarr import next_obs
from rbzarr.storage.zarr.codecs import (
    choose_codec,
    image_layout,
    parse_codec,
    parse_codecs,
    psnr,
    stored_codec,
)
from rbzarr.storage.zarr.describe import LAYOUT_ATTR
from rbzarr.trajectory.model import Trajectory


def _frames(g: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Smooth frames with noise (compressible, never constant), uint8."""
    base = torch.linspace(0, 200, shape[-2]).reshape(1, 1, 1, -1, 1).expand(*shape).clone()
    return (base + torch.randint(0, 40, shape, generator=g)).to(torch.uint8)


def _trajectory(
    seed: int,
    T: int = 5,
    B: int = 2,
    frame: tuple[int, ...] = (16, 12, 3),
    done_rate: float = 0.2,
    extra: bool = True,
) -> Trajectory:
    """An RLinf-shaped trajectory: ``next_obs[t] == curr_obs[t + 1]`` except where an
    episode ended (a new frame) and at the last step."""
    g = torch.Generator().manual_seed(seed)
    frames = _frames(g, (T + 1, B, *frame))
    dones = torch.rand(T, B, generator=g) < done_rate
    after = frames[1:].clone()
    after[dones] = _frames(g, (1, int(dones.sum()), *frame))[0]
    traj = Trajectory(
        max_episode_length=T,
        rewards=torch.randn(T, B, generator=g),
        dones=dones,
        curr_obs={"image": frames[:-1].clone()},
        next_obs={"image": after},
    )
    if extra:
        traj.curr_obs["state"] = torch.randn(T, B, 4, generator=g)
        traj.next_obs["state"] = torch.randn(T, B, 4, generator=g)
    return traj


def _arrays(group_path: Path) -> dict:
    return json.loads((group_path / "zarr.json").read_text())["attributes"]["rbzarr_layout"][
        "arrays"
    ]


def _same_batches(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, dict):
            _same_batches(value, b[key])
        else:
            assert value.dtype == b[key].dtype and torch.equal(value, b[key]), key


# -- specs ----------------------------------------------------------------------------------
def test_specs_parse_to_canonical_text() -> None:
    texts = ["raw", "zstd", "zstd:3", "lossless", "qoi", "png", "jpegxl-lossless", "jpeg:95"]
    assert [parse_codec(t).text for t in texts] == [
        "raw",
        "zstd:1",
        "zstd:3",
        "lossless",
        "qoi",
        "png:1",
        "jpegxl-lossless:1",
        "jpeg:95",
    ]
    assert parse_codec(None).text == "raw"
    assert parse_codec("zstd:1+checksum").checksum
    assert parse_codec("jpeg:90").lossy and not parse_codec("lossless").lossy
    # JPEG keeps full chroma.
    assert parse_codec("jpeg:95").numcodecs_config()["subsampling"] == "444"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("webp", "unknown name 'webp'"),
        ("jpeg", "give the quality"),
        ("jpeg:101", "jpeg takes 1..100, got 101"),
        ("zstd:x", "must be an integer"),
        ("qoi:3", "takes no parameter"),
        (3, "expected a spec string"),
    ],
)
def test_bad_specs_are_named(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_codec(spec)


@pytest.mark.parametrize(
    ("kind", "text", "found"),
    [
        ("mapped", "", "raw"),
        ("chunked", "", "zstd:1"),
        ("chunked", "zstd:3+checksum", "zstd:3+checksum"),
        ("image", "jpeg:90", "jpeg:90"),
        ("chunked", "qoi", CorruptStoreError),  # another kind's codec
        ("image", "zstd:1", CorruptStoreError),
        ("image", "lossless", CorruptStoreError),  # never stored: chosen per key
        ("image", "", CodecUnavailableError),  # an image array names its codec
        ("chunked", "zstd:99", CorruptStoreError),  # out of range
        ("image", "webp", CodecUnavailableError),  # unknown here: not damage
    ],
)
def test_a_stored_description_names_a_codec_of_its_kind(
    kind: str, text: str, found: str | type[Exception]
) -> None:
    if isinstance(found, str):
        codec = stored_codec(kind, text, "here")
        assert (codec.text, codec.kind) == (found, kind)
        return
    with pytest.raises(found, match="here"):
        stored_codec(kind, text, "here")


def test_every_codec_kind_round_trips_a_frame_and_its_spec() -> None:
    frame = _frames(torch.Generator().manual_seed(0), (1, 1, 16, 12, 3))[0, 0].numpy()
    for text in ("raw", "zstd:1", "qoi", "png:1", "jpegxl-lossless:1", "jpeg:90", "jpegxl:90"):
        codec = parse_codec(text)
        assert parse_codec(codec.text) == codec
        decoded = codec.decode_frame(codec.encode_frame(frame), np.empty_like(frame))
        assert (psnr(frame, decoded) == math.inf) is not codec.lossy, text


def test_image_like_keys_and_the_default() -> None:
    assert image_layout((4, 2, 64, 64, 3), np.uint8) == "hwc"
    assert image_layout((4, 2, 3, 64, 64), np.uint8) == "chw"
    assert image_layout((4, 2, 64, 64, 3), np.float32) is None
    assert image_layout((4, 2, 64, 64), np.uint8) is None
    none = parse_codecs({})
    assert choose_codec(none, "curr_obs/image", (4, 2, 64, 64, 3), np.uint8).text == "qoi"
    assert choose_codec(none, "curr_obs/depth", (4, 2, 64, 64, 1), np.uint8).text == "png:1"
    assert choose_codec(none, "rewards", (4, 2), np.float32).text == "raw"
    # A "default" image codec leaves keys that are not images raw; naming one errors.
    some = parse_codecs({"default": "jpeg:90", "rewards": "qoi"})
    assert choose_codec(some, "curr_obs/state", (4, 2, 8), np.float32).text == "raw"
    with pytest.raises(ValueError, match="'rewards': codec 'qoi' takes image-like arrays"):
        choose_codec(some, "rewards", (4, 2), np.float32)


# -- sampling is bit-identical to raw -------------------------------------------------------
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    T=st.integers(1, 6),
    B=st.integers(1, 3),
    frame=st.sampled_from([(16, 12, 3), (8, 8, 4), (10, 9, 1), (3, 8, 10)]),
    done_rate=st.sampled_from([0.0, 0.3, 1.0]),
    extra=st.booleans(),
    codec=st.sampled_from(["lossless", "png", "zstd"]),
)
def test_lossless_codecs_sample_what_raw_samples(
    tmp_path_factory: pytest.TempPathFactory,
    T: int,
    B: int,
    frame: tuple[int, ...],
    done_rate: float,
    extra: bool,
    codec: str,
) -> None:
    trajectories = [_trajectory(seed, T, B, frame, done_rate, extra) for seed in range(3)]
    batches = []
    for codecs in ({"default": "raw"}, {"curr_obs/image": codec, "next_obs/image": codec}):
        path = tmp_path_factory.mktemp("store")
        buffer = TrajectoryReplayBuffer(
            seed=7,
            auto_save=True,
            auto_save_path=path,
            cache_size=0,
            layout_options={"codecs": codecs},
        )
        buffer.add_trajectories(trajectories)
        buffer.flush()
        batches.append([buffer.sample(num_chunks=9) for _ in range(2)])
        whole = TrajectoryReplayBuffer(seed=7)
        whole.load_checkpoint(path)
        buffer.close()
    for raw, coded in zip(*batches, strict=True):
        _same_batches(raw, coded)


def test_next_obs_is_stored_once_and_plain_zarr_rebuilds_it(tmp_path: Path) -> None:
    trajectory = _trajectory(1, T=8, B=3, done_rate=0.1)
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path)
    buffer.add_trajectories([trajectory])
    buffer.close()
    described = _arrays(tmp_path / "trajectories/0")
    shared = described["next_obs/image"]
    expected = next_obs.differing_rows(trajectory.next_obs["image"], trajectory.curr_obs["image"])
    # The last step's 3 rows, plus one per ended episode.
    assert shared["explicit"] == expected.tolist()
    assert len(expected) == 3 + int(trajectory.dones[:-1].sum())
    assert shared["same_as"] == "curr_obs/image" and shared["rows"] == [8, 3]
    assert shared["shape"] == [len(expected), 1, 16, 12, 3]
    assert "explicit" not in described["next_obs/state"]  # float keys are stored whole
    # A plain zarr reader: the documented rule rebuilds the array.
    group = zarr.open_group(tmp_path / "trajectories/0", mode="r")
    curr = group["curr_obs/image"][...]
    stored = group["next_obs/image"][...]
    assert np.array_equal(curr, trajectory.curr_obs["image"].numpy())
    rebuilt = next_obs.rebuild(stored, curr, np.asarray(shared["explicit"]))
    assert np.array_equal(rebuilt, trajectory.next_obs["image"].numpy())
    # And rbzarr's own whole read.
    layout, documents = open_store(tmp_path)
    got = layout.read(documents.trajectory_index["trajectory_index"]["0"])
    assert torch.equal(got.next_obs["image"], trajectory.next_obs["image"])
    assert torch.equal(got.curr_obs["image"], trajectory.curr_obs["image"])
    # `rbzarr info` counts the key at its full size.
    entry = documents.trajectory_index["trajectory_index"]["0"]
    keys, _ = layout.describe_keys([entry], {})
    assert keys["next_obs/image"]["raw_bytes"] == trajectory.next_obs["image"].numel()


def test_a_next_obs_row_stored_once_is_decoded_once_per_batch(tmp_path: Path) -> None:
    # One env, no episode end: next_obs[t] is curr_obs[t + 1] for t < 7; only the last
    # step's row is in next_obs's own array.  Each frame a batch needs is read (and
    # decoded) once: curr_obs's drawn rows, next_obs's own row if row 7 is drawn, and the
    # curr_obs rows t + 1 of drawn rows t whose row t + 1 was not drawn.
    trajectory = _trajectory(3, T=8, B=1, done_rate=0.0, extra=False)
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path) as buffer:
        buffer.add_trajectories([trajectory])
    reads = CountingByteSource()
    reader = TrajectoryReplayBuffer(
        seed=5,
        auto_save=True,
        auto_save_path=tmp_path,
        cache_size=0,
        layout_options={"byte_source": reads},
    )
    with reader:
        reader.load_checkpoint(tmp_path)
        reads.requests = 0
        batch = reader.sample(num_chunks=16)
        requests = reads.requests
    curr, after = trajectory.curr_obs["image"][:, 0], trajectory.next_obs["image"][:, 0]
    rows = [
        int(torch.nonzero((curr == frame).flatten(1).all(1))[0])
        for frame in batch["curr_obs"]["image"]
    ]
    assert torch.equal(batch["next_obs"]["image"], after[rows])
    drawn = set(rows)
    borrowed = {t + 1 for t in drawn if t < 7} - drawn
    assert len(drawn) < len(rows) and borrowed != {t + 1 for t in drawn if t < 7}  # both cases
    assert requests == len(drawn) + (7 in drawn) + len(borrowed)


def test_plain_zarr_decodes_every_image_codec_in_a_fresh_process(tmp_path: Path) -> None:
    trajectory = _trajectory(2, extra=False)
    trajectory.curr_obs["chw"] = trajectory.curr_obs["image"].permute(0, 1, 4, 2, 3).contiguous()
    codecs = {"curr_obs/image": "png", "curr_obs/chw": "qoi", "next_obs/image": "jpeg:95"}
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path, layout_options={"codecs": codecs}
    )
    buffer.add_trajectories([trajectory])
    buffer.close()
    np.save(tmp_path.parent / "image.npy", trajectory.curr_obs["image"].numpy())
    # zarr alone (rbzarr imported for its codec registrations only, as its entry points do
    # once installed), in a process that never wrote the store.
    script = (
        "import sys, numpy as np, zarr, rbzarr.storage.zarr.zarr_codecs\n"
        f"g = zarr.open_group({str(tmp_path / 'trajectories/0')!r}, mode='r')\n"
        f"want = np.load({str(tmp_path.parent / 'image.npy')!r})\n"
        "assert np.array_equal(g['curr_obs/image'][...], want)\n"
        "assert np.array_equal(g['curr_obs/chw'][...], want.transpose(0, 1, 4, 2, 3))\n"
        "print(g['next_obs/image'].shape)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    described = _arrays(tmp_path / "trajectories/0")
    # Lossy keys record the PSNR measured at encode; lossless ones none.
    assert described["next_obs/image"]["psnr"] > 35
    assert "psnr" not in described["curr_obs/image"]


def test_lossy_psnr_is_the_measured_one() -> None:
    g = torch.Generator().manual_seed(3)
    frame = _frames(g, (1, 1, 32, 32, 3))[0, 0].numpy()
    codec = parse_codec("jpeg:95")
    decoded = codec.decode_frame(codec.encode_frame(frame), np.empty_like(frame))
    assert 30 < psnr(frame, decoded) < 60
    assert psnr(frame, frame) == float("inf")


def test_a_lossy_key_records_the_psnr_of_a_sample_of_its_frames(tmp_path: Path) -> None:
    """The PSNR is measured on 8 evenly spaced frames (first and last included; at most one
    in 16), not all 64 x 2, and the description says so: ``psnr_frames`` is
    ``[measured, frames]``."""
    T, B = 64, 2
    g = torch.Generator().manual_seed(4)
    frames = _frames(g, (T, B, 16, 16, 3))
    trajectory = Trajectory(
        max_episode_length=T,
        rewards=torch.zeros(T, B),
        dones=torch.zeros(T, B, dtype=torch.bool),
        curr_obs={"image": frames},
    )
    options = {"codecs": {"curr_obs/image": "jpeg:90"}}
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path, layout_options=options
    ) as buffer:
        buffer.add_trajectories([trajectory])
    described = _arrays(tmp_path / "trajectories/0")["curr_obs/image"]
    assert described["psnr_frames"] == [8, T * B]
    flat = frames.reshape(T * B, 16, 16, 3).numpy()
    sampled = [0, 18, 36, 54, 73, 91, 109, 127]  # np.linspace(0, 127, 8), rounded
    codec = parse_codec("jpeg:90")
    decoded = np.stack(
        [codec.decode_frame(codec.encode_frame(flat[i]), flat[i].copy()) for i in sampled]
    )
    assert described["psnr"] == round(psnr(flat[sampled], decoded), 3)


# -- the store remembers its codecs ---------------------------------------------------------
def test_later_writers_use_the_stored_codecs_and_a_conflict_is_an_error(tmp_path: Path) -> None:
    options = {"codecs": {"curr_obs/image": "png:3", "default": "zstd:2"}}
    first = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path, layout_options=options)
    first.add_trajectories([_trajectory(0)])
    first.close()
    recorded = json.loads((tmp_path / "metadata.json").read_text())["codecs"]
    assert recorded["curr_obs/image"] == "png:3" and recorded["default"] == "zstd:2"
    # A writer told nothing uses them.
    second = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path)
    second.add_trajectories([_trajectory(1)])
    second.close()
    described = _arrays(tmp_path / "trajectories/1")
    assert described["curr_obs/image"]["codec"] == "png:3"
    assert described["rewards"]["codec"] == "zstd:2"
    # A writer told otherwise is refused before anything is written.
    with pytest.raises(CodecConflictError, match="'curr_obs/image' is stored with codec 'png:3'"):
        TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=tmp_path,
            layout_options={"codecs": {"curr_obs/image": "jpeg:90"}},
        )
    assert sorted(p.name for p in (tmp_path / "trajectories").iterdir()) == ["0", "1", "zarr.json"]
    # "lossless" agrees with the lossless codec the store records.
    third = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=tmp_path,
        layout_options={"codecs": {"curr_obs/image": "lossless"}},
    )
    third.close()


def test_a_store_written_before_codecs_were_recorded_stays_raw(tmp_path: Path) -> None:
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path, layout_options={"codecs": {"default": "raw"}}
    )
    buffer.add_trajectories([_trajectory(0)])
    buffer.close()
    # As a store of an earlier release: no codecs in its metadata.
    for name in ("metadata.json",):
        path = tmp_path / name
        document = json.loads(path.read_text())
        document.pop("codecs")
        path.write_text(json.dumps(document))
    for log in tmp_path.rglob("*.jsonl"):
        lines = [json.loads(line) for line in log.read_text().splitlines() if line]
        for line in lines:
            line.get("metadata", {}).pop("codecs", None)
        log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    appender = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path)
    appender.add_trajectories([_trajectory(1)])
    appender.close()
    assert _arrays(tmp_path / "trajectories/1")["curr_obs/image"]["kind"] == "mapped"


# -- without imagecodecs --------------------------------------------------------------------
def test_without_imagecodecs_an_image_key_names_the_package_and_raw_still_writes(
    tmp_path: Path,
) -> None:
    """imagecodecs is a dependency: a process that cannot import it never keeps frames raw
    silently; the default and a named codec raise an ImportError naming it."""
    script = (
        "import sys; sys.modules['imagecodecs'] = None\n"
        "import numpy as np\n"
        "from rbzarr.storage.zarr.codecs import choose_codec, parse_codecs\n"
        "shape = (2, 1, 16, 16, 3)\n"
        "print(choose_codec(parse_codecs({'default': 'raw'}), 'k', shape, np.uint8).text)\n"
        "for codecs in ({}, {'curr_obs/image': 'qoi'}):\n"
        "    try:\n"
        "        choose_codec(parse_codecs(codecs), 'curr_obs/image', shape, np.uint8)\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, str(exc).split(' (')[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    named = (
        "CodecUnavailableError codec 'qoi' of 'curr_obs/image' needs imagecodecs, which this "
        "Python cannot import"
    )
    assert done.stdout.splitlines() == ["raw", named, named]


# -- export and damage ----------------------------------------------------------------------
def test_export_to_hdf5_writes_plain_frames(tmp_path: Path) -> None:
    trajectory = _trajectory(4, T=4, B=2, done_rate=0.0, extra=False)
    trajectory.dones[-1] = True
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path / "store")
    buffer.add_trajectories([trajectory])
    buffer.close()
    assert _arrays(tmp_path / "store/trajectories/0")["next_obs/image"]["same_as"]
    written = export_dataset(tmp_path / "store", tmp_path / "out.hdf5", "hdf5")
    assert written.episodes == 2
    with h5py.File(tmp_path / "out.hdf5") as file:
        demos = sorted(file["data"])
        first = file["data"][demos[0]]
        assert np.array_equal(first["obs/image"][...], trajectory.curr_obs["image"][:, 0].numpy())
        assert np.array_equal(
            first["next_obs/image"][...], trajectory.next_obs["image"][:, 0].numpy()
        )


def test_a_damaged_frame_is_a_named_error(tmp_path: Path) -> None:
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path, cache_size=0)
    buffer.add_trajectories([_trajectory(5, T=3, B=1, extra=False)])
    buffer.flush()
    shard = next((tmp_path / "trajectories/0/curr_obs/image").glob("c.*"))
    data = bytearray(shard.read_bytes())
    data[0:4] = b"nope"  # the first frame's header (QOI streams carry no checksum: damage
    # past a header decodes to other pixels, as it would in a raw array)
    shard.write_bytes(bytes(data))
    # Sampled rows (the writer's buffer reads its store: no cache) and a whole load.
    with pytest.raises(CorruptStoreError, match="curr_obs/image: an inner chunk does not"):
        for _ in range(20):
            buffer.sample(num_chunks=3)
    buffer.close()
    with pytest.raises(CorruptStoreError, match="curr_obs/image: an inner chunk does not"):
        TrajectoryReplayBuffer(seed=0).load_checkpoint(tmp_path)


def test_a_next_obs_description_that_lies_is_refused(tmp_path: Path) -> None:
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path)
    buffer.add_trajectories([_trajectory(6, T=4, B=2, done_rate=0.0, extra=False)])
    buffer.close()
    path = tmp_path / "trajectories/0/zarr.json"
    document = json.loads(path.read_text())
    arrays = document["attributes"]["rbzarr_layout"]["arrays"]
    arrays["next_obs/image"]["explicit"] = [0, 6]  # drops a row of the last step
    path.write_text(json.dumps(document))
    with pytest.raises(CorruptStoreError, match="next_obs/image: invalid next_obs description"):
        TrajectoryReplayBuffer(seed=0).load_checkpoint(tmp_path)


def test_a_small_next_obs_stored_once_keeps_its_rows_when_copied_inline(memory_url: str) -> None:
    """On object storage small shards are copied into the group document: the copy of a
    ``next_obs`` key stored once keeps its ``same_as``/``rows``/``explicit`` (it lost them, so
    the store's own reader refused the shape ``[2, 1, ...]`` against ``[6, 2]``)."""
    T, B = 6, 2
    frames = torch.full((T + 1, B, 8, 8, 3), 7, dtype=torch.uint8)
    frames[-1] = 9  # the last step's next frames differ: 2 of the 12 rows are stored
    trajectory = Trajectory(
        max_episode_length=T,
        rewards=torch.zeros(T, B),
        dones=torch.zeros(T, B, dtype=torch.bool),
        curr_obs={"image": frames[:-1].clone()},
        next_obs={"image": frames[1:].clone()},
    )
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=memory_url) as writer:
        writer.add_trajectories([trajectory])
    layout, documents = open_store(memory_url)
    entry = documents.trajectory_index["trajectory_index"]["0"]
    attributes = layout.written_attributes(0)
    assert attributes is not None
    described = attributes[LAYOUT_ATTR]["arrays"]["next_obs/image"]
    assert described["same_as"] == "curr_obs/image" and described["rows"] == [T, B]
    assert described["explicit"] == [10, 11] and "inline" in described
    got = layout.read(entry)
    assert torch.equal(got.next_obs["image"], trajectory.next_obs["image"])
