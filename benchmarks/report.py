"""Results as aligned text tables and a chart; the shape of a target entry."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["aligned", "failed_targets", "plot", "table", "target", "targets_table", "variants"]


def target(
    name: str,
    meaning: str,
    value: float | None,
    threshold: float,
    op: str,
    reason: str | None = None,
) -> dict[str, Any]:
    """One target: ``met`` is ``value op threshold``, or ``None`` (with ``reason``) when the value
    could not be measured.
    """
    if op not in (">=", "<="):
        raise ValueError(f"target {name!r}: op must be '>=' or '<=', got {op!r}")
    entry: dict[str, Any] = {"target": name, "meaning": meaning, "threshold": threshold, "op": op}
    if value is None:
        return {**entry, "value": None, "met": None, "reason": reason or "not measured"}
    met = value >= threshold if op == ">=" else value <= threshold
    return {**entry, "value": round(value, 3), "met": met}


def failed_targets(documents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Targets measured and not met (``met`` is ``False``; unmeasured ones are not failures)."""
    return [t for document in documents for t in document["targets"] if t["met"] is False]


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """``rows`` under ``headers`` in columns as wide as their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if is_right else cell.ljust(width)
            for cell, width, is_right in zip(cells, widths, right, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def _number(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def table(document: dict[str, Any]) -> str:
    """A results document as aligned text: its figures, then its targets."""
    if document["benchmark"] == "s3":
        parts = [_s3_table(document["results"])]
    elif document["benchmark"] == "datasets":
        parts = [_datasets_table(document["results"])]
    elif document["benchmark"] == "training":
        parts = [_training_table(document["results"])]
    elif document["benchmark"] == "sequences":
        parts = [_sequences_table(document["results"])]
    elif document["benchmark"] in ("distributed", "images"):
        parts = [_figures_table(document["results"])]
    elif document["benchmark"] in ("scale", "lifecycle"):
        parts = []  # its figures are its targets' values (the JSON holds the rest)
    elif document["benchmark"] == "priorities":
        parts = [_priorities_table(document["results"])]
    else:
        parts = [_rows_table(document["results"]), _bytes_table(document["results"])]
        parts.append(_writes_table(document["results"]))
    parts.append(targets_table(document["targets"]))
    parts.extend(f"note: {note}" for note in document["notes"])
    return "\n\n".join(part for part in parts if part)


def _datasets_table(results: dict[str, Any]) -> str:
    """The datasets suite: exactness, frame error against the codec's, throughput, memory."""
    fidelity, memory = results["fidelity"], results["memory"]
    rows = [
        ["store -> LeRobot -> store bit-exact", str(fidelity["store_lerobot_store_bit_exact"])],
        ["LeRobot -> store -> LeRobot bit-exact", str(fidelity["lerobot_store_lerobot_bit_exact"])],
        ["imported frames == PyAV decode", str(fidelity["import_equals_pyav_decode"])],
    ]
    for name in ("codec_round_trip", "export_round_trip"):
        error = fidelity[name]
        rows.append(
            [
                f"{name.replace('_', ' ')} ({fidelity['codec']})",
                f"max {error['max_abs']:.0f}, mean {error['mean_abs']:.2f}, "
                f"PSNR {error['psnr_db']:.1f} dB",
            ]
        )
    rows += [
        ["import frames/s", _number(fidelity["import_frames_s"])],
        ["export frames/s", _number(fidelity["export_frames_s"])],
        [
            f"import frames/s, {memory['episodes']} episodes",
            f"{_number(memory['import_frames_s'])} ({_number(memory['import_episodes_s'])} "
            "episodes/s)",
        ],
        *_throughput_rows(results.get("throughput")),
        ["TorchRL LeRobotExperienceReplay", results["torchrl_lerobot"].get("unavailable", "")],
        [
            f"peak import memory, {memory['episodes']} episodes",
            f"{(memory['python_numpy_peak'] + memory['arrow_peak']) / 1e6:,.2f} MB = "
            f"{memory['peak_vs_largest_episode']:.2f}x the largest episode "
            f"({memory['largest_episode_bytes'] / 1e6:,.2f} MB)",
        ],
    ]
    return aligned(["datasets", "value"], rows, [False, False])


def _throughput_rows(throughput: dict[str, Any] | None) -> list[list[str]]:
    """Export / import frames/s per dataset format, and LeRobot's own writer."""
    if throughput is None:
        return []
    where = f"{throughput['episodes']} short numeric episodes"
    rows = []
    for name, measured in throughput["formats"].items():
        value = measured.get("unavailable") or (
            f"export {_number(measured['export_frames_s'])}, "
            f"import {_number(measured['import_frames_s'])} frames/s"
        )
        rows.append([f"{name}, {where}", value])
    writer = throughput["lerobot_writer"]
    rows.append(
        [
            f"LeRobot's own writer, {where}",
            writer.get("unavailable") or f"{_number(writer['frames_s'])} frames/s",
        ]
    )
    return rows


def _training_table(results: dict[str, Any]) -> str:
    rows = []
    for workload, entry in results.items():
        for store in ("local", "s3"):
            if "unavailable" in entry[store]:
                rows.append([workload, store, "n/a", "", "", "", "", entry[store]["unavailable"]])
                continue
            for mode in ("no_prefetch", "prefetch"):
                found = entry[store][mode]
                requests = found.get("requests_per_step")
                ratio = entry.get("s3_vs_local", {}).get(mode) if store == "s3" else None
                rows.append(
                    [
                        workload,
                        store,
                        f"{mode} ({found['prefetch']})",
                        _number(found["steps_s"], 1),
                        _number(found["rows_s"]),
                        _number(found["wait_p50_ms"], 2),
                        "" if ratio is None else f"{ratio:.3f}x local",
                        "" if requests is None else f"{requests:,.0f} requests/step",
                    ]
                )
    head = ["workload", "store", "mode", "steps/s", "rows/s", "wait p50 ms", "vs local", ""]
    return aligned(head, rows, [False, False, False, True, True, True, True, False])


def _sequences_table(results: dict[str, Any]) -> str:
    """Sequence rows/s (disk and hot, with their peers), the measured ratio, the mix."""
    rows = []
    for mode, names in (
        ("disk", (("zarr", "rbzarr sample_sequences"), ("torchrl_slice", "TorchRL SliceSampler"))),
        ("hot", (("buffer", "rbzarr sample_sequences"), ("limit", "limit: one index_select"))),
    ):
        for key, label in names:
            figures = results[mode][key]
            if "unavailable" in figures:
                rows.append([mode, label, "-", figures["unavailable"]])
                continue
            rows.append([mode, label, _number(figures["rows_s"]), f"{figures['p50_ms']:.2f} ms"])
    rate = results["rate"]
    rows.append(
        [
            "rate",
            f"samples_per_insert={rate['samples_per_insert']:g}",
            f"{rate['measured']:.2f}",
            "",
        ]
    )
    mixing = results["mixing"]
    rows.append(["mixing", f"{mixing['batches']} batches", f"{mixing['wrong_batches']} wrong", ""])
    return aligned(["mode", "variant", "rows/s", "p50"], rows, [False, False, True, True])


def _figures_table(results: dict[str, Any], prefix: str = "") -> str:
    """Nested figures as ``path  value`` lines (the distributed suite)."""
    lines = []
    for key, value in results.items():
        if isinstance(value, dict):
            lines.append(_figures_table(value, f"{prefix}{key}/"))
        else:
            shown = f"{value:,.4g}" if isinstance(value, float) else str(value)
            lines.append(f"{prefix}{key:<{max(1, 32 - len(prefix))}} {shown}")
    return "\n".join(lines)


def _rows_table(results: dict[str, Any]) -> str:
    rows = []
    for workload, entry in results.items():
        for mode, variant, found in variants(entry):
            if "unavailable" in found:
                rows.append([workload, mode, variant, "n/a", "", "", "", found["unavailable"]])
                continue
            read = found.get("bytes_read_per_batch")
            rows.append(
                [
                    workload,
                    mode,
                    variant,
                    _number(found["rows_s"]),
                    _number(found["mb_s"]),
                    _number(found["p50_ms"], 2),
                    _number(found["p99_ms"], 2),
                    "" if read is None else f"{read / 1e6:,.2f} MB read",
                ]
            )
    head = ["workload", "mode", "variant", "rows/s", "MB/s", "p50 ms", "p99 ms", "disk"]
    return aligned(head, rows, [False, False, False, True, True, True, True, False])


def _bytes_table(results: dict[str, Any]) -> str:
    rows = []
    for workload, entry in results.items():
        for mode in ("warm", "cold"):
            if mode not in entry:
                continue
            needed = entry[mode]["needed"]
            rows.append(
                [
                    workload,
                    mode,
                    _number(needed["chunks_per_batch"]),
                    _number(needed["bytes_per_batch"] / 1e6, 2),
                    _number(needed["piece_ranges_per_batch"]),
                    _number(needed["piece_bytes_per_batch"] / 1e6, 2),
                    _number(needed["page_bytes_per_batch"] / 1e6, 2),
                    entry[mode].get("evict_method", "-"),
                ]
            )
    head = ["workload", "mode", "chunks", "chunk MB", "ranges", "row MB", "page MB"]
    head.append("page cache")
    return aligned(head, rows, [False, False, *[True] * 5, False]) if rows else ""


def _writes_table(results: dict[str, Any]) -> str:
    rows = []
    for workload, entry in results.items():
        for fmt, key in (("zarr", "writes"), ("pt", "writes_pt")):
            writes = entry[key]
            add, disk = writes["add"], writes["disk"]
            rows.append(
                [
                    workload,
                    fmt,
                    _number(writes["writer"]["mb_s"]),
                    _number(add["add_p50_ms"], 2),
                    _number(add["memcpy_p50_ms"], 2),
                    _number(disk["raw_bytes"] / 1e6, 1),
                    _number(disk["allocated_bytes"] / 1e6, 1),
                    _number(disk["allocated_vs_raw"], 3),
                    _number(disk["files"]),
                ]
            )
    head = ["workload", "format", "writer MB/s", "add ms", "clone ms", "raw MB", "disk MB"]
    head += ["disk/raw", "files"]
    return aligned(head, rows, [False, False, *[True] * 7])


def _s3_table(results: dict[str, Any]) -> str:
    result = results["image"]
    if "unavailable" in result:
        return f"s3: not run: {result['unavailable']}"
    rows = []
    for name, batch in (
        ("first", result["first_batch"]),
        ("steady median", result["steady_median"]),
    ):
        rows.append(
            [
                name,
                _number(batch["requests"]),
                _number(batch["needed_ranges"]),
                _number(batch["bytes"] / 1e6, 2),
                _number(batch["needed_bytes"] / 1e6, 2),
                _number(1e3 * batch["seconds"], 1),
                _number(1e3 * batch["time_bound_s"], 1),
                _number(batch["rows_s"]),
            ]
        )
    head = ["batch", "requests", "needed ranges", "MB sent", "MB needed", "ms", "bound ms"]
    head.append("rows/s")
    title = (
        f"s3: {result['trajectories']} image trajectories T={result['T']} B={result['B']}, "
        f"{result['batch']} rows per batch, cache off, {1e3 * result['delay_s']:.0f} ms per "
        f"request, concurrency limit {result['concurrency_limit']}"
    )
    undelayed = (
        f"\nthe same batches without the delay: {1e3 * result['undelayed_seconds']:,.0f} ms "
        "(moto and the client alone)"
    )
    return title + "\n" + aligned(head, rows, [False, *[True] * 7]) + undelayed


def _priorities_table(results: dict[str, Any]) -> str:
    """Median ms per step, ours and TorchRL's, per case of the priorities suite."""
    rows = []
    for case in ("hot", "cached", "disk", "uniform", "sequences"):
        if case not in results:  # a run from before the case existed
            continue
        ours, peer = results[case]["ours"], results[case]["torchrl"]
        theirs = "-" if "p50_ms" not in peer else f"{peer['p50_ms']:.3f}"
        rows.append([case, f"{ours['rows']:,}", f"{ours['p50_ms']:.3f}", theirs])
    return aligned(["case", "rows", "ours ms", "torchrl ms"], rows, [False, True, True, True])


def targets_table(found: Sequence[dict[str, Any]]) -> str:
    """Targets as aligned text: met / MISS / n/a, the value against the threshold, and what each one
    measures.
    """
    rows = []
    for entry in found:
        mark = {True: "met", False: "MISS", None: "n/a"}[entry["met"]]
        value = "-" if entry["value"] is None else f"{entry['value']:,}"
        explanation = entry["meaning"] if entry["met"] is not None else entry["reason"]
        rows.append(
            [mark, entry["target"], value, f"{entry['op']} {entry['threshold']:,}", explanation]
        )
    head = ["", "target", "value", "threshold", "meaning"]
    return aligned(head, rows, [False, False, True, False, False])


VARIANTS = {
    "hot": [
        ("buffer", "rbzarr (cache)"),
        ("limit", "limit: one index_select"),
        ("torchrl_tensor", "TorchRL LazyTensorStorage.get"),
        ("rlinf_style", "RLinf-style (flatten + index)"),
        ("per_row_loop", "per-row loop"),
    ],
    "warm": [
        ("zarr", "rbzarr (zarr store)"),
        ("torchrl_memmap", "TorchRL LazyMemmapStorage.get"),
        ("torchrl_sample", "TorchRL ReplayBuffer.sample"),
        ("pt", "whole-file .pt (RLinf)"),
    ],
    "cold": [
        ("zarr", "rbzarr (zarr store)"),
        ("pt", "whole-file .pt (RLinf)"),
        ("limit", "limit: pread needed ranges"),
    ],
}


def variants(entry: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(mode, label, figures)`` of every variant a workload's entry holds, in order."""
    return [
        (mode, label, entry[mode][key])
        for mode, found in VARIANTS.items()
        if mode in entry
        for key, label in found
        if key in entry[mode]
    ]


def plot(document: dict[str, Any], path: Path) -> None:
    """A PNG of rows/s per variant (log scale), one panel per workload."""
    import matplotlib  # noqa: PLC0415  (optional: the analysis extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    entries = document["results"]
    figure, axes = plt.subplots(len(entries), 1, figsize=(9, 3 * len(entries)), squeeze=False)
    for axis, (workload, entry) in zip(axes[:, 0], entries.items(), strict=True):
        measured = [(f"{m} {label}", f) for m, label, f in variants(entry) if "rows_s" in f]
        names, found = zip(*measured, strict=True)
        axis.barh(names, [s["rows_s"] for s in found], color="tab:blue")
        axis.set_xscale("log")
        axis.invert_yaxis()
        axis.set_title(f"{workload} (T={entry['T']}, B={entry['B']}, batch {entry['batch']})")
        axis.set_xlabel("sampled rows/s")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
