"""Image bombs (issue 49): a frame whose stream claims 12000 x 12000 (432 MB decoded) where
its array declares 32 x 32 is refused before it is decoded, by every operation a user runs
and by plain zarr, in the memory a clean store's operation takes (+16 MiB at most), each
with a named error naming the trajectory and key.

Each case runs in a child whose address space may grow by 256 MiB only: a decode that
allocates what the stream's header says fails there (``MemoryError``), and the messages
checked here (the declared frame and the stream's shape) are the bounded decode's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hostile_stores import (
    OPERATIONS,
    Case,
    check_case,
    prepare,
    run_capped,
    run_case,
    snapshot,
)
from image_bombs import (
    BOMB_SIDE,
    FRAME_SIDE,
    KEY,
    STREAMS,
    bomb,
    decode_entry_points,
    plant_bomb,
    spec_of,
    write_image_store,
)

from rbzarr.storage.zarr.codecs import IMAGE_CODECS

pytest.importorskip("imagecodecs")
pytestmark = pytest.mark.timeout(600)

# Every operation: the hostile suite's (repair last: it drops the trajectory) and more.
BOMB_OPERATIONS = (
    *OPERATIONS[:-1],
    "sample_one",
    "trajectory",
    "stats",
    "recode",
    "plain_zarr",
    OPERATIONS[-1],
)
# What each operation ends in on a store holding a bomb (others: CorruptStoreError); verify
# reports the trajectory unreadable, and repair drops it.
SUCCEEDS = {"info": "ok", "verify": "ok", "repair": "ok"}
# The address space a case may add: below one bomb's decode (432 MB).
BOMB_ADDRESS_SPACE = 256 << 20
# How much more peak resident memory an operation may take on a bomb than on a clean store.
PEAK_MARGIN = 16 << 20
DECLARED = f"declared frame [{FRAME_SIDE}, {FRAME_SIDE}, 3]"
STREAM = f"({BOMB_SIDE}, {BOMB_SIDE}, 3)"

LAYOUTS = ("hwc", "chw")
LOCATIONS = ("local", "memory")
# Quick cases (the others are slow): every codec's entry points are checked quickly by
# test_every_image_codec_decodes_only_into_the_declared_frame.
QUICK = {("png", "chw", "local"), ("qoi", "hwc", "memory")}
CASES = [
    pytest.param(
        name,
        layout,
        location,
        id=f"{name}-{layout}-{location}",
        marks=() if (name, layout, location) in QUICK else pytest.mark.slow,
    )
    for name in IMAGE_CODECS
    for layout in LAYOUTS
    for location in LOCATIONS
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Clean image stores by ``zarr-<codec>-<layout>``, written when first asked for."""
    return {}


def _case(root: Path, name: str, layout: str, stores: dict[str, Path], folder: Path) -> Case:
    kind = f"zarr-{name}-{layout}"
    if kind not in stores:
        stores[kind] = stores[f"outside-{kind}"] = folder / kind
        write_image_store(stores[kind], spec_of(name), layout)
    return prepare(root, kind, stores)


def _run(case: Case, url: str | None) -> dict[str, dict[str, Any]]:
    before = snapshot(case.outside)
    outcome = run_case(case, url=url, operations=BOMB_OPERATIONS, address_space=BOMB_ADDRESS_SPACE)
    check_case(case, before, outcome, BOMB_OPERATIONS)
    return {report["operation"]: report for report in outcome.reports}


@pytest.mark.parametrize(("name", "layout", "location"), CASES)
def test_a_bomb_frame_is_refused_by_every_operation_in_bounded_memory(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    stores: dict[str, Path],
    name: str,
    layout: str,
    location: str,
) -> None:
    folder = tmp_path_factory.getbasetemp() / "image-stores"
    folder.mkdir(exist_ok=True)
    reports = {}
    for label in ("clean", "planted"):
        case = _case(tmp_path / label, name, layout, stores, folder)
        if label == "planted":
            plant_bomb(case.store, bomb(name))
        url = f"memory://bombs-{name}-{layout}-{label}/store" if location == "memory" else None
        reports[label] = _run(case, url)
    clean, planted = reports["clean"], reports["planted"]
    assert {op: r.get("error", "ok") for op, r in clean.items()} == dict.fromkeys(
        BOMB_OPERATIONS, "ok"
    )
    for operation, report in planted.items():
        want = SUCCEEDS.get(operation, "CorruptStoreError")
        assert report.get("error", "ok") == want, report
        message = report.get("message") or " ".join(report.get("messages", []))
        if operation == "verify":
            assert report["problems"] == ["unreadable_data"], report
        if operation not in ("info", "repair"):  # repair drops the trajectory: none left
            assert DECLARED in message and STREAM in message, report
            if operation != "plain_zarr":  # zarr's codecs are not told the array's path
                assert f"trajectories/0/{KEY}" in message, report
        growth = report["peak_growth"] - clean[operation]["peak_growth"]
        assert growth <= PEAK_MARGIN, (operation, growth, report)
    log = os.environ.get("RBZARR_HOSTILE_REPORT")
    if log:  # the peaks, for people
        with open(log, "a") as handle:
            peaks = {
                op: [clean[op]["peak_growth"], planted[op]["peak_growth"]] for op in BOMB_OPERATIONS
            }
            handle.write(json.dumps({"case": f"bomb-{name}-{layout}-{location}", **peaks}) + "\n")


def test_every_image_codec_decodes_only_into_the_declared_frame(tmp_path: Path) -> None:
    """The decode entry points of every image codec rbzarr writes (listed by its registry,
    :data:`IMAGE_CODECS`), fed a bomb in a capped child: each refuses it at once."""
    missing = [name for name in IMAGE_CODECS if name not in STREAMS]
    assert not missing, f"add a bomb stream for {missing} to image_bombs.STREAMS"
    streams = {(name, 3): bomb(name) for name in IMAGE_CODECS}
    streams["png", 1] = bomb("png", channels=1)  # grey frames: [H, W, 1] declared
    found = run_capped(decode_entry_points, (streams, str(tmp_path)), BOMB_ADDRESS_SPACE)
    entries = {"Codec.decode_frame", "local.decoder hwc", "local.decoder chw", "zarr hwc"}
    assert {(r["codec"], r["channels"], r["entry"]) for r in found} == {
        (name, channels, entry) for name, channels in streams for entry in (*entries, "zarr chw")
    }
    for report in found:
        channels = report["channels"]
        declared = f"declared frame [{FRAME_SIDE}, {FRAME_SIDE}, {channels}]"
        stream = f"({BOMB_SIDE}, {BOMB_SIDE}" + (", 3)" if channels == 3 else ")")
        assert report["error"] in ("ValueError", "CorruptStoreError"), found
        assert declared in report["message"] and stream in report["message"], report
        assert report["peak_growth"] <= PEAK_MARGIN, report
