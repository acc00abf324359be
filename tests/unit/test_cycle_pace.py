"""The engine's cycle pace (``EngineSettings.pace``): a rank with nothing of its own spaces its cycles out
while the others wait for it; a rank with requests never does."""

from torchring.runtime.coordination.engine_settings import QUIET_AFTER_CYCLES, EngineSettings


def test_a_rank_with_requests_of_its_own_always_cycles_at_the_cycle_time():
    settings = EngineSettings(cycle_time_s=0.001)
    assert {settings.pace(empty, own_requests=True) for empty in range(0, 10_000, 7)} == {0.001}


def test_a_quiet_rank_doubles_its_gap_after_the_empty_cycles_up_to_the_cap():
    settings = EngineSettings(cycle_time_s=0.001, quiet_pace_max_s=0.01)
    assert settings.pace(QUIET_AFTER_CYCLES - 1, own_requests=False) == 0.001
    gaps = [settings.pace(QUIET_AFTER_CYCLES + n, own_requests=False) for n in range(8)]
    assert gaps[:3] == [0.002, 0.004, 0.008] and gaps[3:] == [0.01] * 5
    assert settings.pace(10**9, own_requests=False) == 0.01


def test_a_cycle_time_above_the_cap_is_kept():
    settings = EngineSettings(cycle_time_s=0.05, quiet_pace_max_s=0.01)
    assert settings.pace(10**6, own_requests=False) == 0.05
