"""The settings table: parsing, errors naming the variable set, and the docs listing every setting."""

import argparse
import dataclasses
import logging
import re
import sys
from pathlib import Path

import pytest

import torchring as hvd
from torchring import logging_utils
from torchring.launch.cli.tuning import add_tuning_arguments, tuning_environment
from torchring.settings import VARIABLES, Settings, read

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


@pytest.fixture(autouse=True)
def no_settings_in_environment(monkeypatch):
    for variable in VARIABLES:
        for name in variable.names:
            monkeypatch.delenv(name, raising=False)


def test_defaults_when_nothing_is_set():
    assert Settings.from_env({}) == Settings()


def test_the_dataclass_has_one_field_per_variable_with_its_default():
    fields = [(field.name, field.default) for field in dataclasses.fields(Settings)]
    assert fields == [(variable.field, variable.default) for variable in VARIABLES]


def test_torchring_names_win_over_horovod_names():
    env = {"TORCHRING_CYCLE_TIME": "2.5", "HOROVOD_CYCLE_TIME": "9", "HOROVOD_STALL_CHECK_DISABLE": "1",
           "TORCHRING_LOG_LEVEL": "", "HOROVOD_LOG_LEVEL": "debug"}
    settings = Settings.from_env(env)
    assert settings.cycle_time == 2.5 and settings.stall_check_disable is True
    assert settings.log_level == logging.DEBUG  # an empty value counts as unset
    assert settings.fusion_threshold == 128 * 1024 * 1024


def test_torchring_own_settings_have_no_horovod_name():
    assert Settings.from_env({"HOROVOD_BUCKET_CAP_MB": "4", "HOROVOD_GRADIENT_LANE": "0"}) == Settings()


@pytest.mark.parametrize(("variable", "value", "fragment"), [
    ("TORCHRING_LOG_LEVEL", "bogus", "use one of TRACE"),
    ("HOROVOD_LOG_LEVEL", "loud", "use one of TRACE"),
    ("HOROVOD_CYCLE_TIME", "fast", "must be a number"),
    ("TORCHRING_FUSION_THRESHOLD", "-1", "must be >= 0"),
    ("HOROVOD_CACHE_CAPACITY", "-5", "must be >= 0"),
    ("TORCHRING_STALL_CHECK_DISABLE", "maybe", "must be 1 or 0"),
    ("TORCHRING_METRICS_PORT", "http", "must be a port number"),
    ("TORCHRING_RESET_LIMIT", "2.5", "must be an integer"),
])
def test_a_bad_value_names_the_variable_that_was_set(variable, value, fragment):
    with pytest.raises(ValueError) as raised:
        Settings.from_env({variable: value})
    message = str(raised.value)
    assert message.startswith(f"{variable}={value!r}: ") and fragment in message
    other = variable.replace("TORCHRING_", "HOROVOD_") if variable.startswith("TORCHRING_") \
        else variable.replace("HOROVOD_", "TORCHRING_")
    assert other not in message


def test_read_one_setting_and_refuse_unknown_names():
    assert read("RESET_LIMIT", {"TORCHRING_RESET_LIMIT": "-1"}) is None
    assert read("TORCHRING_ELASTIC_TIMEOUT", {"TORCHRING_ELASTIC_TIMEOUT": "12"}) == 12.0
    with pytest.raises(KeyError, match="TORCHRING_NO_SUCH_THING"):
        read("NO_SUCH_THING", {})


@pytest.mark.parametrize(("value", "level"), [("warn", logging.WARNING), ("WARNING", logging.WARNING),
                                              ("trace", logging.DEBUG), ("Fatal", logging.CRITICAL),
                                              ("critical", logging.CRITICAL)])
def test_get_logger_and_init_accept_the_same_levels(monkeypatch, value, level):
    monkeypatch.setenv("TORCHRING_LOG_LEVEL", value)
    assert logging_utils.log_level() == level
    torchring_logger = logging.getLogger("torchring")
    previous = torchring_logger.level
    try:
        hvd.init()
        assert torchring_logger.level == level
    finally:
        hvd.shutdown()
        torchring_logger.setLevel(previous)


def test_init_refuses_a_bad_value_naming_the_variable_set(monkeypatch):
    monkeypatch.setenv("TORCHRING_LOG_LEVEL", "bogus")
    with pytest.raises(ValueError, match=r"^TORCHRING_LOG_LEVEL='bogus': use one of") as raised:
        hvd.init()
    assert "HOROVOD_LOG_LEVEL" not in str(raised.value)
    assert not hvd.is_initialized()


def _documented_names() -> set[str]:
    """The names in the tables of docs/api.md's "Settings read at init()" section."""
    text = DOCS.read_text()
    section = text[text.index("## Settings read at `init()`"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}


def test_the_docs_settings_tables_list_every_setting_and_nothing_else():
    documented = _documented_names()
    expected = {variable.name.removeprefix("TORCHRING_") if variable.horovod else variable.name
                for variable in VARIABLES}
    assert expected - documented == set(), "settings missing from docs/api.md"
    assert documented - expected == set(), "docs/api.md lists settings torchring does not read"


def test_every_tuning_flag_sets_a_known_setting():
    parser = argparse.ArgumentParser()
    add_tuning_arguments(parser)
    args = parser.parse_args(["--fusion-threshold-mb", "1", "--cycle-time-ms", "2", "--cache-capacity", "3",
                              "--timeline-filename", "t.json", "--timeline-mark-cycles", "--no-stall-check",
                              "--stall-check-warning-time-seconds", "4", "--stall-check-shutdown-time-seconds", "5",
                              "--log-level", "warning"])
    env = tuning_environment(args)
    assert len(env) == 9 and set(env) <= {variable.name for variable in VARIABLES}
    Settings.from_env(env)  # every value the launcher writes parses


def test_the_gil_switch_interval_is_the_programs_own_unless_set():
    from torchring.runtime.context import _apply_gil_switch_interval

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        _apply_gil_switch_interval(Settings.from_env({}))
        assert sys.getswitchinterval() == pytest.approx(0.004)  # unset: left alone
        _apply_gil_switch_interval(Settings.from_env({"TORCHRING_GIL_SWITCH_INTERVAL_MS": "2"}))
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(before)
