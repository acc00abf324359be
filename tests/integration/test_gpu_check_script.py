"""benchmarks/gpu_check.py at 2 ranks on the CPU with tiny sizes: it passes, and it fails when told to (a wrong
value: exit 1, a missed target: exit 2), so that ``make gpu-check`` can fail on a GPU machine."""

import sys

from .jobs import ROOT, JobResult, run_job

# a small model, one step per round and loose targets: the CPU run checks the script, not the CPU's speed
TINY = ("--device", "cpu", "--model", "small", "--batch-size", "2", "--image-size", "32", "--steps", "1",
        "--rounds", "1", "--value-steps", "2", "--max-overhead", "1000", "--min-fusion-ratio", "0")
VALUE_CHECKS = ("allreduce Average float32", "allreduce Average float16", "fused burst of 200", "allreduce 1 MB",
                "broadcast from rank 1", "allgather, first dims 1..size", "DistributedOptimizer = DDP (fp32)")
TARGETS = ("step time: DistributedOptimizer / DDP", "fusion copy bandwidth / plain copy")


def _gpu_check(*extra: str) -> JobResult:
    return run_job("run", "-np", "2", sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *TINY, *extra,
                   timeout=240)


def _table(lines: list[str]) -> dict[str, list[str]]:
    """The final table's rows by check: [measured, target, verdict]."""
    start = lines.index("| check | measured | target | verdict |")
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


def test_gpu_check_passes_on_the_cpu_at_two_ranks():
    result = _gpu_check()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in (0, 1):
        lines = result.lines("stdout", rank)
        assert any(line.startswith(f"gpu_check: rank {rank} of 2 on cpu") and "backend gloo" in line
                   for line in lines), lines
        for check in VALUE_CHECKS:
            assert f"{check}: ok" in lines, (check, lines)
    lines = result.lines("stdout", 0)
    rows = _table(lines)
    assert list(rows) == [*VALUE_CHECKS, *TARGETS]
    assert all(rows[check][2] == "ok" for check in VALUE_CHECKS), rows
    assert rows["DistributedOptimizer = DDP (fp32)"][0].startswith("2 steps (engine then gradient lane), identical")
    assert rows[TARGETS[0]][1:] == ["<= 1000", "met"] and rows[TARGETS[1]][1:] == [">= 0", "met"], rows
    assert rows[TARGETS[1]][0].split(" (")[1].startswith("132 tensors < 1 MB in 1 batch(es)")
    assert lines[-1] == "gpu_check: every value right, every target met (exit 0)"
    assert not any("|" in line for line in result.lines("stdout", 1)), "rank 0 prints the table"


def test_a_wrong_value_fails_the_check_with_exit_1():
    result = _gpu_check("--plant", "wrong-value")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.lines("stdout", 0)
    assert ("allreduce Average float32: WRONG: mean of rank+1 over 2 ranks (element 0; 64 of 64 differ), "
            "expected 1.5, got 2") in lines, lines
    rows = _table(lines)
    assert rows["allreduce Average float32"][2] == "WRONG"
    assert rows["allreduce Average float32"][0].startswith("ranks 0, 1: mean of rank+1")
    assert all(rows[check][2] == "ok" for check in VALUE_CHECKS[1:]), rows
    assert lines[-1] == "gpu_check: a value is WRONG (exit 1)"


def test_a_missed_target_fails_the_check_with_exit_2():
    result = _gpu_check("--plant", "missed-target")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.lines("stdout", 0)
    rows = _table(lines)
    assert rows[TARGETS[0]][1:] == ["<= 0", "missed"], rows
    assert rows[TARGETS[1]][2] == "missed", rows
    assert all(rows[check][2] == "ok" for check in VALUE_CHECKS), rows
    assert lines[-1] == "gpu_check: values right, a target missed (exit 2)"
