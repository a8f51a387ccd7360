"""The plain-text forms of the reports the command line prints without ``--json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rbzarr.analysis.verify import VerifyReport

__all__ = ["info_lines", "ls_lines", "stats_lines", "verify_lines"]


def info_lines(report: dict[str, Any]) -> list[str]:
    """``rbzarr info``: the store, its counts and sizes, then one line per key."""
    ratio = report["stored_over_raw"]
    layout = "" if report.get("layout_version") is None else f"  layout={report['layout_version']}"
    lines = [
        f"{report['url']}  format={report['format']}{layout}",
        f"trajectories={report['trajectories']}  samples={report['total_samples']}  "
        f"next id={report['trajectory_counter']}  seed={report['seed']}",
        f"data: {report['bytes_on_disk']} bytes on disk, {report['raw_bytes']} raw, "
        f"stored/raw={'-' if ratio is None else f'{ratio:.3f}'}",
        _costs_line(report["store"], report["raw_bytes"]),
    ]
    lines.extend(
        f"  {key:<28} {item['dtype']:<9} shape={item['shape']}{_stored_shape(item)} "
        f"chunks={item['chunks']} "
        f"codec={item.get('codec_spec') or item['codec']} raw={item['raw_bytes']} "
        f"disk={item['bytes_on_disk']}{_stored_vs_raw(item)}{_psnr(item)}"
        for key, item in report["keys"].items()
    )
    return lines


def _stored_shape(item: dict[str, Any]) -> str:
    """`` (stored once: [8, 1, 128, 128, 3])``: the rows a ``next_obs`` key keeps itself."""
    stored = item.get("stored_shape")
    return "" if stored is None else f" (stored once: {stored})"


def _stored_vs_raw(item: dict[str, Any]) -> str:
    """`` stored/raw=0.13`` when the key's bytes on disk are known."""
    if item["bytes_on_disk"] is None or not item["raw_bytes"]:
        return ""
    return f" stored/raw={item['bytes_on_disk'] / item['raw_bytes']:.3f}"


def _psnr(item: dict[str, Any]) -> str:
    """`` psnr>=41.9dB``: the worst trajectory's PSNR a lossy codec recorded at encode."""
    if "psnr" not in item:
        return ""
    return f" psnr>={item['psnr']:.1f}dB"


def _costs_line(costs: dict[str, Any], raw: int) -> str:
    """What the whole store costs: files, their bytes (JSON documents apart), disk blocks."""
    disk = costs["disk_usage"]
    used = "" if disk is None else f", {_mb(disk)} on disk (blocks, as du counts)"
    return (
        f"store: {costs['files']} files of {_mb(costs['file_bytes'])}{used}; "
        f"{costs['json_files']} JSON documents of {_mb(costs['json_bytes'])}; "
        f"{_mb(raw)} of raw data"
    )


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def ls_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``rbzarr ls``: a header, then one line per trajectory."""
    header = f"{'id':>6}  {'uuid':<36}  {'shape':<14} {'samples':>9}  {'bytes':>12}  weights"
    return [header] + [
        f"{row['trajectory_id']:>6}  {row['uuid']!s:<36}  {row['shape']!s:<14} "
        f"{row['num_samples']:>9}  {row['bytes']:>12}  {row['model_weights_id']}"
        + ("  MISSING DATA (see `rbzarr verify`)" if row.get("missing") else "")
        for row in rows
    ]


def stats_lines(report: dict[str, Any]) -> list[str]:
    """``rbzarr stats``: counts, one line per key, then the episodes' lengths and returns."""
    lines = [f"trajectories={report['trajectories']}  samples={report['total_samples']}"]
    lines.extend(
        f"  {key:<28} {_stats_text(item)}{_sample_text(item)}"
        for key, item in report["keys"].items()
    )
    episodes = report["episodes"]
    if episodes is None:
        return [*lines, "episodes: no 'dones' field"]
    lines.append(f"episodes: {episodes['complete']} complete, {episodes['incomplete']} incomplete")
    lines.append(f"  {'length':<28} {_stats_text(episodes['length'])}")
    if episodes["return"] is not None:
        lines.append(f"  {'return':<28} {_stats_text(episodes['return'])}")
    return lines


def verify_lines(report: VerifyReport) -> list[str]:
    """``rbzarr verify``: what was checked, repaired, what remains, the dropped ids."""
    lines = [f"{report.url}: {report.trajectories} indexed trajectories checked"]
    lines.extend(f"repaired  {p.kind:<20} {p.path}: {p.message}" for p in report.repaired)
    lines.extend(f"PROBLEM   {p.kind:<20} {p.path}: {p.message}" for p in report.problems)
    lines.extend(f"note      {p.kind:<20} {p.path}: {p.message}" for p in report.notes)
    if report.dropped_ids:
        lines.append(f"dropped from the index: ids {report.dropped_ids}")
    lines.append("ok" if report.ok else f"{len(report.problems)} problem(s)")
    return lines


def _sample_text(item: dict[str, Any]) -> str:
    """`` (frames of 4 of 200 trajectories; ...)`` for an image key summarised from a sample."""
    sample = item.get("sample")
    if not sample:
        return ""
    return (
        f" (frames of {sample['trajectories']} of {sample['of']} trajectories; "
        "--decode-images reads every frame)"
    )


def _stats_text(item: dict[str, Any]) -> str:
    non_finite = "".join(f" {name}={item[name]}" for name in ("nan", "inf") if item.get(name))
    if not item["count"]:
        return f"n=0{non_finite}"
    return (
        f"n={item['count']}{non_finite} mean={item['mean']:.6g} std={item['std']:.6g} "
        f"min={item['min']:.6g} max={item['max']:.6g}"
    )
