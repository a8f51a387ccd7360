"""The performance targets, and the results as aligned text tables and a chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["aligned", "failed_targets", "plot", "table", "target", "targets"]


def target(
    name: str,
    meaning: str,
    value: float | None,
    threshold: float,
    op: str,
    reason: str | None = None,
) -> dict[str, Any]:
    """One target: ``met`` is ``value op threshold``, or ``None`` (with ``reason``) when the
    value could not be measured.

    Raises
    ------
    ValueError
        ``op`` is not ``">="`` or ``"<="``.
    """
    if op not in (">=", "<="):
        raise ValueError(f"target {name!r}: op must be '>=' or '<=', got {op!r}")
    entry: dict[str, Any] = {"target": name, "meaning": meaning, "threshold": threshold, "op": op}
    if value is None:
        return {**entry, "value": None, "met": None, "reason": reason or "not measured"}
    met = value >= threshold if op == ">=" else value <= threshold
    return {**entry, "value": round(value, 3), "met": met}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of a sampling run, each with its measured value and whether it holds."""
    out = []
    for name, entry in results.items():
        cold = entry["cold_zarr"]
        if name != "state":
            out.append(
                target(
                    f"{name}: hot within 1.5x of memory bandwidth",
                    "hot limit rows/s / hot buffer rows/s (one index_select of the same bytes)",
                    entry["hot"]["vs_limit"],
                    1.5,
                    "<=",
                )
            )
        out += [
            target(
                f"{name}: cold zarr >= 3x pt rows/s",
                "cold zarr rows/s / whole-file .pt rows/s, same window and cache",
                entry["cold_zarr_vs_pt"],
                3.0,
                ">=",
            ),
            target(
                f"{name}: bytes read <= 2x touched chunks",
                "bytes read per batch / compressed bytes of the chunks holding missed rows",
                cold["read_vs_needed"],
                2.0,
                "<=",
            ),
            target(
                f"{name}: add_trajectories (auto_save) within 2x memcpy",
                "add_trajectories p50 / clone p50 of the same trajectory",
                cold["add"]["add_vs_memcpy"],
                2.0,
                "<=",
            ),
            target(
                f"{name}: writer >= 200 MB/s",
                "raw MB / seconds from the first add until flush returns",
                cold["write"]["mb_s"],
                200.0,
                ">=",
            ),
        ]
    return out


def failed_targets(documents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Targets measured and not met (``met`` is ``False``; unmeasured ones are not failures)."""
    return [t for document in documents for t in document["targets"] if t["met"] is False]


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """``rows`` under ``headers`` in columns as wide as their widest cell.

    Parameters
    ----------
    headers
        Column titles.
    rows
        Cells, already formatted as text.
    right
        Per column, whether it is right-aligned (numbers) or left-aligned.

    Returns
    -------
    str
        The table, a rule under the headers, no trailing spaces.
    """
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
    """The results of a sampling run as aligned text: variants, storage, then targets."""
    results = document["results"]
    variants = [
        [
            workload,
            variant,
            _number(s["rows_s"]),
            _number(s["mb_s"]),
            _number(s["p50_ms"], 2),
            _number(s["p99_ms"], 2),
        ]
        for workload, entry in results.items()
        for variant, s in _variants(entry)
    ]
    head = ["workload", "variant", "rows/s", "MB/s", "p50 ms", "p99 ms"]
    parts = [aligned(head, variants, [False, False, True, True, True, True])]
    storage = [
        [
            workload,
            fmt,
            _number(entry[f"cold_{fmt}"]["bytes_read_per_batch"] / 1e6, 2),
            _number(entry[f"cold_{fmt}"]["needed_bytes_per_batch"] / 1e6, 2),
            _number(entry[f"cold_{fmt}"]["add"]["add_p50_ms"], 2),
            _number(entry[f"cold_{fmt}"]["add"]["memcpy_p50_ms"], 2),
            _number(entry[f"cold_{fmt}"]["write"]["mb_s"]),
            _number(entry[f"cold_{fmt}"]["disk"]["bytes_per_sample"]),
            _number(entry[f"cold_{fmt}"]["disk"]["ratio"], 2),
        ]
        for workload, entry in results.items()
        for fmt in ("zarr", "pt")
    ]
    head = ["workload", "format", "MB read/batch", "MB needed", "add ms", "clone ms"]
    head += ["writer MB/s", "disk B/sample", "ratio"]
    parts.append(aligned(head, storage, [False, False, *[True] * 7]))
    parts.append(targets_table(document["targets"]))
    parts.extend(f"note: {note}" for note in document["notes"])
    return "\n\n".join(parts)


def targets_table(found: Sequence[dict[str, Any]]) -> str:
    """Targets as aligned text: met / MISS / n/a, the value against the threshold, and what
    each one measures."""
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


def _variants(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    hot, zarr_cold, pt_cold = entry["hot"], entry["cold_zarr"], entry["cold_pt"]
    found = [
        ("hot buffer", hot["buffer"]),
        ("hot limit (index_select)", hot["limit"]),
        ("hot rlinf-style", hot["rlinf_style"]),
    ]
    if "per_row_loop" in hot:
        found.append(("hot per-row loop", hot["per_row_loop"]))
    return [
        *found,
        ("cold zarr", zarr_cold["buffer"]),
        ("cold limit (read+decode)", zarr_cold["limit"]),
        ("cold pt (whole files)", pt_cold["buffer"]),
    ]


def plot(document: dict[str, Any], path: Path) -> None:
    """A PNG of rows/s per variant (log scale), one panel per workload."""
    import matplotlib  # noqa: PLC0415  (optional: the analysis extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    entries = document["results"]
    figure, axes = plt.subplots(len(entries), 1, figsize=(9, 3 * len(entries)), squeeze=False)
    for axis, (workload, entry) in zip(axes[:, 0], entries.items(), strict=True):
        names, found = zip(*_variants(entry), strict=True)
        axis.barh(names, [s["rows_s"] for s in found], color="tab:blue")
        axis.set_xscale("log")
        axis.invert_yaxis()
        axis.set_title(f"{workload} (T={entry['T']}, B={entry['B']}, batch {entry['batch']})")
        axis.set_xlabel("sampled rows/s")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
