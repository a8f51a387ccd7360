"""The ``sequences`` bench suite runs, quick, and reports its four targets."""

from __future__ import annotations

from benchmarks.sequences import run_sequences, sequence_targets
from benchmarks.settings import QUICK


def test_quick_sequences_suite_reports_its_targets(tmp_path) -> None:
    results = run_sequences(QUICK, quick=True, workdir=str(tmp_path))
    assert results["mixing"]["wrong_batches"] == 0
    assert results["rate"]["bound_held"]
    assert results["disk"]["zarr"]["rows_s"] > 0 and results["hot"]["vs_limit"] > 0
    found = sequence_targets(results)
    assert [t["target"] for t in found] == [
        "sequences: rows/s >= TorchRL SliceSampler",
        "sequences: hot within 1.5x of one index_select",
        "samples_per_insert: measured within 10% of r",
        "demo rows per batch: exact",
    ]
    assert found[3]["met"] is True
