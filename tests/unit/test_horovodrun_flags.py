"""Every option string of Horovod 0.28.1's ``horovodrun`` parser is accepted by torchring's ``horovodrun``
and by ``torchring run`` (none refused as unknown), and the ones torchring implements set what the ranks
read. The list was taken from that parser (``horovod.runner.launch.parse_args``, every action's
``option_strings``); where Horovod is importable the test compares the list with the live parser."""

import argparse

import pytest

from torchring import cli
from torchring.launch.cli import horovodrun
from torchring.launch.cli.arguments import config_from_args

#: (option strings of one action, the value it takes, or None for a switch), in the parser's order.
HOROVOD_0_28_1 = [
    (("-h", "--help"), None), (("-v", "--version"), None), (("-np", "--num-proc"), "2"),
    (("-cb", "--check-build"), None), (("--disable-cache",), None), (("--start-timeout",), "30"),
    (("--network-interfaces",), "lo"), (("--network-interface",), "lo"), (("--output-filename",), "out"),
    (("--verbose",), None), (("--config-file",), "job.yaml"), (("-p", "--ssh-port"), "22"),
    (("-i", "--ssh-identity-file"), "key"), (("--fusion-threshold-mb",), "64"), (("--cycle-time-ms",), "2"),
    (("--cache-capacity",), "512"), (("--hierarchical-allreduce",), None), (("--no-hierarchical-allreduce",), None),
    (("--hierarchical-allgather",), None), (("--no-hierarchical-allgather",), None), (("--torus-allreduce",), None),
    (("--no-torus-allreduce",), None), (("--autotune",), None), (("--no-autotune",), None),
    (("--autotune-log-file",), "tune.csv"), (("--autotune-warmup-samples",), "3"),
    (("--autotune-steps-per-sample",), "10"), (("--autotune-bayes-opt-max-samples",), "20"),
    (("--autotune-gaussian-process-noise",), "0.8"), (("--min-np", "--min-num-proc"), "1"),
    (("--max-np", "--max-num-proc"), "4"), (("--slots-per-host",), "2"), (("--elastic-timeout",), "60"),
    (("--reset-limit",), "3"), (("--blacklist-cooldown-range",), "10 100"), (("--timeline-filename",), "t.json"),
    (("--timeline-mark-cycles",), None), (("--no-timeline-mark-cycles",), None), (("--no-stall-check",), None),
    (("--stall-check",), None), (("--stall-check-warning-time-seconds",), "60"),
    (("--stall-check-shutdown-time-seconds",), "0"), (("--mpi-threads-disable",), None),
    (("--no-mpi-threads-disable",), None), (("--mpi-args",), "-x FOO"), (("--tcp",), None),
    (("--binding-args",), "--bind-to none"), (("--num-nccl-streams",), "2"), (("--thread-affinity",), "1"),
    (("--gloo-timeout-seconds",), "60"), (("--log-level",), "INFO"), (("--log-with-timestamp",), None),
    (("--log-without-timestamp",), None), (("-prefix-timestamp", "--prefix-output-with-timestamp"), None),
    (("--log-hide-timestamp",), None), (("--no-log-hide-timestamp",), None), (("-H", "--hosts"), "localhost:2"),
    (("-hostfile", "--hostfile"), "hosts.txt"), (("--host-discovery-script",), "./discover.sh"),
    (("--gloo",), None), (("--mpi",), None), (("--jsrun",), None),
]
#: Exit after parsing, or refused on purpose with what to do instead (not "unrecognized").
SPECIAL = {"-h", "--help", "-v", "--version", "-cb", "--check-build", "--mpi", "--jsrun"}
#: horovodrun only (torchring run has its own --version; -v stays free there).
HOROVODRUN_ONLY = {"-v", "--version", "--gloo", "--network-interfaces", "--mpi", "--jsrun"}


def _every_flag():
    for strings, value in HOROVOD_0_28_1:
        for flag in strings:
            if flag not in SPECIAL:
                yield flag, value


def test_the_list_is_horovods_own_where_horovod_is_installed():
    launch = pytest.importorskip("horovod.runner.launch")
    captured = {}

    def grab(parser, *_args, **_kwargs):
        captured["parser"] = parser
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = grab
    try:
        with pytest.raises(SystemExit):
            launch.parse_args()
    finally:
        argparse.ArgumentParser.parse_args = original
    live = [tuple(action.option_strings) for action in captured["parser"]._actions if action.option_strings]
    assert live == [strings for strings, _ in HOROVOD_0_28_1]


def _argv(flag, value):
    if value is None:
        return [flag]
    return [f"{flag}={value}"] if value.startswith("-") else [flag, *value.split(" ")]


@pytest.mark.parametrize(("flag", "value"), list(_every_flag()))
def test_horovodrun_accepts_every_flag(flag, value):
    args = horovodrun.build_parser().parse_args(["-np", "2", *_argv(flag, value), "python", "train.py"])
    assert args.command == ["python", "train.py"]


@pytest.mark.parametrize(("flag", "value"), [(f, v) for f, v in _every_flag() if f not in HOROVODRUN_ONLY])
def test_torchring_run_accepts_every_flag_but_horovodruns_own(flag, value):
    parser = cli.build_parser().get_default("run_parser")
    args = parser.parse_args(["-np", "2", *_argv(flag, value), "python", "train.py"])
    assert args.command == ["python", "train.py"]


def _config(*flags):
    parser = horovodrun.build_parser()
    return config_from_args(parser.parse_args(["-np", "2", *flags, "python", "train.py"]))


def test_the_implemented_flags_set_what_the_ranks_read(capsys):
    config = _config("--disable-cache", "--gloo-timeout-seconds", "60", "--log-hide-timestamp",
                     "--prefix-output-with-timestamp", "--min-num-proc", "2", "--max-num-proc", "3")
    assert config.tuning["TORCHRING_CACHE_CAPACITY"] == "0"
    assert config.tuning["TORCHRING_GLOO_TIMEOUT_SECONDS"] == "60"
    assert config.tuning["TORCHRING_LOG_HIDE_TIME"] == "1"
    assert config.timestamp_output
    assert config.elastic is not None and (config.elastic.min_np, config.elastic.max_np) == (2, 3)


def test_the_autotune_flags_set_the_autotuners_settings(capsys):
    config = _config("--autotune", "--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "1",
                     "--autotune-steps-per-sample", "4", "--autotune-bayes-opt-max-samples", "7",
                     "--autotune-gaussian-process-noise", "0.5")
    assert {key: value for key, value in config.tuning.items() if "AUTOTUNE" in key} == {
        "TORCHRING_AUTOTUNE": "1", "TORCHRING_AUTOTUNE_LOG": "tune.csv", "TORCHRING_AUTOTUNE_WARMUP_SAMPLES": "1",
        "TORCHRING_AUTOTUNE_STEPS_PER_SAMPLE": "4", "TORCHRING_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
        "TORCHRING_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5"}
    assert "autotune" not in capsys.readouterr().err  # implemented: nothing to explain


def test_mapped_and_meaningless_flags_say_so_once(capsys):
    _config("--hierarchical-allreduce", "--torus-allreduce", "--tcp", "--num-nccl-streams", "2",
            "--mpi-args=-x FOO")
    err = capsys.readouterr().err
    assert err.count("NCCL chooses its own") == 1
    assert "--tcp has no effect here" in err and "--num-nccl-streams has no effect here" in err
    assert "--mpi-args has no effect here" in err


def test_contradicting_flags_are_an_error():
    with pytest.raises(ValueError, match="contradict"):
        _config("--stall-check", "--no-stall-check")
