"""S3 reads through obstore: which options translate, and the same batches as through s3fs."""

from __future__ import annotations

import socket
from typing import Any

import botocore.exceptions
import fsspec
import pytest
import torch
from conftest import make_trajectory

import rbzarr
from rbzarr import CorruptStoreError, StorageUnavailableError, TrajectoryReplayBuffer
from rbzarr.storage.io.backends import refused_range, translate_errors
from rbzarr.storage.io.object_ranges import CLIENT_ENV, object_ranges, obstore_config
from rbzarr.storage.zarr import remote
from rbzarr.storage.zarr.remote import checked_bytes

EXPLICIT = {
    "endpoint_url": "http://127.0.0.1:9000",
    "key": "k",
    "secret": "s",
    "client_kwargs": {"region_name": "eu-west-1"},
    "config_kwargs": {"connect_timeout": 2, "read_timeout": 4, "retries": {"max_attempts": 3}},
}


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", CLIENT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_explicit_options_translate_to_obstores_words() -> None:
    config = obstore_config(EXPLICIT)
    assert config is not None
    assert config["endpoint"] == "http://127.0.0.1:9000"
    assert config["region"] == "eu-west-1"
    assert (config["access_key_id"], config["secret_access_key"]) == ("k", "s")
    assert config["client_options"] == {
        "allow_http": True,
        "connect_timeout": "2.0s",
        "timeout": "4.0s",
    }
    assert config["retry_config"]["max_retries"] == 2


def test_anonymous_access_skips_the_signature() -> None:
    config = obstore_config({"anon": True, "client_kwargs": {"region_name": "us-west-2"}})
    assert config is not None and config["skip_signature"] is True
    assert "access_key_id" not in config


def test_environment_credentials_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ek")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "es")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    config = obstore_config({})
    assert config is not None
    assert (config["access_key_id"], config["region"]) == ("ek", "ap-south-1")


@pytest.mark.parametrize(
    "options",
    [
        {},  # credentials from a profile or an instance role: botocore's chain, s3fs
        {"key": "k", "secret": "s"},  # AWS without a region: s3fs finds the bucket's
        {**EXPLICIT, "profile": "work"},
        {**EXPLICIT, "requester_pays": True},
        {**EXPLICIT, "client_kwargs": {"verify": False}},
        {**EXPLICIT, "config_kwargs": {"signature_version": "s3v4"}},
    ],
)
def test_options_obstore_cannot_take_keep_s3fs(options: dict[str, Any]) -> None:
    assert obstore_config(options) is None
    assert object_ranges("s3", options) is None


def test_the_environment_chooses_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    assert object_ranges("s3", EXPLICIT) is not None
    assert object_ranges("memory", EXPLICIT) is None
    monkeypatch.setenv(CLIENT_ENV, "s3fs")
    assert object_ranges("s3", EXPLICIT) is None
    monkeypatch.setenv(CLIENT_ENV, "curl")
    with pytest.raises(ValueError, match="RBZARR_S3_CLIENT must be"):
        object_ranges("s3", EXPLICIT)


def _batches(url: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    view = rbzarr.open_buffer(url, options, seed=3)
    return [view.sample(24) for _ in range(3)]


@pytest.mark.s3
def test_obstore_and_s3fs_read_the_same_batches(
    s3_bucket: str, s3_options: dict[str, Any], s3_proxy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "INLINE_SHARD_BYTES", 0)  # every shard is fetched
    url = f"s3://{s3_bucket}/store"
    with TrajectoryReplayBuffer(
        seed=0, auto_save=True, auto_save_path=url, storage_options=s3_options
    ) as writer:
        writer.add_trajectories([make_trajectory(6, 4, 100 * i) for i in range(5)])
    s3_proxy.reset_log()
    through_obstore = _batches(url, s3_options)
    agents = {r.agent.split("/")[0] for r in s3_proxy.requests if "/c/" in r.key}
    assert agents == {"object_store"}
    monkeypatch.setenv(CLIENT_ENV, "s3fs")
    s3_proxy.reset_log()
    through_s3fs = _batches(url, s3_options)
    agents = {r.agent.split("/")[0] for r in s3_proxy.requests if "/c/" in r.key}
    assert "object_store" not in agents and agents
    for one, other in zip(through_obstore, through_s3fs, strict=True):
        torch.testing.assert_close(one, other, rtol=0, atol=0)


def test_an_obstore_failure_is_one_line_and_its_debug_dump_stays_in_the_cause() -> None:
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = {**EXPLICIT, "endpoint_url": f"http://127.0.0.1:{port}"}
    options["config_kwargs"] = {"connect_timeout": 2, "retries": {"max_attempts": 1}}
    ranges = object_ranges("s3", options)
    assert ranges is not None
    (failure,) = ranges.cat_ranges(["bucket/key"], [0], [10])
    assert isinstance(failure, BaseException)
    with (
        pytest.raises(StorageUnavailableError) as caught,
        translate_errors("s3://bucket", "reading"),
    ):
        raise failure
    message = str(caught.value)
    assert message.startswith("reading 's3://bucket' failed: ") and f"127.0.0.1:{port}" in message
    assert "Debug source" not in message and "\n" not in message
    assert message.endswith("check that the endpoint is up and reachable, then retry")
    assert "Debug source" in str(caught.value.__cause__)


@pytest.mark.s3
@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_only_a_refused_range_reads_as_a_truncated_shard(
    client: str, s3_bucket: str, s3_options: dict[str, Any], s3_proxy: Any
) -> None:
    # The object's key holds the words an answer of HTTP 416 carries: an outage's error,
    # which names the URL, must still read as an outage, never as a truncated shard.
    path = f"{s3_bucket}/store/InvalidRange-416/range-is-not-satisfiable"
    fs = fsspec.filesystem("s3", **s3_options)
    fs.pipe(path, b"0123456789")

    def fetch(start: int, end: int) -> Any:
        if client == "s3fs":
            return fs.cat_ranges([path], [start], [end], on_error="return")[0]
        ranges = object_ranges("s3", s3_options)
        assert ranges is not None
        return ranges.cat_ranges([path], [start], [end])[0]

    assert checked_bytes(fetch(2, 5), path) == b"234"
    past_the_end = fetch(20, 30)
    assert refused_range(past_the_end)
    with pytest.raises(CorruptStoreError, match="the shard is truncated"):
        checked_bytes(past_the_end, path)
    s3_proxy.go_down()
    outage = fetch(2, 5)
    assert isinstance(outage, BaseException) and not refused_range(outage)
    with pytest.raises(StorageUnavailableError), translate_errors(f"s3://{path}", "reading"):
        checked_bytes(outage, path)


def _client_error(code: str, status: int) -> BaseException:
    """botocore's error for an answer of ``status`` with S3 error ``code``, wrapped as s3fs
    wraps it (an ``OSError`` whose cause it is)."""
    answer = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    wrapped = OSError(22, "The requested range is not satisfiable")
    wrapped.__cause__ = botocore.exceptions.ClientError(answer, "GetObject")  # type: ignore[arg-type]
    return wrapped


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (_client_error("InvalidRange", 416), True),
        (_client_error("416", 416), True),  # a 416 without an XML body
        (_client_error("SlowDown", 503), False),
        (OSError("GET http://127.0.0.1:41623/b/InvalidRange-416/x: connection reset"), False),
        (
            RuntimeError(
                "Error performing GET http://h:4160/b/k in 4.16ms - Server returned non-2xx "
                "status code: 416 Range Not Satisfiable: <Error><Code>InvalidRange</Code>"
            ),
            True,
        ),
        (
            RuntimeError(
                "Error performing GET http://h/b/k in 1ms - Server returned non-2xx status "
                "code: 503 Service Unavailable: <Key>non-2xx status code: 416</Key>"
            ),
            False,
        ),
    ],
)
def test_a_refused_range_is_known_by_the_answers_status(
    error: BaseException, refused: bool
) -> None:
    assert refused_range(error) is refused
