"""Hostile stores, grown by hypothesis: arbitrary JSON in documents, descriptions and the
index log (heads, blocks, records of two writers' slots), flipped bytes in pickles, shards
and log files.  In process (these inputs cannot crash it any more; the forked suite in
``test_hostile_stores.py`` covers what could): every read is a success with the store's own
rows, whole (every field of a row encodes the same number), or a named error.  Each test
counts the two outcomes and needs both (an example of each is given): a run where every
example was refused, or none was, did not test what it claims."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_rows_consistent, make_trajectory
from hostile_stores import VALID_NUMBERS, edit_json, split_log, write_store
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rbzarr import (
    CheckpointNotFoundError,
    CorruptStoreError,
    TrajectoryReplayBuffer,
    UnsafePathError,
)
from rbzarr.analysis.verify import verify_store
from rbzarr.analysis.view import open_buffer
from rbzarr.storage.index.slots import ID_STRIDE

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
        kinds = ("zarr", "zarrz", "zarrpack", "pkl", "pt")
        found = {kind: Path(root) / kind for kind in kinds}
        for kind, path in found.items():
            write_store(path, kind)
        found["log"] = Path(root) / "log"
        _write_two_slot_log(found["log"])
        yield found


# The two-slot log store: slot 0's trajectories 0-3 (rows 0..31), slot 1's one (rows 32..39).
LOG_NUMBERS = VALID_NUMBERS + 8
# The ids any of the stores holds (the others: 0-3).
STORE_IDS = {0, 1, 2, 3, ID_STRIDE}


def _write_two_slot_log(path: Path) -> None:
    """A zarr store indexed by its log: slot 0 (``index/``) as a running writer leaves it (a
    block and two records, :func:`split_log`), slot 1 (``writers/1/index/``) folded."""
    first = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    second = TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path))
    first.add_trajectories([make_trajectory(4, 2, 8 * i) for i in range(4)])
    second.add_trajectories([make_trajectory(4, 2, VALID_NUMBERS)])
    second.close()
    first.close()
    split_log(path)


def _log_files(path: Path) -> list[Path]:
    """Every file of the store's index logs (heads, blocks, records), in a stable order."""
    found = [*(path / "index").rglob("*.json"), *(path / "writers").rglob("index/**/*.json")]
    return sorted(p for p in found if p.is_file())


def _outcome(path: Path, rows_below: int | None = VALID_NUMBERS) -> str:
    """Verify and sample the store: ``"named"`` (a named error) or ``"read"`` (every sampled
    row whole, one of the store's: its ids and numbers below ``rows_below``; ``None`` for
    flipped bytes, which decode to other values in an unchecksummed shard); anything else
    (an unnamed error, wrong rows) fails the test.  ``verify`` reports or raises a named
    error."""
    with contextlib.suppress(NAMED):
        verify_store(str(path))
    try:
        view = open_buffer(str(path), seed=0)
        batch = view.sample(16)
    except NAMED:
        return "named"
    if rows_below is not None:
        assert set(view.ids) <= STORE_IDS, view.ids
        numbers = assert_rows_consistent(batch)
        assert int(numbers.min()) >= 0 and int(numbers.max()) < rows_below, numbers
    return "read"


def _copy(source: Path) -> Path:
    target = Path(tempfile.mkdtemp()) / "store"
    shutil.copytree(source, target)
    return target


def test_any_json_value_in_an_index_entry(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @FUZZ
    @example(field="shape", value="x", kind="zarr")  # refused: not a shape
    @example(field="uuid", value="x", kind="pt")  # read: a uuid is only kept
    @given(
        field=st.sampled_from(
            [
                *("trajectory_id", "num_samples", "shape", "max_episode_length"),
                *("model_weights_id", "uuid"),
            ]
        ),
        value=JSON,
        kind=st.sampled_from(["zarr", "pt", "pkl"]),
    )
    def check(field: str, value: Any, kind: str) -> None:
        def change(root: Path) -> None:
            entries = root / "trajectory_index.json"
            edit_json(entries, lambda d: d["trajectory_index"]["0"].update({field: value}))

        outcomes[_outcome_after(stores[kind], change)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


def test_any_json_value_in_a_layout_description(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @FUZZ
    @example(field="shape", value=-1, kind="zarr")  # refused: not a shape
    @example(field="kind", value="chunked", kind="zarrz")  # read: what it says already
    @given(
        field=st.sampled_from(["kind", "shape", "dtype", "inner", "shard_bytes", "inline"]),
        value=JSON,
        kind=st.sampled_from(["zarr", "zarrz"]),
    )
    def check(field: str, value: Any, kind: str) -> None:
        def change(root: Path) -> None:
            edit_json(
                root / "trajectories" / "0" / "zarr.json",
                lambda d: d["attributes"]["rbzarr_layout"]["arrays"]["rewards"].update(
                    {field: value}
                ),
            )

        outcomes[_outcome_after(stores[kind], change)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


def test_any_json_value_in_a_pack_reference_or_a_packs_attributes(
    stores: dict[str, Path],
) -> None:
    """A member's reference to its pack (``rbzarr_layout.pack``) or the pack's own
    attributes (its member list, shape, fields, description) replaced by any JSON value."""
    outcomes: Counter[str] = Counter()

    @FUZZ
    @example(where="reference", field="group", value="packs/../../x")  # refused: not a name
    @example(where="pack", field="shape", value=[16, 2])  # read: what it says already
    @given(
        where=st.sampled_from(["reference", "pack"]),
        field=st.sampled_from(["group", "member", "members", "shape", "rbzarr_pack", "fields"]),
        value=JSON,
    )
    def check(where: str, field: str, value: Any) -> None:
        def change(root: Path) -> None:
            if where == "reference":
                edit_json(
                    root / "trajectories" / "1" / "zarr.json",
                    lambda d: d["attributes"]["rbzarr_layout"]["pack"].update({field: value}),
                )
                return
            (pack,) = (p for p in (root / "packs").iterdir() if p.is_dir())
            edit_json(pack / "zarr.json", lambda d: d["attributes"].update({field: value}))

        outcomes[_outcome_after(stores["zarrpack"], change)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


# torch warns about a pickle protocol byte it does not expect: a warning, not an error.
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_flipped_bytes_in_a_trajectory_file_or_shard(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @FUZZ
    @example(flips=[(0, 0)], kind="pkl")  # refused: no pickle opcode 0
    @example(flips=[(0, 0x80)], kind="pkl")  # read: the byte it was (PROTO)
    @given(
        flips=st.lists(
            st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=6
        ),
        kind=st.sampled_from(["pkl", "pt", "zarrz"]),
    )
    def check(flips: list[tuple[int, int]], kind: str) -> None:
        def change(root: Path) -> None:
            if kind == "zarrz":
                target = next(
                    p
                    for p in (root / "trajectories" / "0" / "rewards").rglob("*")
                    if p.is_file() and p.name != "zarr.json"
                )
            else:
                target = next(root.glob(f"trajectory_0_*.{kind}"))
            _flip(target, flips)

        outcomes[_outcome_after(stores[kind], change, rows_below=None)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


# Each log example verifies and samples a copy of a store: fewer examples keep them cheap.
LOG_FUZZ = settings(FUZZ, max_examples=12)
LOG_FILES = 6  # slot 0: block, head, two records; slot 1: block, head (_log_files' order)


def _outcome_after(
    store: Path, change: Callable[[Path], None], rows_below: int | None = VALID_NUMBERS
) -> str:
    """:func:`_outcome` of a copy of ``store`` that ``change`` tampered with (given its root)."""
    path = _copy(store)
    try:
        change(path)
        return _outcome(path, rows_below)
    finally:
        shutil.rmtree(path.parent)


def _flip(target: Path, flips: list[tuple[int, int]]) -> None:
    """Set the bytes of ``target`` at each position (modulo its size) to each value."""
    data = bytearray(target.read_bytes())
    for position, value in flips:
        data[position % len(data)] = value
    target.write_bytes(bytes(data))


def _in_log_file(file: int, change: Callable[[Path], None]) -> Callable[[Path], None]:
    """Apply ``change`` to a store's log file ``file`` (in :func:`_log_files`' order)."""
    return lambda root: change(_log_files(root)[file])


def _set_field(field: str, value: Any, position: int | None = None) -> Callable[[Path], None]:
    """Set ``field`` of a JSON log file (of its entry at ``position``, when given)."""

    def change(document: dict[str, Any]) -> None:
        if position is None:
            document[field] = value
        else:
            entries = document["entries"]
            entries[position % len(entries)][field] = value

    return lambda target: edit_json(target, change)


def test_the_two_slot_log_store_reads_whole(stores: dict[str, Path]) -> None:
    files = _log_files(stores["log"])
    assert [p.parent.name for p in files] == ["blocks", "index", "log", "log", "blocks", "index"]
    assert set(open_buffer(str(stores["log"]), seed=0).ids) == STORE_IDS
    assert _outcome(stores["log"], LOG_NUMBERS) == "read"


def test_any_json_value_in_a_log_file(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @LOG_FUZZ
    @example(file=1, field="blocks", value=5)  # refused: the head lists no blocks
    @example(file=2, field="time", value=0)  # read: a record's time is only kept
    @given(
        file=st.integers(0, LOG_FILES - 1),
        field=st.sampled_from(
            [
                *("version", "blocks", "size", "compacted_seq", "trajectory_counter"),
                *("metadata", "entries", "times", "seq", "counter", "time", "next_slot"),
            ]
        ),
        value=JSON,
    )
    def check(file: int, field: str, value: Any) -> None:
        change = _in_log_file(file, _set_field(field, value))
        outcomes[_outcome_after(stores["log"], change, LOG_NUMBERS)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


def test_any_json_value_in_a_log_entry(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @LOG_FUZZ
    @example(file=2, position=0, field="trajectory_id", value=ID_STRIDE)  # refused: slot 1's
    @example(file=0, position=1, field="uuid", value="x")  # read: a uuid is only kept
    @given(
        file=st.sampled_from([0, 2, 3, 4]),  # blocks and records
        position=st.integers(0, 1),
        field=st.sampled_from(
            [
                *("trajectory_id", "num_samples", "shape", "max_episode_length"),
                *("model_weights_id", "uuid"),
            ]
        ),
        value=JSON,
    )
    def check(file: int, position: int, field: str, value: Any) -> None:
        change = _in_log_file(file, _set_field(field, value, position))
        outcomes[_outcome_after(stores["log"], change, LOG_NUMBERS)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes


def test_flipped_bytes_in_a_log_file_or_a_log_file_gone(stores: dict[str, Path]) -> None:
    outcomes: Counter[str] = Counter()

    @LOG_FUZZ
    @example(file=1, flips=[(0, 0)], remove=False)  # refused: the head is not JSON
    @example(file=2, flips=[(7, 9)], remove=False)  # read: a space became a tab
    @given(
        file=st.integers(0, LOG_FILES - 1),
        flips=st.lists(
            st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4
        ),
        remove=st.booleans(),
    )
    def check(file: int, flips: list[tuple[int, int]], remove: bool) -> None:
        def change(target: Path) -> None:
            if remove:
                target.unlink()
            else:
                _flip(target, flips)

        outcomes[_outcome_after(stores["log"], _in_log_file(file, change), LOG_NUMBERS)] += 1

    check()
    assert set(outcomes) == {"named", "read"}, outcomes
