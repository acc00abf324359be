"""``--horovod-compat`` runs scripts that ``import horovod.torch as hvd`` unchanged."""

from .jobs import python_script, run_job


def test_unchanged_horovod_script_runs_with_horovod_compat():
    result = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_style.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        (line,) = result.lines("stdout", rank)
        assert line.startswith("horovod 0.28.1+torchring") and line.endswith(f"rank {rank} of 2 ok")


def test_without_the_flag_the_shim_is_not_on_the_path():
    result = run_job("run", "-np", "1", *python_script("horovod_style.py"))
    assert "+torchring" not in result.stdout
    if result.returncode != 0:  # no real Horovod installed here
        assert "No module named 'horovod'" in result.stderr
