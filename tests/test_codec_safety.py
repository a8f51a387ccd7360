"""A user's codec mistakes are refused before anything is accepted, a writer never retries
what cannot heal, and data this process cannot decode (its codec's package missing) is not
damaged data (issue 44, items 1-3)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rbzarr import (
    CodecUnavailableError,
    InvalidCodecError,
    TrajectoryReplayBuffer,
    WriterFailedError,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer
from rbzarr.buffer.background import BackgroundWriter
from rbzarr.storage.index.store_index import StoreIndex
from rbzarr.storage.index.trajectory_index import TrajectoryIndex
from rbzarr.storage.io.backends import permanent_cause
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr.chunking import plan_key
from rbzarr.storage.zarr.codecs import CANDIDATES, parse_codecs
from rbzarr.storage.zarr.encode import encode_array
from rbzarr.storage.zarr.layout import ZarrLayout
from rbzarr.trajectory.model import Trajectory
from rbzarr.trajectory.validated import ValidatedTrajectory


def camera_trajectory(seed: int, frame: tuple[int, int, int] = (16, 12, 3)) -> Trajectory:
    """Camera frames (uint8 HWC) and a float state: the keys a codec may be given for."""
    g = torch.Generator().manual_seed(seed)
    T, B = 4, 2
    frames = torch.randint(0, 256, (T + 1, B, *frame), generator=g, dtype=torch.uint8)
    return Trajectory(
        max_episode_length=T,
        rewards=torch.randn(T, B, generator=g),
        dones=torch.zeros(T, B, dtype=torch.bool),
        curr_obs={"image": frames[:-1].clone(), "state": torch.randn(T, B, 4, generator=g)},
        next_obs={"image": frames[1:].clone(), "state": torch.randn(T, B, 4, generator=g)},
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every path below ``root`` and, for files, the digest of their bytes."""
    return {
        str(path.relative_to(root)): (
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        )
        for path in sorted(root.rglob("*"))
    }


# -- bad codecs are refused at the first add, nothing written ---------------------------------
@pytest.mark.parametrize(
    ("key", "spec", "expected"),
    [
        # a lossy image codec on a float key (the newcomer's mistake)
        ("curr_obs/state", "jpeg:90", r"'curr_obs/state': codec 'jpeg:90' takes image-like"),
        ("curr_obs/state", "lossless", r"'curr_obs/state': codec 'lossless' takes image-like"),
        ("rewards", "png:3", r"'rewards': codec 'png:3' takes image-like"),
        # a key the trajectories do not have (a typo)
        ("curr_obs/imgae", "qoi", r"codecs name \['curr_obs/imgae'\], which the trajectories"),
    ],
)
def test_a_codec_that_cannot_encode_its_key_is_refused_at_the_first_add(
    tmp_path: Path, key: str, spec: str, expected: str
) -> None:
    store = tmp_path / "store"
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=store, layout_options={"codecs": {key: spec}}
    )
    before = snapshot(tmp_path)
    with pytest.raises(InvalidCodecError, match=expected) as caught:
        buffer.add_trajectories([camera_trajectory(0)])
    assert isinstance(caught.value, ValueError)
    if "imgae" in key:  # the keys it could have meant
        assert "'curr_obs/image', 'curr_obs/state', 'dones'" in str(caught.value)
    else:  # what the key is, and what to use instead
        assert "got float32 [4, 2" in str(caught.value) and "use 'raw' or 'zstd'" in str(
            caught.value
        )
    assert len(buffer) == 0
    buffer.flush()  # nothing was queued: returns at once, no WriterFailedError
    buffer.close()
    # Nothing written, nothing recorded (no metadata naming the codec).
    assert snapshot(tmp_path) == before
    assert not any(store.rglob("*.json"))


def test_a_misspelt_codec_key_leaves_an_existing_store_as_it_was(tmp_path: Path) -> None:
    first = TrajectoryReplayBuffer(auto_save=True, auto_save_path=tmp_path)
    first.add_trajectories([camera_trajectory(0)])
    first.close()
    before = snapshot(tmp_path)
    appender = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path, layout_options={"codecs": {"rewrds": "zstd"}}
    )
    with pytest.raises(InvalidCodecError, match=r"codecs name \['rewrds'\].*'rewards'"):
        appender.add_trajectories([camera_trajectory(1)])
    assert len(appender) == 0  # nothing added (an appender does not load the store)
    appender.close()
    assert snapshot(tmp_path) == before
    assert "rewrds" not in (tmp_path / "metadata.json").read_text()


def test_a_frame_too_large_for_jpeg_is_refused_at_the_first_add(tmp_path: Path) -> None:
    buffer = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=tmp_path / "store",
        layout_options={"codecs": {"curr_obs/image": "jpeg:90"}},
    )
    with pytest.raises(InvalidCodecError, match=r"at most 65535 pixels a side.*8x65536"):
        buffer.add_trajectories([camera_trajectory(0, frame=(8, 65536, 3))])
    buffer.close()
    assert list((tmp_path / "store").rglob("*")) == []


def test_a_good_codec_still_writes_after_the_check(tmp_path: Path) -> None:
    codecs = {"curr_obs/image": "png:1", "curr_obs/state": "zstd:3", "default": "jpeg:90"}
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "store", layout_options={"codecs": codecs}
    )
    trajectory = camera_trajectory(1)
    buffer.add_trajectories([trajectory])
    buffer.close()
    metadata = json.loads((tmp_path / "store/metadata.json").read_text())
    assert metadata["codecs"]["curr_obs/image"] == "png:1"
    layout = ZarrLayout(Location.from_url(tmp_path / "store"))
    documents = StoreIndex.open(layout.location).read()
    index = TrajectoryIndex.from_documents(documents, layout.location.url)
    stored = layout.read(index.entries[index.id_list[0]])
    assert torch.equal(stored.curr_obs["image"], trajectory.curr_obs["image"])
    assert torch.equal(stored.curr_obs["state"], trajectory.curr_obs["state"])


@settings(max_examples=25, deadline=None)
@given(
    spec=st.sampled_from([*CANDIDATES, "lossless", "png:9", "jpegxl-lossless:3"]),
    dtype=st.sampled_from([np.uint8, np.int16, np.float32]),
    trailing=st.sampled_from([(), (4,), (8, 8, 1), (9, 8, 3), (12, 8, 4), (3, 8, 10), (8, 8, 2)]),
)
def test_a_codec_the_check_accepts_encodes_and_decodes(
    spec: str, dtype: type, trailing: tuple[int, ...]
) -> None:
    """The check at add and the encoder agree: what is accepted encodes (so the writer never
    meets a codec error), what is refused is an InvalidCodecError naming key and codec."""
    shape = (2, 2, *trailing)
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
    codecs = parse_codecs({"k": spec})
    try:
        plan = plan_key(shape, np.dtype(dtype), codecs, "k")
    except InvalidCodecError as exc:
        assert str(exc).startswith(f"'k': codec {codecs['k'].text!r} takes")
        return
    encoded = encode_array("k", torch.from_numpy(values), plan, 2, 2)
    assert encoded.description["shape"] == list(shape)
    if plan.kind == "image" and not plan.codec.lossy:
        frame = values[0, 0] if plan.image == "hwc" else values[0, 0].transpose(1, 2, 0)
        first = plan.codec.decode_frame(bytes(encoded.shard[0]), np.empty(frame.shape, np.uint8))
        assert np.array_equal(first, frame)


# -- the writer never retries what cannot heal -----------------------------------------------
def test_a_write_that_cannot_encode_fails_for_good_at_once(tmp_path: Path) -> None:
    """A write the check did not see (a layout given a trajectory directly) fails for good:
    flush and close raise its cause after one more try, never after retrying for a timeout."""
    layout = ZarrLayout(Location.from_url(tmp_path / "store"), codecs={"curr_obs/state": "jpeg:90"})
    validated = ValidatedTrajectory.check(camera_trajectory(2))
    entry = {"trajectory_id": 0, "shape": list(validated.spec.shape), "num_samples": 8}
    attempts: list[int] = []

    def write() -> None:
        attempts.append(1)
        layout.write(entry, validated)

    writer = BackgroundWriter(target="the store", permanent=permanent_cause)
    writer.submit([write])
    with pytest.raises(WriterFailedError, match="failed for good") as caught:
        writer.flush(timeout=60)
    assert isinstance(caught.value.__cause__, InvalidCodecError)
    assert "'curr_obs/state': codec 'jpeg:90'" in str(caught.value)
    with pytest.raises(WriterFailedError, match="failed for good"):
        writer.close(timeout=60)
    # The first attempt, then at most one more try by each of flush and close: no backoff
    # retries (the old writer retried until flush's timeout).
    assert 1 <= len(attempts) <= 3
    assert not (tmp_path / "store/trajectories/0").exists()


def test_a_codecs_own_error_is_invalid_codec_error_which_no_retry_cures() -> None:
    """libjpeg's own limit, met below the check (a frame handed to the codec directly)."""
    wide = np.zeros((8, 65536 + 64, 3), dtype=np.uint8)
    with pytest.raises(
        InvalidCodecError, match=r"codec 'jpeg:90' cannot encode a uint8 frame"
    ) as caught:
        parse_codecs({"k": "jpeg:90"})["k"].encode_frame(wide)
    assert "65535" in str(caught.value)
    assert permanent_cause(caught.value) is caught.value


@pytest.mark.parametrize(
    "error",
    [
        InvalidCodecError("'k': codec 'jpeg:90' takes image-like arrays"),
        CodecUnavailableError("codec 'qoi' needs imagecodecs"),
        ModuleNotFoundError("No module named 'imagecodecs'"),
    ],
)
def test_bad_input_and_a_missing_package_are_permanent_causes(error: Exception) -> None:
    wrapped = WriterFailedError("write failed")
    wrapped.__cause__ = error
    assert permanent_cause(wrapped) is error
    assert permanent_cause(RuntimeError("connection reset")) is None


def test_a_codec_this_rbzarr_does_not_know_is_not_damage(tmp_path: Path) -> None:
    """Frames stored with a codec a newer rbzarr knows and this one does not (renamed in the
    store's documents: `avif`): reads name it, verify and skip-sampling drop nothing."""
    store = tmp_path / "store"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    buffer.add_trajectories([camera_trajectory(k) for k in range(2)])
    buffer.close()
    # The trajectories' groups and the pack holding both (two small trajectories added
    # together are one).
    for folder in ("trajectories", "packs"):
        for document in (store / folder).rglob("zarr.json"):
            text = document.read_text()
            document.write_text(text.replace('"qoi"', '"avif"').replace("_qoi", "_avif"))
    before = snapshot(store)
    report = verify_store(str(store), repair=True, drop_damaged=True)
    assert [(p.kind, p.trajectory_id) for p in report.problems] == [
        ("codec_unavailable", 0),
        ("codec_unavailable", 1),
    ]
    assert "imagecodecs_avif' is not one this Python knows" in report.problems[0].message
    assert report.dropped_ids == [] and report.repaired == []
    view = open_buffer(store, seed=0, on_damaged="skip")
    with pytest.raises(CodecUnavailableError, match=r"codec 'avif' is not one this Python"):
        view.sample(4)
    assert view.damaged_trajectories == []
    assert snapshot(store) == before


# -- a process without imagecodecs ------------------------------------------------------------
_WITHOUT_IMAGECODECS = """
import json, subprocess, sys, warnings
sys.modules["imagecodecs"] = None  # this process cannot import it
import torch
from rbzarr import TrajectoryReplayBuffer
from rbzarr.analysis.view import open_buffer
from rbzarr.cli.main import main
from rbzarr.interop.convert import export_dataset
sys.path.insert(0, sys.argv[2])
from test_codec_safety import camera_trajectory

store, work = sys.argv[1], sys.argv[3]
found = {}

def outcome(name, call):
    try:
        call()
        found[name] = "ok"
    except Exception as exc:
        found[name] = [type(exc).__name__, isinstance(exc, ImportError), str(exc)]

outcome("construct", lambda: TrajectoryReplayBuffer(
    auto_save=True, auto_save_path=work + "/named",
    layout_options={"codecs": {"curr_obs/image": "qoi"}}))
appender = TrajectoryReplayBuffer(auto_save=True, auto_save_path=work + "/default")
outcome("append", lambda: appender.add_trajectories([camera_trajectory(3)]))
found["appended"] = len(appender)
appender.close()
outcome("append_to_store", lambda: TrajectoryReplayBuffer(auto_save=True, auto_save_path=store))
view = open_buffer(store, seed=0, on_damaged="skip")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outcome("sample", lambda: view.sample(4))
found["dropped"] = view.damaged_trajectories
found["warnings"] = [str(w.message) for w in caught]
outcome("export", lambda: export_dataset(store, work + "/out.hdf5", "hdf5"))
verify = ["verify", "--repair", "--drop-damaged", "--json", store]
found["verify_exit"] = main(verify, standalone_mode=False)
print("RESULT " + json.dumps(found))
"""


def test_without_imagecodecs_nothing_is_damaged_dropped_or_lost(tmp_path: Path) -> None:
    """The regression: `verify --repair --drop-damaged` where imagecodecs cannot be imported
    deleted every trajectory of a healthy QOI store.  Now it deletes nothing; sampling,
    export and appending name the missing package (an ImportError), never damage."""
    store = tmp_path / "store"
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=store)
    buffer.add_trajectories([camera_trajectory(k) for k in range(2)])
    buffer.close()
    described = json.loads((store / "trajectories/0/zarr.json").read_text())
    pack = described["attributes"]["rbzarr_layout"]["pack"]["group"]  # both in one pack
    described = json.loads((store / pack / "zarr.json").read_text())
    assert described["attributes"]["rbzarr_layout"]["arrays"]["curr_obs/image"]["codec"] == "qoi"
    before = snapshot(store)
    (tmp_path / "work").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_IMAGECODECS,
            str(store),
            str(Path(__file__).parent),
            str(tmp_path / "work"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    found = json.loads(lines[0].removeprefix("RESULT "))
    needs = "needs imagecodecs, which this Python cannot import"
    for name in ("construct", "append", "append_to_store", "sample", "export"):
        kind, is_import_error, message = found[name]
        assert (kind, is_import_error) == ("CodecUnavailableError", True), (name, message)
        assert needs in message and "pip install imagecodecs" in message, (name, message)
    assert "'qoi' of 'curr_obs/image'" in found["construct"][2]
    assert "'qoi' of 'curr_obs/image' (the store's)" in found["append_to_store"][2]
    assert found["appended"] == 0
    assert "not damaged" in found["sample"][2] and "curr_obs/image" in found["sample"][2]
    assert found["dropped"] == [] and found["warnings"] == []
    # verify: a problem of its own kind, never dropped, and the store is left as it was.
    report = json.loads(done.stdout[: done.stdout.index("RESULT ")])
    assert found["verify_exit"] == 1
    assert report["dropped_ids"] == [] and report["repaired"] == []
    assert [(p["kind"], p["trajectory_id"], p["repair"]) for p in report["problems"]] == [
        ("codec_unavailable", 0, ""),
        ("codec_unavailable", 1, ""),
    ]
    assert "--drop-damaged keeps it" in report["problems"][0]["message"]
    assert snapshot(store) == before
    assert not any((tmp_path / "work").rglob("*.json"))  # the appender wrote nothing
