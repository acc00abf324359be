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


def test_unchanged_horovod_elastic_script_runs_and_resumes_from_its_checkpoint(tmp_path):
    env = {"TORCHRING_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    first = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_elastic_style.py"), "2", env=env)
    assert first.returncode == 0, first.stderr
    for rank in range(2):
        assert first.lines("stdout", rank) == [f"rank {rank} starts at epoch 0", f"rank {rank} finished epoch 1"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["torchring-elastic-state.pt"]

    again = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_elastic_style.py"), "3", env=env)
    assert again.returncode == 0, again.stderr
    for rank in range(2):  # the last commit was at the end of epoch 1: the restarted job continues from there
        assert again.lines("stdout", rank) == [f"rank {rank} starts at epoch 1", f"rank {rank} finished epoch 2"]
    assert "resuming from the checkpoint" in again.stderr
