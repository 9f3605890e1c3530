"""The Markdown summary written next to the record: pass rates per suite and path, and the failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch_fl.conformance.recordfile import STATUSES

MAX_LISTED = 100


def summary_path(record: Path) -> Path:
    """`torch-2.13.json` -> `torch-2.13.md`."""
    return record.with_suffix(".md")


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _table(title: str, rows: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| | " + " | ".join(STATUSES) + " | total | pass rate |",
        "|---" * (len(STATUSES) + 3) + "|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | "
            + " | ".join(str(row.get(s, 0)) for s in STATUSES)
            + f" | {row['total']} | {_pct(row['pass_rate'])} |"
        )
    return lines + [""]


def _cell(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_lines(machine: dict[str, Any]) -> list[str]:
    """Where one run ran and what it selected."""
    selection = machine.get("selection", {})
    return [
        f"- machine: {machine.get('hostname', '?')}, {machine.get('cpu_count', '?')} CPUs, "
        f"{machine.get('workers', '?')} workers, backing {machine.get('backing', '?')}"
        + (f", {machine['device']}" if machine.get("device") else ""),
        f"- selection: suites {', '.join(selection.get('suites', [])) or 'all'}; paths {', '.join(selection.get('paths', [])) or 'all'}"
        + (f"; -k `{selection['k']}`" if selection.get("k") else "")
        + f"; {selection.get('samples', '?')} samples per op and dtype",
    ]


def render(record: dict[str, Any]) -> str:
    s = record["summary"]
    binding = record["binding"]
    machine = record.get("machine", {})
    crit = s["ops_criterion"]
    lines = [
        f"# Conformance: {record['platform']} on torch {binding['torch_version']}",
        "",
        f"- record: `{record['platform']}` descriptor `{binding['descriptor_hash'][:19]}...`, torch line {binding['torch']}",
        f"- kernel libraries: {', '.join(f'{k} {v}' for k, v in binding['kernel_libraries'].items()) or 'none declared'}",
        f"- platform sources: {', '.join(f'{k} `{v[:19]}...`' for k, v in binding.get('sources', {}).items()) or 'none'}",
        f"- started {record['started']}, finished {record['finished'] or '-'}; complete: **{'yes' if record['complete'] else 'no'}**",
        *_run_lines(machine),
    ]
    base = machine.get("added_to")
    while base:  # --add: the runs whose cases this one extends, latest first
        run = base.get("machine") or {}
        lines.append(f"- added to the run started {base.get('started')}, finished {base.get('finished') or '-'}:")
        lines += ["  " + line for line in _run_lines(run)]
        base = run.get("added_to")
    if s.get("wall_s") is not None:
        lines.append(f"- wall time: {s['wall_s']:.0f} s, {s.get('cases_per_s') or '-'} cases per second")
    lines += [
        "",
        "## Criterion",
        "",
        f"Of the ops cases whose every part could be compared (the CPU baseline, same sample and dtype on plain CPU, "
        f"meets the float64 reference), **{_pct(crit['rate'])}** pass on flagos ({crit['passed']} of {crit['judged']}; "
        f"target {_pct(crit['target'])}). {crit['unjudged']} cases are unjudged: the CPU itself misses the reference "
        "in a part they make, so they enable nothing.",
        "",
        "## Pass rates",
        "",
        *_table("By suite", s["by_suite"]),
        *_table("By path", s["by_path"]),
        "## Failures",
        "",
    ]
    failures = s.get("failure_groups", [])
    if not failures:
        lines.append("None.")
    else:
        lines += [
            f"{s['distinct_failures']} distinct failures (cases with the same fingerprint are counted together).",
            "",
            "| status | op | cases | example | message |",
            "|---|---|---|---|---|",
        ]
        for f in failures[:MAX_LISTED]:
            lines.append(
                f"| {f['status']} | {_cell(f['op'] or '-', 60)} | {f['count']} | `{_cell(f['example'], 120)}` | {_cell(f['message'])} |"
            )
        if len(failures) > MAX_LISTED:
            lines.append(f"\n... and {len(failures) - MAX_LISTED} more in the record's failures.")
    not_swept = s.get("not_swept", [])
    if not_swept:
        lines += [
            "",
            "## Not swept",
            "",
            f"{len(not_swept)} op x path pairs have no sweep generator (sizes, layouts "
            "and dtype mixes unchecked; only their OpInfo samples prove them):",
            "",
        ]
        lines += [f"- {_cell(line, 200)}" for line in not_swept[:MAX_LISTED]]
    return "\n".join(lines) + "\n"


def write(record_file: Path, record: dict[str, Any]) -> Path:
    path = summary_path(record_file)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(record))
    tmp.replace(path)
    return path
