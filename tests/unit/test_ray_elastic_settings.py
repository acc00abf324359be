"""ElasticRayExecutor's settings and argument checks (no Ray cluster needed; the cluster test is
tests/multihost/test_ray.py)."""

import pytest

from torchring.ray import ElasticRayExecutor


def test_create_settings_takes_horovods_names_and_the_older_min_np_max_np():
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=6, reset_limit=3, elastic_timeout=90)
    assert (settings.min_num_proc, settings.max_num_proc, settings.reset_limit, settings.elastic_timeout) == \
        (2, 6, 3, 90.0)
    older = ElasticRayExecutor.create_settings(min_np=3, max_np=5, ssh_identity_file="/nowhere", nics={"eth0"})
    assert (older.min_num_proc, older.max_num_proc) == (3, 5)


@pytest.mark.parametrize(("settings", "kwargs", "message"), [
    ({"min_num_proc": 0}, {}, "min_num_proc must be at least 1"),
    ({"min_num_proc": 4, "max_num_proc": 2}, {}, "max_num_proc 2 is below min_num_proc 4"),
    ({}, {"gpus_per_slot": 1}, "gpus_per_slot is set but use_gpu is False"),
    ({}, {"override_discovery": False}, "override_discovery=False needs settings.discovery"),
])
def test_bad_arguments_are_refused_with_the_reason(settings, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(**settings), **kwargs)


def test_run_before_start_says_to_call_start():
    with pytest.raises(RuntimeError, match="call start"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings()).run(lambda: None)
