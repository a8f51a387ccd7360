"""S3 fixtures: one moto server per session, a fresh bucket and proxy per test.

Registered from ``conftest.py`` (``pytest_plugins``).  Clients talk to the per-test
``S3Proxy`` of benchmarks/s3_server.py (``s3_options``), which logs requests and can
simulate outages;
``s3_direct_options`` reach moto without the proxy, to inspect what the server really holds.
If moto's server extra is missing, the fixtures fail (they never skip).  A test that uses
them must carry the ``s3`` marker (so ``-m "not s3"`` leaves moto out); collection stops
with the names of those that do not.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs

from benchmarks.s3_server import (
    S3Proxy,
    create_bucket,
    s3_storage_options,
    start_moto,
    unique_bucket_name,
)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: every collected test is seen
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse tests that start moto (through ``moto_endpoint``) without the ``s3`` marker."""
    unmarked = [
        item.nodeid
        for item in items
        if "moto_endpoint" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("s3") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use the S3 fixtures but lack @pytest.mark.s3: " + ", ".join(unmarked)
        )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """The endpoint URL of moto's S3 server, started once on a free port of 127.0.0.1."""
    with pytest.MonkeyPatch.context() as patch:
        # Nothing may fall back to real AWS credentials or metadata services.
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server, endpoint = start_moto()
        try:
            yield endpoint
        finally:
            server.stop()


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[S3Proxy]:
    """A fresh proxy in front of moto; s3fs's instances are dropped around each test."""
    _drop_filesystems()
    proxy = S3Proxy(moto_endpoint)
    yield proxy
    proxy.close()
    _drop_filesystems()


def _drop_filesystems() -> None:
    """Clear s3fs's instance cache and collect the dropped instances right here.

    zarr's ``FsspecStore`` opens *asynchronous* s3fs instances, whose aiohttp sessions
    nothing ever closes (s3fs registers no finalizer for them, and zarr's store has no
    ``close``); they warn ``Unclosed client session`` when collected.  Collecting them
    here, under a narrow filter, keeps that warning from surfacing in an unrelated test.
    """
    s3fs.S3FileSystem.clear_instance_cache()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Unclosed (client session|connector)", ResourceWarning)
        gc.collect()


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    """A new, empty bucket (unique name; moto keeps buckets for the session)."""
    name = unique_bucket_name()
    create_bucket(moto_endpoint, name)
    return name


@pytest.fixture
def s3_options(s3_proxy: S3Proxy) -> dict[str, Any]:
    """``storage_options`` reaching moto through this test's proxy."""
    return s3_storage_options(s3_proxy.endpoint_url)


@pytest.fixture
def s3_direct_options(moto_endpoint: str) -> dict[str, Any]:
    """``storage_options`` reaching moto directly (to check what the server holds)."""
    return s3_storage_options(moto_endpoint)
