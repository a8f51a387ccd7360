"""S3 failures with rbzarr's default client settings: clear errors, bounded waits, no noise.

Faults are real: moto's server sits behind the test's ``S3Proxy`` (benchmarks/s3_server.py), which
drops every request (``go_down``) or stops listening (``close``: connection refused).  The
options here set no timeouts or retries of their own, so every bound comes from rbzarr's
defaults (``S3_DEFAULTS`` in ``rbzarr/storage/io/backends.py``).  Times are asserted loosely
("surfaces well within 30 s"): this checks that nothing hangs, not how fast it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import make_trajectory, store_reader

from benchmarks.s3_server import S3Proxy
from rbzarr import StorageUnavailableError, TrajectoryReplayBuffer
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer
from rbzarr.storage.io.backends import S3_DEFAULTS, with_s3_defaults
from rbzarr.storage.io.location import Location
from rbzarr.storage.zarr import remote

pytestmark = pytest.mark.s3


def default_options(options: dict[str, Any]) -> dict[str, Any]:
    """The test's endpoint and credentials, without its short timeouts and retries."""
    return {key: value for key, value in options.items() if key != "config_kwargs"}


def build_store(url: str, options: dict[str, Any], count: int = 3) -> None:
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, enable_cache=False, storage_options=options
    ) as buffer:
        buffer.add_trajectories([make_trajectory(4, 2, 8 * i) for i in range(count)])


def reader(url: str, options: dict[str, Any]) -> TrajectoryReplayBuffer:
    """A buffer continuing the store at ``url`` in place, cache off: samples read S3."""
    return store_reader(url, options)


def surfaces(action: Callable[[], object], url: str) -> StorageUnavailableError:
    """Run ``action``; it must raise StorageUnavailableError naming ``url``."""
    with pytest.raises(StorageUnavailableError, match=re.escape(url)) as info:
        action()
    assert info.value.__cause__ is not None  # the backend's own error is kept
    return info.value


def test_defaults_fill_only_what_the_caller_left_out():
    mine = {"config_kwargs": {"read_timeout": 99}, "anon": True}
    merged = with_s3_defaults("s3://bucket/x", mine)
    assert merged["config_kwargs"] == {**S3_DEFAULTS, "read_timeout": 99}
    assert merged["anon"] is True and mine == {"config_kwargs": {"read_timeout": 99}, "anon": True}
    assert with_s3_defaults("memory://x", mine) == mine
    assert Location.from_url("s3://bucket/x", {"anon": True}).storage_options["config_kwargs"] == (
        S3_DEFAULTS
    )


@pytest.mark.parametrize("fault", ["dropped", "refused"])
def test_every_entry_point_fails_clearly_and_in_bounded_time(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], fault: str
):
    options = default_options(s3_options)
    url = f"s3://{s3_bucket}/store"
    build_store(url, options)
    buffer = reader(url, options)
    if fault == "dropped":
        s3_proxy.go_down()
    else:
        s3_proxy.close()  # nothing listens: connection refused (botocore's EndpointConnectionError)
    surfaces(lambda: buffer.sample(16), url)  # every row comes from S3: cache off
    surfaces(lambda: TrajectoryReplayBuffer(storage_options=options).load_checkpoint(url), url)
    if fault == "refused":  # fails fast: every entry point fits in the test's time
        surfaces(lambda: open_buffer(url, options), url)
        surfaces(lambda: buffer.save_checkpoint(f"s3://{s3_bucket}/ckpt"), s3_bucket)
        surfaces(lambda: verify_store(url, options), url)


def test_verify_never_drops_trajectories_while_the_store_is_unreachable(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any]
):
    options = default_options(s3_options)
    url = f"s3://{s3_bucket}/store"
    build_store(url, options)
    before = Location.from_url(url, options).read_bytes("trajectory_index.json")
    # Documents still arrive; the first trajectory's data does not.
    s3_proxy.go_down(when=lambda request: "/trajectories/" in request.key)
    surfaces(lambda: verify_store(url, options, repair=True, drop_damaged=True), url)
    s3_proxy.go_up()
    assert Location.from_url(url, options).read_bytes("trajectory_index.json") == before
    assert verify_store(url, options).ok


def test_an_outage_reading_a_key_named_like_a_refused_range_is_an_outage(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
):
    # An outage's error names the URL, and this key's folder holds the words an HTTP 416
    # answer carries: a sample must still fail as an outage, never as a truncated shard.
    options = default_options(s3_options)
    url = f"s3://{s3_bucket}/store"
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # every shard is fetched
    monkeypatch.setattr(remote, "WHOLE_SHARD_BYTES", 0)  # and read by ranges
    trajectory = make_trajectory(4, 2, 0)
    trajectory.curr_obs["InvalidRange_416"] = torch.arange(4 * 2 * 3.0).reshape(4, 2, 3)
    with TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=url, enable_cache=False, storage_options=options
    ) as buffer:
        buffer.add_trajectories([trajectory])
    buffer = reader(url, options)
    buffer.sample(16)  # the trajectory is open: only its rows are read from now on
    # Only that key's requests are dropped (every retry of them): its error is the one raised.
    s3_proxy.fault_requests(lambda request: "InvalidRange_416/" in request.key, drop=True, count=99)
    error = surfaces(lambda: buffer.sample(16), url)
    assert "InvalidRange_416" in str(error)
    s3_proxy.fault_requests(lambda request: False)  # the store answers again
    assert buffer.sample(16)["curr_obs"]["InvalidRange_416"].shape == (8, 3)  # its 8 rows


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbzarr", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
    )


def test_cli_prints_one_line_when_the_endpoint_is_down(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any]
):
    url = f"s3://{s3_bucket}/store"
    build_store(url, default_options(s3_options))
    s3_proxy.go_down()
    endpoint = f"endpoint_url={s3_proxy.endpoint_url}"
    for command in (["info", url], ["ls", url]):
        result = run_cli("--storage-option", endpoint, *command)  # its timeout: a hang guard
        assert result.returncode == 1, command
        assert result.stderr.startswith("Error: ") and url in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stdout == ""


def test_cli_says_when_credentials_are_missing(s3_proxy: S3Proxy, s3_bucket: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    url = f"s3://{s3_bucket}/store"
    result = run_cli(
        "--storage-option", f"endpoint_url={s3_proxy.endpoint_url}", "info", url, env=env
    )
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "credentials" in result.stderr and "AWS_ACCESS_KEY_ID" in result.stderr
    assert url in result.stderr


CHILD = textwrap.dedent(
    """
    import json, sys
    from rbzarr import StorageUnavailableError, TrajectoryReplayBuffer
    from rbzarr.storage.zarr import remote

    remote.WHOLE_SHARD_BYTES = 0  # no shard held whole: every sample reads ranges
    url, options = sys.argv[1], json.loads(sys.argv[2])
    buffer = TrajectoryReplayBuffer(
        enable_cache=False, cache_size=0, auto_save=True, auto_save_path=url,
        storage_options=options,
    )
    buffer.load_checkpoint(url)
    buffer.sample(64)  # arrays are open now: the outage hits many concurrent chunk reads
    print("loaded", flush=True)
    sys.stdin.readline()  # the parent takes the endpoint down meanwhile
    try:
        buffer.sample(64)
    except StorageUnavailableError:
        print("unavailable", flush=True)
    """
)


def test_a_process_dying_during_an_outage_prints_no_tracebacks(
    s3_proxy: S3Proxy, s3_bucket: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
):
    options = default_options(s3_options)
    url = f"s3://{s3_bucket}/store"
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # the child reads every shard
    build_store(url, options, count=12)
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, url, json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "loaded"
        s3_proxy.go_down()
        out, err = child.communicate("go\n", timeout=120)
    assert out.strip() == "unavailable", err
    assert child.returncode == 0
    assert "Exception ignored" not in err and "Traceback" not in err, err
