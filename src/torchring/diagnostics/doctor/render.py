"""``torchring doctor``'s report as terminal text, as Markdown to paste into an issue, or as JSON."""

from __future__ import annotations

import json

from .checks import ALL_HOSTS, Check, DoctorReport

PASS, FAIL = "✓", "✗"


def summary(report: DoctorReport) -> str:
    """The last line: "nothing blocks training" or "N problem(s) block training" (with warnings counted)."""
    problems = len(report.problems)
    warnings = sum(1 for check in report.checks if not check.ok and not check.blocking)
    note = f" ({warnings} warning(s) above)" if warnings else ""
    if problems:
        return f"{problems} problem(s) block training{note}"
    return f"nothing blocks training{note}"


def _groups(report: DoctorReport) -> list[tuple[str, list[Check]]]:
    order = [*report.hosts, ALL_HOSTS]
    order += [check.host for check in report.checks if check.host not in order]
    groups = [(host, [check for check in report.checks if check.host == host]) for host in order]
    return [(host, checks) for host, checks in groups if checks]


def render_text(report: DoctorReport) -> str:
    """One line per check, ``✓ host: name — detail`` (a ``fix:`` line under each ✗), grouped by host,
    then the summary."""
    lines = [f"torchring doctor: {len(report.hosts)} host(s), {len(report.checks)} check(s)"]
    for _, checks in _groups(report):
        lines.append("")
        for check in checks:
            lines.append(f"{PASS if check.ok else FAIL} {check.host}: {check.name} — {check.detail}")
            if not check.ok and check.fix:
                lines.append(f"    fix: {check.fix}")
    return "\n".join([*lines, "", summary(report)])


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", "<br>")


def render_markdown(report: DoctorReport) -> str:
    """A report to paste into an issue: the summary, a table of the checks and the raw JSON, collapsed."""
    rows = ["| host | check | status | detail | fix |", "|---|---|---|---|---|"]
    for check in report.checks:
        status = PASS if check.ok else (f"{FAIL} blocking" if check.blocking else f"{FAIL} warning")
        rows.append(f"| {_cell(check.host)} | {_cell(check.name)} | {status} | {_cell(check.detail)} | "
                    f"{_cell(check.fix if not check.ok else None)} |")
    parts = ["## torchring doctor", "", f"**{summary(report)}**", "", *rows]
    parts += ["", "<details><summary>raw probe data (JSON)</summary>", "", "```json", render_json(report), "```",
              "", "</details>"]
    return "\n".join(parts)


def render_json(report: DoctorReport) -> str:
    """``{"ok": bool, "hosts": {host: probe}, "checks": [...]}`` (and ``"bench"`` when it ran), indented."""
    return json.dumps(report.to_dict(), indent=2, default=str)
