"""Shared test setup: the parallel suite runs only under ``torchring run`` (see integration tests).

Resolver timeout: torch's c10d looks up the host name of the peer of every store connection (for its
log messages), in the store server's thread too. Where the configured DNS server does not answer (CI
sandboxes without DNS), an unanswered lookup waits glibc's default 5 s and every rank waits with it:
about one connection in 25 did, which cost the parallel suite's re-inits and the elastic tests minutes.
One attempt of 1 s keeps that small; where DNS answers nothing changes, and a RES_OPTIONS of the
caller's own is kept. Set here, it reaches the launchers and ranks that the tests start.

BLAS threads: numpy's OpenBLAS (loaded with torch) starts a pool of one thread per CPU whose threads spin
as it loads, about 0.25 s of CPU per process that imports torch (1.60 against 1.37 s for a launcher
here). A full run starts about 700 such processes (launchers, helpers, ranks) on 2 cores, where the
suite's time is its CPU; no test needs more than one BLAS thread. Ranks that ``torchring run`` starts
with more than one rank per host get ``OMP_NUM_THREADS=1``, which OpenBLAS reads too; this covers the
rest, and a caller's own value is kept.
"""

import os

import pytest

os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture
def no_job_starts(monkeypatch):
    """In-process command lines (``torchring run``, ``horovodrun``) must fail before any job starts."""
    from torchring.launch.cli import run_command as run_cli

    def no_job(config):
        raise AssertionError(f"a job was started: {config}")

    monkeypatch.setattr(run_cli, "run_job", no_job)
    monkeypatch.setattr(run_cli, "run_elastic_job", no_job)


@pytest.fixture(scope="session")
def local_mnist_run():
    """One local 2-rank run of ``examples/mnist.py`` for one epoch, shared by the examples test and the
    multi-host test's local reference (one job of ~15 s instead of two)."""
    import sys

    from tests.integration.jobs import ROOT, run_job

    return run_job("run", "-np", "2", sys.executable, str(ROOT / "examples" / "mnist.py"), "--epochs", "1",
                   "--log-interval", "5", timeout=400)

collect_ignore = [] if os.environ.get("TORCHRING_PARALLEL_SUITE") == "1" else ["parallel"]
