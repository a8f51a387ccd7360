"""fsspec backends: how long S3 may stall a call, and which failures mean "storage failed".

:data:`S3_DEFAULTS` (filled in by :func:`with_s3_defaults`) and :func:`bound_retries` bound
how long an unreachable S3 endpoint can stall a call (docs/s3.md says how to tune it).
:func:`translate_errors` is the one boundary where backend failures become rbzarr's: anything
that means "the storage failed" becomes :class:`~rbzarr.errors.StorageUnavailableError`
naming the URL (the backend's error is its ``__cause__``).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import errno
import functools
import importlib
import inspect
import re
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec

from rbzarr.errors import (
    InvalidCodecError,
    InvalidTrajectoryError,
    RbzarrError,
    StorageOptionError,
    StorageUnavailableError,
    StoreNotWritableError,
)
from rbzarr.storage.io.deadlines import deadline_s, no_answer

__all__ = [
    "S3_DEFAULTS",
    "S3_RETRIES",
    "PERMANENT_ERRNOS",
    "backend_errors",
    "bound_retries",
    "bucket_of",
    "check_storage_options",
    "missing_bucket_message",
    "permanent_cause",
    "refused_range",
    "translate_errors",
    "with_s3_defaults",
]

# botocore's own settings for every S3 location unless the caller sets them: give up
# connecting after 5 s and waiting for a response after 20 s, 2 attempts per request.
# s3fs retries a failed request itself (S3_RETRIES times here); the product bounds a call.
# 64 connections, not botocore's 10: a cold batch's requests overlap (measured on moto at
# 20 ms per request: 400 ranged GETs 4.2 s with 10, 3.1 s with 64, 3.1 s with 256).
S3_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 20,
    "retries": {"max_attempts": 2, "mode": "standard"},
    "max_pool_connections": 64,
}
S3_RETRIES = 3
_S3_PROTOCOLS = ("s3", "s3a")
# Object stores whose first path part is a bucket (or container).
_BUCKET_PROTOCOLS = ("s3", "s3a", "gs", "gcs", "az", "abfs")
# Options every fsspec filesystem takes besides its own (instance and listings caches).
_FSSPEC_OPTIONS = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)

# Transport failures of optional backends, none of which derives from OSError: botocore's
# (connection, timeouts, credentials), aiohttp's and obstore's (a missing object is its
# FileNotFoundError, which stays a value).
_TRANSPORT_ERRORS = (
    ("botocore.exceptions", "BotoCoreError"),
    ("aiohttp", "ClientError"),
    ("obstore.exceptions", "BaseError"),
)
# Failures retrying cannot cure: permission, read-only, not a directory, no space or quota.
PERMANENT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENOSPC, errno.EROFS, errno.EDQUOT}
)
# S3 error codes of the same kind (botocore's ``response["Error"]["Code"]``).
_PERMANENT_CODES = frozenset({"NoSuchBucket", "AccessDenied", "InvalidBucketName"})
# Bad input and a missing package: the same task fails the same way every time.
_BAD_INPUT = (ImportError, InvalidCodecError, InvalidTrajectoryError)
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")


def with_s3_defaults(url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with :data:`S3_DEFAULTS` in ``config_kwargs`` and no listings cache for S3
    URLs (caller's keys win)."""
    merged = dict(options)
    protocol = fsspec.core.split_protocol(url)[0]
    if protocol in _S3_PROTOCOLS:
        # A copy: botocore rewrites the ``retries`` dict it is given (max_attempts becomes
        # total_max_attempts), which would change the defaults of every later client.
        defaults = copy.deepcopy(S3_DEFAULTS)
        merged["config_kwargs"] = {**defaults, **dict(merged.get("config_kwargs") or {})}
        # Other processes write the same store (writer slots, documents): a listing cached
        # when the store was empty would hide their commits.
        merged.setdefault("use_listings_cache", False)
    return merged


def bucket_of(url: str) -> str:
    """The bucket (first path part) of an object-store URL; ``""`` for any other URL."""
    protocol, path = fsspec.core.split_protocol(url)
    if protocol not in _BUCKET_PROTOCOLS:
        return ""
    return path.strip("/").split("/", 1)[0]


def missing_bucket_message(bucket: str) -> str:
    """What every path says when the bucket of a store does not exist, with the fix."""
    return (
        f"the bucket {bucket!r} does not exist (or these credentials cannot see it): create "
        f"it, e.g. `aws s3 mb s3://{bucket}` (with --endpoint-url for a local server), or fix "
        "the URL"
    )


def check_storage_options(url: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`~rbzarr.errors.StorageOptionError` for an S3 option that s3fs does not
    take (a misspelled ``endpoint_url``): s3fs hands unknown ones to botocore's session,
    which fails only at the first request, with a ``TypeError`` naming neither."""
    if fsspec.core.split_protocol(url)[0] not in _S3_PROTOCOLS or not options:
        return
    taken = _s3_option_names()
    unknown = sorted(set(options) - taken)
    if not taken or not unknown:
        return  # s3fs missing: opening says what to install
    close = difflib.get_close_matches(unknown[0], taken, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise StorageOptionError(
        f"{url}: unknown storage option {unknown[0]!r}{hint}; s3fs takes {', '.join(sorted(taken))}"
    )


@functools.cache
def _s3_option_names() -> frozenset[str]:
    """The keyword options an ``S3FileSystem`` takes: its own, fsspec's, botocore's session's
    (empty when s3fs is not installed)."""
    try:
        from aiobotocore.session import AioSession  # noqa: PLC0415 (the s3 extra)
        from s3fs import S3FileSystem  # noqa: PLC0415
    except ImportError:
        return frozenset()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return _FSSPEC_OPTIONS | {
        name
        for function in (S3FileSystem.__init__, AioSession.__init__)
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in named and name != "self"
    }


def bound_retries(fs: fsspec.AbstractFileSystem) -> None:
    """Cap an ``S3FileSystem``'s own retries of a failed request (s3fs: 5) at :data:`S3_RETRIES`."""
    if type(fs).__name__ == "S3FileSystem":
        fs.retries = min(int(getattr(fs, "retries", S3_RETRIES)), S3_RETRIES)


@functools.cache
def backend_errors() -> tuple[type[BaseException], ...]:
    """Exception types meaning "the backend failed": OSError, timeouts, botocore's, aiohttp's,
    obstore's."""
    return (OSError, TimeoutError, ConnectionError, *_transport_errors())


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The installed optional backends' transport failures (:data:`_TRANSPORT_ERRORS`)."""
    found: list[type[BaseException]] = []
    for module_name, name in _TRANSPORT_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(getattr(module, name))
    return tuple(found)


def _describe_failure(exc: BaseException) -> str:
    """The backend error in one line, with advice where the cause is a usual one."""
    # obstore appends the Rust error's debug dump; it stays in __cause__, not the message.
    text = " ".join(_summary(exc).split())
    if isinstance(exc, TimeoutError) and not text:
        return no_answer(deadline_s())  # fsspec's FSTimeoutError carries no message
    text = text or type(exc).__name__
    if type(exc).__name__ in _CREDENTIAL_ERRORS:
        return (
            f"no usable credentials ({text}); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, pass storage_options key= and secret=, or anon=True for a "
            "public bucket"
        )
    if isinstance(exc, _transport_errors()):
        return f"{text}; check that the endpoint is up and reachable, then retry"
    return text


# Actions that only look: a path through a file finds nothing there.
_LOOKING = ("reading", "checking", "listing", "opening")


@contextlib.contextmanager
def translate_errors(url: str, action: str) -> Iterator[None]:
    """Turn backend failures in the block into :class:`StorageUnavailableError` naming ``url``.

    ``FileNotFoundError`` (a value: "missing") and rbzarr's own errors pass through unchanged,
    and so does a path through a file when reading (as ``FileNotFoundError``);
    the backend's error is kept as ``__cause__``, so an unreachable object store never reads as
    "empty" or "not found".
    """
    try:
        yield
    except FileNotFoundError as exc:
        bucket = bucket_of(url)
        if action in _LOOKING or not bucket or _error_code(exc) != "NoSuchBucket":
            raise
        raise StoreNotWritableError(
            f"{action} {url!r} failed: {missing_bucket_message(bucket)}"
        ) from exc
    except RbzarrError:
        raise
    except backend_errors() as exc:
        if isinstance(exc, NotADirectoryError) and action in _LOOKING:
            # A file stands where a folder should be: nothing to find, and no retry cures it.
            raise FileNotFoundError(
                exc.errno, f"{exc.strerror} (a file, not a folder)", url
            ) from exc
        raise StorageUnavailableError(f"{action} {url!r} failed: {_describe_failure(exc)}") from exc


def permanent_cause(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s chain (``__cause__``, ``__context__``) that retrying cannot cure
    (an errno of :data:`PERMANENT_ERRNOS`, S3's ``NoSuchBucket`` or ``AccessDenied``, a
    missing package, values a codec cannot encode, an invalid trajectory), else ``None``."""
    for current in _chain(exc):
        if isinstance(current, OSError) and current.errno in PERMANENT_ERRNOS:
            return current
        if isinstance(current, _BAD_INPUT):
            return current
        if _s3_code(current) in _PERMANENT_CODES:
            return current
    return None


def refused_range(exc: BaseException) -> bool:
    """Whether ``exc`` is an object store refusing a byte range past the object's end.

    Judged by the answer, never by text a URL can hold (an endpoint's port or a key may
    read ``416``): HTTP status 416 or S3's error code ``InvalidRange`` in botocore's response
    (through s3fs; a 416 without an XML body has the code ``416``), or the status obstore
    reports.
    """
    return any(_http_status(current) == 416 for current in _chain(exc))


# obstore's words for an answer's status (a URL holds no spaces): the first one is the answer's.
_OBSTORE_STATUS = re.compile(r"non-2xx status code: (\d{3})\b")


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of the answer ``exc`` reports (botocore's response, obstore's message;
    S3's ``InvalidRange`` code counts as 416), else ``None``."""
    if _s3_code(exc) in ("InvalidRange", "416"):
        return 416
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    found = _OBSTORE_STATUS.search(_summary(exc))
    return int(found.group(1)) if found else None


def _summary(exc: BaseException) -> str:
    """``exc``'s message without obstore's appended debug dump."""
    return str(exc).split("Debug source:", 1)[0]


def _error_code(exc: BaseException) -> str | None:
    """The first S3 error code (``NoSuchBucket``) in ``exc``'s chain, else ``None``."""
    return next((code for code in map(_s3_code, _chain(exc)) if code), None)


def _s3_code(exc: BaseException) -> str | None:
    """botocore's ``response["Error"]["Code"]`` of ``exc``, if it has one."""
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
