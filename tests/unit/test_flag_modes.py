"""``torchring run`` flags that cannot apply to a job's kind are refused, in-process through the CLI's
``main`` (no job starts), and docs/launcher.md says for every flag which kinds it applies to."""

import re
from pathlib import Path

import pytest

from torchring.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
ELASTIC = ["--min-np", "2", "--max-np", "2", "-H", "localhost:2"]


@pytest.mark.parametrize("flags, message", [
    (["--timeline-filename", "t.json", *ELASTIC],
     "--timeline-filename does not apply to elastic jobs: rank 0 of every generation rewrites the file"),
    (["-np", "2", "--slots-per-host", "2"], "--slots-per-host applies to elastic jobs only"),
    (["-np", "2", "--reset-limit", "3"], "--reset-limit applies to elastic jobs only"),
    (["-np", "2", "--blacklist-cooldown-range", "1", "2"], "--blacklist-cooldown-range applies to elastic jobs only"),
    (["-np", "2", "--elastic-timeout", "5"], "--elastic-timeout applies to elastic jobs only"),
    (["-np", "2", "--horovod-compat", "--image", "img"], "--horovod-compat cannot reach into --image containers"),
    ([*ELASTIC, "--horovod-compat", "--image", "img"], "--horovod-compat cannot reach into --image containers"),
    ([*ELASTIC, "--slots-per-host", "0"], "--slots-per-host must be at least 1"),
    (["-np", "2", "--image-workdir", "/w"], "--image-workdir and --image-no-gpus need --image"),
])
def test_a_flag_the_job_cannot_honour_is_refused_by_name(capsys, flags, message):
    assert main(["run", *flags, "python", "train.py"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("torchring run: error: ") and message in error, error


def test_refusals_say_what_to_do(capsys):
    main(["run", "-np", "2", "--reset-limit", "3", "true"])
    assert "add --min-np/--max-np or --host-discovery-script" in capsys.readouterr().err
    main(["run", *ELASTIC, "--timeline-filename", "t.json", "true"])
    assert "record a timeline in a fixed-size run" in capsys.readouterr().err


def _documented_flags() -> dict[str, tuple[str, str]]:
    text = (ROOT / "docs" / "launcher.md").read_text()
    section = text[text.index("## Flags by kind of job"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for flag in re.findall(r"`(-[-\w]+)", cells[0]):
                rows[flag] = (cells[1], cells[2])
    return rows


def test_the_launcher_docs_say_where_every_flag_applies():
    run_parser = build_parser().get_default("run_parser")
    documented = _documented_flags()
    flags = [action.option_strings for action in run_parser._actions if action.option_strings
             and "--help" not in action.option_strings]
    missing = [strings for strings in flags if not any(flag in documented for flag in strings)]
    assert not missing, f"docs/launcher.md 'Flags by kind of job' lacks {missing}"
    for strings in flags:
        fixed, elastic = next(documented[flag] for flag in strings if flag in documented)
        assert fixed and elastic, strings


def test_no_table_in_the_launcher_docs_is_cut_by_a_blank_line():
    """Markdown ends a table at a blank line: rows after one fall out of it (two did in the flag table)."""
    lines = (ROOT / "docs" / "launcher.md").read_text().splitlines()
    cut = [number + 1 for number in range(1, len(lines) - 1)
           if not lines[number].strip() and lines[number - 1].startswith("|") and lines[number + 1].startswith("|")]
    assert not cut, f"docs/launcher.md: a blank line splits a table at line(s) {cut}"
