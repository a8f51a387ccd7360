"""Security: names never leave the store root; pickles never run code unless opted in."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import pickle
from pathlib import Path

import pytest
import torch
from conftest import make_trajectory

from rbzarr import (
    CorruptStoreError,
    RbzarrError,
    TrajectoryReplayBuffer,
    UnsafePathError,
    UnsafePickleError,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer
from rbzarr.storage.io.location import Location
from rbzarr.storage.io.names import is_temporary_name, safe_name, temporary_name

pytestmark = pytest.mark.timeout(60)

UNSAFE_NAMES = ["..", ".", "../evil", "a/b", "/abs", "a\\b", "x\x00y", ""]


def files_below(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


class Payload:
    """Unpickling this runs ``exec``: it creates ``marker`` if the loader is unsafe."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_location_child_refuses_names_that_could_leave_the_root(tmp_path, name):
    root = Location.from_url(tmp_path / "root")
    with pytest.raises(UnsafePathError, match="unsafe name"):
        root.child(name)
    with pytest.raises(UnsafePathError):
        root.child("ok", name)
    with pytest.raises(UnsafePathError):
        safe_name(name)
    with pytest.raises(UnsafePathError):
        root.write_bytes(b"x", name)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "root").exists()


def test_temporary_names_are_fresh_siblings_that_a_repair_recognises(tmp_path):
    target = tmp_path / "metadata.json"
    first, second = temporary_name(str(target)), temporary_name(str(target))
    assert first != second
    assert Path(first).parent == tmp_path and Path(first).name.startswith(target.name)
    assert is_temporary_name(Path(first).name) and not is_temporary_name(target.name)
    Location.from_url(tmp_path).write_bytes(b"{}", target.name)
    assert files_below(tmp_path) == {target.name}


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
@pytest.mark.parametrize("mwid", ["../evil", "a/b", "/abs", "x\x00", "a\\b"])
def test_unsafe_model_weights_id_is_refused_at_add(tmp_path, fmt, mwid):
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", trajectory_format=fmt
    )
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.flush()
    before = (buffer.get_stats(), files_below(tmp_path))
    with pytest.raises(UnsafePathError, match="unsafe name"):
        buffer.add_trajectories([make_trajectory(4, 2, 8, mwid=mwid)])
    assert (buffer.get_stats(), files_below(tmp_path)) == before
    buffer.add_trajectories([make_trajectory(4, 2, 16)])  # the buffer keeps working
    buffer.close()
    assert json.loads((tmp_path / "s" / "trajectory_index.json").read_text())[
        "trajectory_id_list"
    ] == [0, 1]


@pytest.mark.parametrize("fmt", ["zarr", "pt"])
@pytest.mark.parametrize("key", ["..", ".", "x\x00", "a\\b", "zarr.json"])
def test_unsafe_dict_keys_are_refused_at_add(tmp_path, fmt, key):
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=tmp_path / "s", trajectory_format=fmt
    )
    bad = make_trajectory(4, 2, 0)
    bad.forward_inputs = {key: torch.zeros(4, 2)}
    with pytest.raises(ValueError, match="key"):
        buffer.add_trajectories([bad])
    assert len(buffer) == 0 and buffer.trajectory_counter == 0
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.close()
    assert files_below(tmp_path) == {"s"} | {f"s/{n}" for n in files_below(tmp_path / "s")}


def pt_store_with_entry(tmp_path: Path, mwid: str) -> Path:
    """A pt store whose index entry 0 names ``mwid``, plus a valid file where it points."""
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format="pt") as b:
        b.add_trajectories([make_trajectory(4, 2, 0)])
    (data,) = store.glob("trajectory_0_*.pt")
    # Plant a readable trajectory where the escaping name resolves, as an attacker would.
    (store / "trajectory_0_").mkdir()
    (tmp_path / "secret.pt").write_bytes(data.read_bytes())
    data.unlink()
    path = store / "trajectory_index.json"
    index = json.loads(path.read_text())
    index["trajectory_index"]["0"]["model_weights_id"] = mwid
    path.write_text(json.dumps(index))
    return store


def test_an_index_pointing_outside_the_root_is_refused_everywhere(tmp_path):
    store = pt_store_with_entry(tmp_path, "/../../secret")
    assert (store / "trajectory_0_/../../secret.pt").resolve() == tmp_path / "secret.pt"
    with pytest.raises(UnsafePathError, match="unsafe name"):
        TrajectoryReplayBuffer(sample_window_size=0).load_checkpoint(store)
    view = open_buffer(store)
    with pytest.raises(UnsafePathError):
        view.trajectory(0)
    before = files_below(tmp_path)
    with contextlib.suppress(UnsafePathError):  # refusing to look is as good as reporting
        assert not verify_store(store, repair=True).ok
    assert files_below(tmp_path) <= before and (tmp_path / "secret.pt").exists()


@pytest.mark.parametrize("fmt", ["pt", "pkl"])
def test_a_malicious_trajectory_file_is_refused_without_running(tmp_path, fmt):
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format=fmt) as b:
        b.add_trajectories([make_trajectory(4, 2, 0)])
    (target,) = store.glob(f"trajectory_0_*.{fmt}")
    marker = tmp_path / "pwned"
    record = {"prev_logprobs": torch.zeros(4, 2), "rewards": Payload(marker)}
    if fmt == "pt":
        buffer = io.BytesIO()
        torch.save(record, buffer)
        target.write_bytes(buffer.getvalue())
    else:
        target.write_bytes(pickle.dumps(record))
    for read in (
        lambda: TrajectoryReplayBuffer(sample_window_size=0).load_checkpoint(store),
        lambda: open_buffer(store).trajectory(0),
    ):
        with pytest.raises(UnsafePickleError, match=target.name):
            read()
        assert not marker.exists()
    report = verify_store(store)
    assert [p.kind for p in report.problems] == ["unreadable_data"]
    assert not marker.exists()


def test_the_payload_does_run_under_an_unrestricted_loader(tmp_path):
    """Control: the payload above is live, so its refusal is meaningful."""
    marker = tmp_path / "pwned"
    store = tmp_path / "store"
    with TrajectoryReplayBuffer(auto_save=True, auto_save_path=store, trajectory_format="pkl") as b:
        b.add_trajectories([make_trajectory(4, 2, 0)])
    (target,) = store.glob("trajectory_0_*.pkl")
    record = pickle.loads(target.read_bytes())
    record["versions"] = Payload(marker)
    target.write_bytes(pickle.dumps(record))
    opted_in = TrajectoryReplayBuffer(
        sample_window_size=0, trajectory_format="pkl", layout_options={"allow_unsafe_pickle": True}
    )
    with pytest.raises((CorruptStoreError, RbzarrError, TypeError, ValueError)):
        opted_in.load_checkpoint(store)  # the code ran, then the non-tensor field is refused
    assert marker.exists()


def test_a_malicious_pickle_inside_a_pt_zip_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"x": Payload(marker)}, buffer)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert not marker.exists()


def test_a_fifo_socket_or_device_is_refused_before_it_is_opened(tmp_path):
    """A FIFO would block its reader forever: nothing but a regular file is opened."""
    import os  # noqa: PLC0415
    import socket  # noqa: PLC0415

    from rbzarr.storage.io.files import open_regular, read_regular  # noqa: PLC0415

    fifo, sock, plain = tmp_path / "fifo", tmp_path / "sock", tmp_path / "plain"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.close()
    plain.write_bytes(b"0123456789")
    for path in (fifo, sock, "/dev/zero", "/dev/null"):
        with pytest.raises(UnsafePathError, match="neither a folder nor a regular file"):
            open_regular(str(path))
    with pytest.raises(IsADirectoryError):
        read_regular(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        read_regular(str(tmp_path / "missing"))
    assert read_regular(str(plain)) == b"0123456789"
    assert read_regular(str(plain), 2, 5) == b"234"
    assert read_regular(str(plain), -3) == b"789"
    assert read_regular(str(plain), 8, 100) == b"89"
    location = Location.from_url(tmp_path)
    with pytest.raises(UnsafePathError):
        location.read_bytes("fifo")
    store = location.zarr_store(read_only=True)
    with pytest.raises(UnsafePathError):
        store.get_sync("fifo")
    assert store.get_sync("missing") is None


@pytest.mark.parametrize(
    "name", ["1", "0", "17", "\u00b9", "\u0661", "01", "-1", "+1", " 1", "1_0", "", "1.0", "x"]
)
def test_names_standing_for_numbers_are_ascii_digits_as_written(name):
    from rbzarr.storage.io.names import is_digits, number_name  # noqa: PLC0415

    canonical = name in ("1", "0", "17")
    assert (number_name(name) is not None) == canonical
    if canonical:
        assert number_name(name) == int(name)
    assert is_digits(name) == (canonical or name == "01")
