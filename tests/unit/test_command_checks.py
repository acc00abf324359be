"""The command checks of ``torchring run``: the usual first-hour mistakes get an error that says what to
type, and a bare ``python`` without torch is replaced by the launcher's interpreter (a real interpreter
without torch stands in for the system Python)."""

import os
import sys
from pathlib import Path

import pytest

from torchring import cli
from torchring.launch.cli.command_checks import check_command, misplaced_flags

EXAMPLE = "torchring run -np 2"


def test_a_script_given_as_the_program_gets_the_python_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(ValueError, match=r"start it as: torchring run -np 2 python train.py --epochs 3$"):
        check_command(["train.py", "--epochs", "3"], EXAMPLE, True, print)


def test_a_script_without_an_interpreter_line_gets_the_python_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    script.chmod(0o755)
    with pytest.raises(ValueError, match=r"has no '#!' line.*torchring run -np 2 python .*train.py$"):
        check_command([str(script)], EXAMPLE, True, print)
    script.write_text("#!/usr/bin/env python3\nimport torch\n")
    assert check_command([str(script)], EXAMPLE, True, print) == [str(script)]


def test_launcher_flags_after_the_program_are_found():
    assert misplaced_flags(["python", "train.py", "-np", "2", "--lr", "0.1", "--hosts=a:2"]) == ["-np", "--hosts=a:2"]
    assert misplaced_flags(["-np", "python"]) == []  # the program itself is never a misplaced flag


def test_the_launcher_says_where_its_options_go(capsys):
    assert cli.main(["run", "python", "train.py", "-np", "2"]) == 2
    assert "-np came after the command" in capsys.readouterr().err


def _path_with_python_without_torch(tmp_path: Path) -> str:
    base = getattr(sys, "_base_executable", None)
    if not base or base == sys.executable or not os.path.exists(base):
        pytest.skip("no interpreter without torch beside this venv")
    (tmp_path / "python").symlink_to(base)
    return str(tmp_path)


def test_a_bare_python_without_torch_is_replaced_and_said_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with_python_without_torch(tmp_path))
    said = []
    assert check_command(["python", "train.py"], EXAMPLE, True, said.append) == [sys.executable, "train.py"]
    assert len(said) == 1 and "cannot import torch" in said[0] and sys.executable in said[0]
    assert check_command(["python", "train.py"], EXAMPLE, False, said.append) == ["python", "train.py"]  # remote


def test_a_python_with_torch_on_path_is_kept(tmp_path, monkeypatch):
    wrapper = tmp_path / "python"  # a venv's python works only from its own bin directory: a wrapper runs it
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    said = []
    assert check_command(["python", "train.py"], EXAMPLE, True, said.append) == ["python", "train.py"]
    assert said == []


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["run", "--timline-filename", "t.json", "-np", "2", "python", "t.py"], "did you mean --timeline-filename?"),
    (["run", "--verbos", "-np", "2", "python", "t.py"], "did you mean --verbose?"),
    (["run", "-n", "2", "python", "t.py"], "did you mean -np?"),
    (["rn", "-np", "2"], "did you mean run?"),
])
def test_mistyped_flags_and_commands_are_errors_with_a_suggestion(capsys, argv, suggestion):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert suggestion in capsys.readouterr().err
