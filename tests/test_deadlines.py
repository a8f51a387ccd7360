"""A silent S3 endpoint (accepts connections, never answers) ends in bounded time.

Two real silent endpoints: :class:`S3Proxy` in its silent mode, and a moto server process
of this test's own stopped with ``SIGSTOP``.  The client keeps rbzarr's default botocore
timeouts (no test-only ``config_kwargs``), so only the deadline can end the waits.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import make_trajectory

from benchmarks.s3_server import REGION, S3Proxy, create_bucket, unique_bucket_name
from rbzarr import StorageUnavailableError, TrajectoryReplayBuffer
from rbzarr.analysis import open_buffer
from rbzarr.storage.io.deadlines import DEADLINE_ENV
from rbzarr.storage.io.location import Location

DEADLINE = 2.0
# Only a hang guard: how long the writer may take to report the silent endpoint's error.
HANG_GUARD = 60.0


def default_options(endpoint_url: str) -> dict[str, Any]:
    """Options a user writes: the endpoint and credentials, rbzarr's default timeouts."""
    return {
        "endpoint_url": endpoint_url,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": REGION},
    }


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEADLINE_ENV, str(DEADLINE))


def store_with_trajectories(url: str, options: dict[str, Any]) -> None:
    buffer = TrajectoryReplayBuffer(auto_save=True, auto_save_path=url, storage_options=options)
    buffer.add_trajectories([make_trajectory(4, 2, 10 * k) for k in range(3)])
    buffer.close()


def assert_unavailable_by_deadline(call: Any, url: str) -> StorageUnavailableError:
    """``call`` raises the deadline's error (not a timeout of its own), naming the bucket."""
    with pytest.raises(StorageUnavailableError) as caught:
        call()
    assert url.removeprefix("s3://").split("/")[0] in str(caught.value)
    assert f"no answer within {DEADLINE:g} s" in str(caught.value)
    return caught.value


@pytest.mark.s3
@pytest.mark.usefixtures("short_deadline")
def test_a_silent_proxy_ends_listing_opening_sampling_and_copying_in_bounded_time(
    s3_proxy: S3Proxy, s3_bucket: str, tmp_path: Any
):
    url = f"s3://{s3_bucket}/run"
    options = default_options(s3_proxy.endpoint_url)
    store_with_trajectories(url, options)
    view = open_buffer(url, options)
    s3_proxy.go_silent()
    assert_unavailable_by_deadline(lambda: view.sample(8), url)
    assert_unavailable_by_deadline(lambda: Location.from_url(url, options).list_names(), url)
    assert_unavailable_by_deadline(lambda: open_buffer(url, options), url)
    source = Location.from_url(url, options).child("trajectories", "0")
    copy = Location.from_url(tmp_path / "copy")
    assert_unavailable_by_deadline(lambda: source.copy_into(copy), url)  # checkpoint copies
    assert not (tmp_path / "copy").exists()


@pytest.mark.s3
@pytest.mark.usefixtures("short_deadline")
def test_the_writer_shows_the_silent_endpoints_error_while_it_retries(
    s3_proxy: S3Proxy, s3_bucket: str
):
    url = f"s3://{s3_bucket}/run"
    options = default_options(s3_proxy.endpoint_url)
    buffer = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, storage_options=options, max_pending_writes=4
    )
    buffer.add_trajectories([make_trajectory(4, 2, 0)])
    buffer.flush()
    s3_proxy.go_silent()
    buffer.add_trajectories([make_trajectory(4, 2, 10)])
    started = time.monotonic()
    while buffer.get_stats()["write_error"] is None and time.monotonic() - started < HANG_GUARD:
        time.sleep(0.1)  # polls the writer's state, which changes on its own thread
    error = buffer.get_stats()["write_error"]
    assert error is not None and "no answer within" in error and s3_bucket in error
    assert buffer.sample(4)["rewards"].shape[0] == 4  # sampling never waits for storage
    s3_proxy.go_up()
    buffer.close()
    assert len(open_buffer(url, options)) == 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def own_moto_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A moto server process of this test's own (the session's shared one is never paused)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)  # waits for the server process to listen
        yield process, endpoint
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.s3
@pytest.mark.usefixtures("short_deadline")
def test_a_stopped_moto_server_ends_sampling_in_bounded_time(
    own_moto_server: tuple[subprocess.Popen[bytes], str],
):
    process, endpoint = own_moto_server
    bucket = unique_bucket_name()
    create_bucket(endpoint, bucket)
    url = f"s3://{bucket}/run"
    options = default_options(endpoint)
    store_with_trajectories(url, options)
    view = open_buffer(url, options)
    os.kill(process.pid, signal.SIGSTOP)
    assert_unavailable_by_deadline(lambda: view.sample(8), url)
    assert_unavailable_by_deadline(lambda: open_buffer(url, options), url)
