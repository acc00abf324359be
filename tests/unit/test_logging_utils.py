"""Rank-aware logging and the progress display, in one process with the rank taken from the environment."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import socket
import uuid

import pytest

import torchring.basics
from torchring import logging_utils
from torchring.logging_utils import RANK_VARIABLES, SIZE_VARIABLES, get_logger, log_level, progress

LINE = re.compile(r"^\[rank (\d+) on (\S+)\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d (\w+) ([\w.]+): (.*)$")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No rank, size or level from the environment, and torchring not initialised."""
    for name in (*RANK_VARIABLES, *SIZE_VARIABLES, "TORCHRING_LOG_LEVEL", "HOROVOD_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torchring.basics, "is_initialized", lambda: False)


@pytest.fixture
def logger_name():
    """A fresh logger name; its handlers are removed afterwards."""
    name = f"test.{uuid.uuid4().hex}"
    yield name
    logging.getLogger(name).handlers.clear()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(logging_utils, "_clock", fake)
    return fake


@pytest.mark.parametrize(("variables", "expected"), [
    ({}, logging.INFO),
    ({"HOROVOD_LOG_LEVEL": "TRACE"}, logging.DEBUG),
    ({"HOROVOD_LOG_LEVEL": "fatal"}, logging.CRITICAL),
    ({"TORCHRING_LOG_LEVEL": "WARNING"}, logging.WARNING),
    ({"TORCHRING_LOG_LEVEL": "error", "HOROVOD_LOG_LEVEL": "debug"}, logging.ERROR),
    ({"TORCHRING_LOG_LEVEL": "", "HOROVOD_LOG_LEVEL": "debug"}, logging.DEBUG),
])
def test_level_from_environment(monkeypatch, logger_name, variables, expected):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert log_level() == expected
    assert get_logger(logger_name).level == expected


def test_unknown_level_is_an_error(monkeypatch):
    monkeypatch.setenv("HOROVOD_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="HOROVOD_LOG_LEVEL"):
        log_level()


def test_level_filters_records(monkeypatch, capsys, logger_name):
    monkeypatch.setenv("TORCHRING_LOG_LEVEL", "WARNING")
    logger = get_logger(logger_name)
    logger.info("quiet")
    logger.warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err


def test_lines_are_prefixed_with_rank_and_host(capsys, logger_name):
    get_logger(logger_name).info("hello %s", "world")
    captured = capsys.readouterr()
    assert captured.out == ""
    match = LINE.match(captured.err.rstrip("\n"))
    assert match, captured.err
    assert match.groups() == ("0", socket.gethostname(), "INFO", logger_name, "hello world")


def test_rank_comes_from_torchring_once_initialised(monkeypatch, capsys, logger_name):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torchring.basics, "is_initialized", lambda: True)
    monkeypatch.setattr(torchring.basics, "rank", lambda: 3)
    get_logger(logger_name, all_ranks=True).info("from three")
    assert capsys.readouterr().err.startswith("[rank 3 on ")


@pytest.mark.parametrize("variable", ["TORCHRING_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
def test_other_ranks_drop_records_unless_all_ranks(monkeypatch, capsys, logger_name, variable):
    monkeypatch.setenv(variable, "1")
    get_logger(logger_name).info("rank-0 only")
    assert capsys.readouterr().err == ""
    get_logger(f"{logger_name}.all", all_ranks=True).info("every rank")
    err = capsys.readouterr().err
    logging.getLogger(f"{logger_name}.all").handlers.clear()
    match = LINE.match(err.rstrip("\n"))
    assert match and match.group(1) == "1" and match.group(5) == "every rank"


def test_rank_is_read_when_the_record_is_emitted(monkeypatch, capsys, logger_name):
    logger = get_logger(logger_name)
    monkeypatch.setenv("RANK", "2")
    logger.info("dropped")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    logger.info("kept")
    assert "kept" in capsys.readouterr().err


def test_no_duplicate_handlers_and_no_propagation(capsys, caplog, logger_name):
    first = get_logger(logger_name)
    second = get_logger(logger_name)
    assert first is second
    assert len(first.handlers) == 1 and first.propagate is False
    first.info("once")
    assert capsys.readouterr().err.count("once") == 1
    assert "once" not in caplog.text  # the root logger never saw it


def test_latest_all_ranks_setting_wins(monkeypatch, capsys, logger_name):
    monkeypatch.setenv("RANK", "1")
    get_logger(logger_name)
    get_logger(logger_name, all_ranks=True).info("now shown")
    assert "now shown" in capsys.readouterr().err


def run_steps(bar, clock, steps, seconds_per_step=0.5, stop_after=None):
    seen = []
    for index, item in enumerate(bar):
        clock.now += seconds_per_step
        bar.set(loss=1.0 / (index + 1), acc=index)
        seen.append(item)
        if stop_after is not None and index + 1 == stop_after:
            break
    return seen


def test_plain_lines_to_a_pipe(monkeypatch, clock):
    monkeypatch.setenv("WORLD_SIZE", "2")
    stream = io.StringIO()
    seen = run_steps(progress(range(4), desc="epoch 1", batch_size=8, stream=stream, min_interval_s=0),
                     clock, 4)
    assert seen == [0, 1, 2, 3]
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    # 8 samples x 2 ranks per 0.5 s step: 32 samples/s
    assert lines == [
        "epoch 1: step 1/4 (25%) loss=1.0000 acc=0 samples/s=32.0 eta 0:00:02",
        "epoch 1: step 2/4 (50%) loss=0.5000 acc=1 samples/s=32.0 eta 0:00:01",
        "epoch 1: step 3/4 (75%) loss=0.3333 acc=2 samples/s=32.0 eta 0:00:00",
        "epoch 1: step 4/4 (100%) loss=0.2500 acc=3 samples/s=32.0 eta 0:00:00",
        "epoch 1: step 4/4 (100%) loss=0.2500 acc=3 samples/s=32.0 elapsed 0:00:02",
    ]


def test_plain_lines_are_rate_limited(clock):
    stream = io.StringIO()
    run_steps(progress(range(10), desc="e", stream=stream, min_interval_s=1.0), clock, 10, seconds_per_step=0.3)
    lines = stream.getvalue().splitlines()
    # lines after steps 4 (1.2 s), 8 (2.4 s) and the final one; without batch_size the rate is it/s
    assert [line.split(" (")[0] for line in lines] == ["e: step 4/10", "e: step 8/10", "e: step 10/10"]
    assert "it/s=3.3" in lines[0] and lines[-1].endswith("elapsed 0:00:03")


def test_final_line_when_the_loop_stops_early(clock):
    stream = io.StringIO()
    run_steps(progress(range(100), desc="e", stream=stream, min_interval_s=60), clock, 100, stop_after=3)
    assert stream.getvalue().splitlines() == ["e: step 2/100 (2%) loss=0.3333 acc=2 it/s=1.3 elapsed 0:00:02"]


def test_manual_use_as_a_context_manager(clock):
    stream = io.StringIO()
    with progress(total=None, desc="warmup", unit="batch", stream=stream, min_interval_s=0) as bar:
        for _ in range(2):
            clock.now += 1.0
            bar.update()
        bar.set_description("done")
    assert stream.getvalue().splitlines() == [
        "warmup: step 1 batch/s=1.0", "warmup: step 2 batch/s=1.0", "done: step 2 batch/s=1.0 elapsed 0:00:02"]
    bar.close()  # closing again prints nothing more
    assert len(stream.getvalue().splitlines()) == 3


def test_tensor_metrics_are_shown_as_numbers(clock):
    torch = pytest.importorskip("torch")
    stream = io.StringIO()
    with progress(total=1, stream=stream, min_interval_s=0) as bar:
        bar.set(loss=torch.tensor(0.25, requires_grad=True) * 2)
        bar.update()
    assert stream.getvalue().startswith("step 1/1 (100%) loss=0.5000 ")


def test_other_ranks_print_nothing(monkeypatch, clock):
    monkeypatch.setenv("RANK", "1")
    stream = io.StringIO()
    bar = progress(range(3), desc="e", batch_size=4, stream=stream, min_interval_s=0)
    assert run_steps(bar, clock, 3) == [0, 1, 2]
    assert stream.getvalue() == ""
    shown = io.StringIO()
    run_steps(progress(range(3), desc="e", stream=shown, min_interval_s=0, all_ranks=True), clock, 3)
    assert "e: step 3/3 (100%)" in shown.getvalue()


def read_all(fd: int) -> str:
    data = b""
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def test_tqdm_bar_on_a_terminal():
    pytest.importorskip("tqdm")
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as terminal:
            assert terminal.isatty()
            bar = progress(range(5), desc="epoch 7", batch_size=4, stream=terminal)
            for index in bar:
                bar.set(loss=0.5 / (index + 1))
                if index == 2:
                    bar.write("a message between bar updates")
        written = read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert "epoch 7" in written and "%|" in written
    assert "5/5" in written and "samples/s=" in written and "loss=0.1000" in written
    assert written.endswith("\n")
    assert "step 5/5" not in written  # the bar, not plain lines
    assert "a message between bar updates\r\n" in written  # on a line of its own, the bar redrawn after it
    assert written.rindex("a message") < written.rindex("5/5")


def test_write_prints_lines_in_plain_mode(monkeypatch):
    stream, other = io.StringIO(), io.StringIO()
    bar = progress(total=3, stream=stream, min_interval_s=60)
    bar.write("to the progress stream")
    bar.write("elsewhere", file=other)
    monkeypatch.setenv("RANK", "1")
    progress(total=3, stream=stream).write("any rank may write")
    assert stream.getvalue() == "to the progress stream\nany rank may write\n"
    assert other.getvalue() == "elsewhere\n"
