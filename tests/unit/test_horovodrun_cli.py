"""``horovodrun`` is ``torchring run --horovod-compat`` under horovodrun's name, and the launcher's
command-line errors are one line; checked in-process (no job starts)."""

import subprocess
import sys

import pytest

from torchring import cli
from torchring.launch.cli import horovodrun
from torchring.launch.cli import run_command as run_cli


def test_help_says_it_is_torchrings_horovodrun(capsys):
    with pytest.raises(SystemExit) as exit_info:
        horovodrun.main(["--help"])
    assert exit_info.value.code == 0
    assert "torchring's horovodrun" in capsys.readouterr().out


def test_it_takes_every_torchring_run_flag_and_implies_horovod_compat():
    run_flags = {flag for action in cli.build_parser().get_default("run_parser")._actions
                 for flag in action.option_strings}
    parser = horovodrun.build_parser()
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert run_flags <= flags and {"--gloo", "--network-interfaces", "--mpi", "--jsrun"} <= flags
    args = parser.parse_args(["-np", "4", "-H", "localhost:4", "-p", "2222", "--start-timeout", "5", "--gloo",
                              "--network-interfaces", "eth0,eth1", "python", "train_hvd.py", "--mpi"])
    assert args.horovod_compat and args.command == ["python", "train_hvd.py", "--mpi"] and not args.mpi
    horovodrun._horovodrun_flags(args)
    assert args.network_interface == ["eth0", "eth1"]


def test_a_horovodrun_job_gets_the_shim(monkeypatch):
    started = []
    monkeypatch.setattr(run_cli, "run_job", lambda config: started.append(config) or 0)
    assert horovodrun.main(["-np", "2", "-H", "localhost:2", "python", "train_hvd.py"]) == 0
    (config,) = started
    # "python" stays, or becomes this interpreter where the one on PATH has no torch (command_checks)
    assert config.horovod_compat and config.num_proc == 2 and config.command[1:] == ["train_hvd.py"]
    assert config.command[0] in ("python", sys.executable)


@pytest.mark.parametrize("flag", ["--mpi", "--jsrun"])
def test_mpi_and_jsrun_are_refused_with_what_to_do(capsys, no_job_starts, flag):
    assert horovodrun.main(["-np", "2", flag, "python", "train.py"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"horovodrun: error: {flag}: torchring starts its ranks itself") and "leave" in line


@pytest.mark.parametrize("main, argv, prog", [
    (cli.main, ["run", "-np", "abc", "python", "train.py"], "torchring run"),
    (horovodrun.main, ["-np", "abc", "python", "train.py"], "horovodrun"),
])
def test_a_bad_flag_value_is_one_line(capsys, no_job_starts, main, argv, prog):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{prog}: error: argument -np/--num-proc: invalid int value: 'abc'"), line


def test_slots_per_host_help_is_a_whole_sentence():
    action = next(a for a in cli.build_parser().get_default("run_parser")._actions
                  if "--slots-per-host" in a.option_strings)
    assert action.help.endswith("without a slot count (default 1)")


def test_bench_train_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--batch-size", "--warmup-batches", "--batches-per-round", "--rounds", "--threads"):
        assert text.split(f"{flag} ")[-1].split("--")[0].count("default"), flag


def test_json_results_are_readable_by_others(tmp_path):
    import os
    import stat

    from torchring.bench.results import write_json_atomic

    previous = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("argv", [["torchring", "--help"], ["torchring", "run", "-np", "2", "-H", "a:x", "true"],
                                  ["torchring", "bench", "train", "--model", "nope"], ["horovodrun", "--help"]])
def test_the_command_line_answers_without_loading_torch(argv):
    """Help, flag and host errors come in a fraction of a second: torch (2 s of CPU) is loaded only by a
    command that starts a job or measures something."""
    module = "torchring.launch.cli.horovodrun" if argv[0] == "horovodrun" else "torchring.cli"
    probe = ("import sys\n"
             f"from {module} import main\n"
             "try:\n"
             f"    code = main({argv[1:]!r})\n"
             "except SystemExit as done:\n"
             "    code = done.code\n"
             "print('exit', code, 'torch loaded', 'torch' in sys.modules, file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("exit ") and last.endswith("torch loaded False"), result.stderr[-2000:]
    assert last != "exit 0 torch loaded False" or "--help" in argv
