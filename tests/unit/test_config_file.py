"""--config-file: YAML values become the run flags' defaults; flags on the command line win."""

import argparse

import pytest

from torchring.launch.cli.arguments import add_run_arguments, config_from_args
from torchring.launch.cli.config_file import ConfigFileError, apply_config_file, config_file_argument, load_config_file


def parser():
    result = argparse.ArgumentParser()
    add_run_arguments(result)
    return result


def parse(tmp_path, text, *argv):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    run_parser = parser()
    full = ["--config-file", str(path), *argv]
    apply_config_file(run_parser, full)
    return config_from_args(run_parser.parse_args(full))


def test_flat_keys_and_horovod_sections(tmp_path):
    config = parse(tmp_path, """
np: 4
hosts: a:2,b:2
ssh-port: 2222
start_timeout: 12
network-interface: eth1
x: [WANDB_API_KEY]
env: {MODE: "fast run"}
params: {fusion_threshold_mb: 32, cycle_time_ms: 2, cache_capacity: 64}
timeline: {filename: /tmp/t.json, mark_cycles: true}
stall_check: {enabled: false, warning_time_seconds: 30}
logging: {level: debug}
""", "python", "train.py")
    assert config.num_proc == 4 and [h.hostname for h in config.hosts] == ["a", "b"]
    assert config.ssh.port == 2222 and config.ssh.connect_timeout_s == 12.0
    assert config.network_interfaces == ("eth1",) and config.forward_names == ("WANDB_API_KEY",)
    assert config.extra_env == {"MODE": "fast run"}
    assert config.tuning == {"TORCHRING_FUSION_THRESHOLD": str(32 * 1024 * 1024), "TORCHRING_CYCLE_TIME": "2.0",
                             "TORCHRING_CACHE_CAPACITY": "64", "TORCHRING_TIMELINE": "/tmp/t.json",
                             "TORCHRING_TIMELINE_MARK_CYCLES": "1", "TORCHRING_STALL_CHECK_DISABLE": "1",
                             "TORCHRING_STALL_CHECK_TIME_SECONDS": "30.0", "TORCHRING_LOG_LEVEL": "DEBUG"}
    assert config.command == ["python", "train.py"]


def test_command_line_flags_win(tmp_path):
    config = parse(tmp_path, "np: 4\ncycle-time-ms: 5\nhosts: a:4\n", "-np", "2", "--cycle-time-ms", "1",
                   "-H", "localhost:2", "python", "x.py")
    assert config.num_proc == 2 and config.tuning["TORCHRING_CYCLE_TIME"] == "1.0"
    assert [h.hostname for h in config.hosts] == ["localhost"]


def test_unknown_keys_and_bad_values_are_named(tmp_path):
    with pytest.raises(ConfigFileError, match="unknown key 'nproc'"):
        parse(tmp_path, "nproc: 2\n", "true")
    with pytest.raises(ConfigFileError, match="unknown key 'params.hierarchical_allreduce'"):
        parse(tmp_path, "params: {hierarchical_allreduce: true}\n", "true")
    with pytest.raises(ConfigFileError, match="'ssh-port' has a bad value 'twenty'"):
        parse(tmp_path, "ssh_port: twenty\n", "true")
    with pytest.raises(ConfigFileError, match="not valid YAML"):
        parse(tmp_path, "np: [1\n", "true")
    with pytest.raises(ConfigFileError, match="cannot read it"):
        load_config_file(str(tmp_path / "missing.yaml"), parser())


def test_np_is_still_required(tmp_path):
    with pytest.raises(ValueError, match="-np is required"):
        parse(tmp_path, "hosts: a:2\n", "true")


def test_config_file_argument_stops_at_the_command():
    assert config_file_argument(["--config-file", "a.yaml", "x"]) == "a.yaml"
    assert config_file_argument(["--config-file=b.yaml"]) == "b.yaml"
    assert config_file_argument(["-np", "2", "--", "prog", "--config-file", "c.yaml"]) is None


def test_the_hang_timeout_comes_from_the_flag_the_file_or_the_variable(tmp_path, monkeypatch):
    assert parse(tmp_path, "np: 2\nhang-timeout: 20\n", "true").hang_timeout_s == 20.0
    assert parse(tmp_path, "np: 2\nhang-timeout: 20\n", "--hang-timeout", "0", "true").hang_timeout_s == 0.0
    monkeypatch.setenv("TORCHRING_HANG_TIMEOUT", "45")
    assert parse(tmp_path, "np: 2\n", "true").hang_timeout_s == 45.0
    monkeypatch.delenv("TORCHRING_HANG_TIMEOUT")
    assert parse(tmp_path, "np: 2\n", "true").hang_timeout_s == 300.0
