"""Hostile stores, grown by hypothesis: arbitrary JSON in documents and descriptions, flipped
bytes in pickles and shards.  In process (these inputs cannot crash it any more; the forked
suite in ``test_hostile_stores.py`` covers what could): every read is a success with the
store's own rows, or a named error."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_stores import OUTSIDE_BASE, write_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rbzarr import CheckpointNotFoundError, CorruptStoreError, UnsafePathError
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer

pytestmark = pytest.mark.timeout(600)

NAMED = (CorruptStoreError, UnsafePathError, CheckpointNotFoundError)
FUZZ = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def stores() -> Iterator[dict[str, Path]]:
    with tempfile.TemporaryDirectory() as root:
        found = {kind: Path(root) / kind for kind in ("zarr", "zarrz", "pkl", "pt")}
        for kind, path in found.items():
            write_store(path, kind)
        yield found


def _every_read(path: Path, own_rows: bool = True) -> None:
    """Sample and verify the store: a batch (of its own rows, when ``own_rows``: flipped
    bytes in an unchecksummed shard decode to other values) or a named error."""
    with contextlib.suppress(NAMED):
        batch = open_buffer(str(path), seed=0).sample(16)
        assert not own_rows or float(batch["rewards"].abs().max()) < OUTSIDE_BASE
    with contextlib.suppress(NAMED):
        verify_store(str(path))


def _copy(source: Path) -> Path:
    target = Path(tempfile.mkdtemp()) / "store"
    shutil.copytree(source, target)
    return target


@FUZZ
@given(
    field=st.sampled_from(
        ["trajectory_id", "num_samples", "shape", "max_episode_length", "model_weights_id", "uuid"]
    ),
    value=JSON,
    kind=st.sampled_from(["zarr", "pt", "pkl"]),
)
def test_any_json_value_in_an_index_entry(
    stores: dict[str, Path], field: str, value: Any, kind: str
) -> None:
    path = _copy(stores[kind])
    try:
        index = path / "trajectory_index.json"
        document = json.loads(index.read_text())
        document["trajectory_index"]["0"][field] = value
        index.write_text(json.dumps(document))
        _every_read(path)
    finally:
        shutil.rmtree(path.parent)


@FUZZ
@given(
    field=st.sampled_from(["kind", "shape", "dtype", "inner", "shard_bytes", "inline"]),
    value=JSON,
    kind=st.sampled_from(["zarr", "zarrz"]),
)
def test_any_json_value_in_a_layout_description(
    stores: dict[str, Path], field: str, value: Any, kind: str
) -> None:
    path = _copy(stores[kind])
    try:
        group = path / "trajectories" / "0" / "zarr.json"
        document = json.loads(group.read_text())
        document["attributes"]["rbzarr_layout"]["arrays"]["rewards"][field] = value
        group.write_text(json.dumps(document))
        _every_read(path)
    finally:
        shutil.rmtree(path.parent)


# torch warns about a pickle protocol byte it does not expect: a warning, not an error.
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@FUZZ
@given(
    flips=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6
    ),
    kind=st.sampled_from(["pkl", "pt", "zarrz"]),
)
def test_flipped_bytes_in_a_trajectory_file_or_shard(
    stores: dict[str, Path], flips: list[tuple[int, int]], kind: str
) -> None:
    path = _copy(stores[kind])
    try:
        if kind == "zarrz":
            target = next(
                p
                for p in (path / "trajectories" / "0" / "rewards").rglob("*")
                if p.is_file() and p.name != "zarr.json"
            )
        else:
            target = next(path.glob(f"trajectory_0_*.{kind}"))
        data = bytearray(target.read_bytes())
        for position, value in flips:
            data[position % len(data)] = value
        target.write_bytes(bytes(data))
        _every_read(path, own_rows=False)
    finally:
        shutil.rmtree(path.parent)
