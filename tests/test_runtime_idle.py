"""The round clock: phases tile the round's wall time, lost time (a discarded hivemind round) included."""
import pytest

from runtime.idle import RoundClock


def clock_with(**marks):
    clock = RoundClock()
    clock.marks.update(marks)
    return clock


def test_phases_add_up_to_the_round():
    clock = clock_with(start=100.0, local_done=103.0, ready=104.5, synced=105.0, end=105.25)
    assert (clock.compute_s, clock.wait_s, clock.comm_s, clock.overhead_s) == (3.0, 1.5, 0.5, 0.25)
    assert clock.round_start == 100.0
    assert clock.lost_s == 0.0


def test_time_lost_before_a_rejoined_round_is_overhead_and_moves_its_start():
    clock = clock_with(lost_since=90.0, start=100.0, local_done=103.0, ready=104.5, synced=105.0, end=105.25)
    assert clock.lost_s == 10.0
    assert clock.overhead_s == pytest.approx(10.25)
    assert clock.round_start == 90.0
    total = clock.compute_s + clock.wait_s + clock.comm_s + clock.overhead_s
    assert total == pytest.approx(clock.marks["end"] - clock.round_start)
