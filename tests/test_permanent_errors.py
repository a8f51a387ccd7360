"""Permanent storage errors are refused at construction or fail the pending writes at once.

The tests run as any user (root too), so the unwritable paths are made with files where
directories must be (``ENOTDIR``), which no permission bit overrides.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_trajectory

from benchmarks.s3_server import unique_bucket_name
from rbzarr import StoreNotWritableError, TrajectoryReplayBuffer, WriterFailedError
from rbzarr.storage.io.backends import missing_bucket_message, permanent_cause
from rbzarr.storage.io.location import Location
from rbzarr.storage.rlinf.documents import read_documents


def test_a_path_under_a_regular_file_is_refused_at_construction(tmp_path: Path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    with pytest.raises(StoreNotWritableError, match=r"notes\.txt") as caught:
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(blocker / "run"))
    assert isinstance(caught.value.__cause__, NotADirectoryError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert blocker.read_text() == "x"


def test_the_probe_leaves_nothing_behind(tmp_path: Path):
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "run"))
    # The writer's claim holds the (empty) store folder; the probe's names are gone.
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []
    buffer.close()


@pytest.mark.s3
def test_a_missing_bucket_is_refused_at_construction_by_the_claim_put(s3_options, s3_proxy):
    bucket = unique_bucket_name()
    url = f"s3://{bucket}/run"
    s3_proxy.reset_log()
    with pytest.raises(StoreNotWritableError, match=re.escape(url)) as caught:
        TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=s3_options)
    assert permanent_cause(caught.value) is not None
    assert missing_bucket_message(bucket) in str(caught.value)
    # No request of its own: the writer's claim, made anyway, is the probe.
    assert [r.method for r in s3_proxy.requests].count("PUT") == 1
    assert s3_proxy.requests[-1].key.endswith("/run/writers/0/claim")


def break_trajectories_folder(store: Path) -> None:
    """Replace the store's ``trajectories`` folder by a file: every new write meets ENOTDIR."""
    folder = store / "trajectories"
    for child in sorted(folder.rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    folder.rmdir()
    folder.write_text("not a folder")


def test_a_permanent_error_fails_the_pending_writes_at_once(tmp_path: Path):
    store = tmp_path / "run"
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(store), cache_size=0, sample_window_size=1
    )
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.flush()
    break_trajectories_folder(store)
    buffer.add_trajectories([make_trajectory(4, 2, 10)])
    # Not retried until the timeout: flush ends with the permanent cause, not "still
    # uncommitted after 600 s" (a retried error would keep it waiting that long).
    with pytest.raises(WriterFailedError, match="failed for good") as caught:
        buffer.flush(timeout=600)
    assert permanent_cause(caught.value) is not None
    assert buffer.get_stats()["pending_writes"] == 1
    assert "Not a directory" in buffer.get_stats()["write_error"]
    with pytest.raises(WriterFailedError, match="nothing changed"):
        buffer.add_trajectories([make_trajectory(4, 2, 20)])
    assert len(buffer) == 2
    # The window holds the pending trajectory only: it is sampled from memory.
    assert buffer.sample(4)["rewards"].shape[0] == 4
    # Fixed: the next flush tries once more, and the write commits.
    (store / "trajectories").unlink()
    buffer.flush(timeout=30)
    buffer.close()
    assert read_documents(Location.from_url(str(store))).metadata["size"] == 2


EXIT_WITH_A_BROKEN_STORE = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from conftest import make_trajectory
from benchmarks.s3_server import unique_bucket_name
from test_permanent_errors import break_trajectories_folder
from rbzarr import TrajectoryReplayBuffer
from rbzarr.storage.zarr.layout import ZarrLayout
real_write = ZarrLayout.write_many
def counted_write(layout, items):
    with open({attempts!r}, "a") as log:
        print(items[0][0]["trajectory_id"], file=log)
    return real_write(layout, items)
ZarrLayout.write_many = counted_write
buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path={store!r})
buffer.add_trajectories([make_trajectory(4, 2, 0)])
buffer.flush()
break_trajectories_folder(Path({store!r}))
buffer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(1, 4)])
# the script ends without close(): it must report the loss and end at once
"""


def test_exit_with_writes_failed_for_good_warns_once_and_does_not_hang(tmp_path: Path):
    store, attempts = tmp_path / "run", tmp_path / "attempts"
    script = EXIT_WITH_A_BROKEN_STORE.format(
        tests=str(Path(__file__).parent), store=str(store), attempts=str(attempts)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    # Trajectory 0 written, trajectory 1 (with the two queued behind it: a pack) tried once:
    # failed for good, it is not retried at exit, so the process ends at once.
    assert attempts.read_text().split() == ["0", "1"]
    lines = [line for line in done.stderr.splitlines() if "not committed" in line]
    assert len(lines) == 1 and "3 write(s)" in lines[0] and str(store) in lines[0]


@pytest.mark.parametrize(
    "code", [errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOSPC, errno.EROFS]
)
def test_permission_space_and_not_a_directory_are_permanent(code: int):
    cause = OSError(code, "refused")
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = cause
    assert permanent_cause(wrapped) is cause


@pytest.mark.parametrize("code", [errno.EIO, errno.ECONNRESET, errno.ETIMEDOUT, None])
def test_transient_errors_are_retried(code: int | None):
    assert permanent_cause(OSError(code, "flaky") if code else TimeoutError()) is None
