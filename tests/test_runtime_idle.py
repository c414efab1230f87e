"""The round clock: phases tile the round's wall time, lost time (a discarded hivemind round) included."""
import pytest

from geodiloco.runtime.idle import RoundClock


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


def _clock(**marks) -> "RoundClock":
    from geodiloco.runtime.idle import RoundClock
    clock = RoundClock()
    clock.marks.update(marks)
    return clock


def test_a_sync_landed_behind_compute_is_hidden_not_idle():
    clock = _clock(start=100.0, local_done=110.0, ready=111.0, synced=112.0, end=113.0)
    clock.record_sync([(95.0, 104.0)], blocked_in_phase_s=0.0)  # launched last round, done 4 s into this one
    assert clock.comm_hidden_s == 4.0
    assert (clock.compute_s, clock.wait_s, clock.comm_s, clock.overhead_s) == (10.0, 1.0, 1.0, 1.0)


def test_waits_on_a_sync_inside_the_local_phase_move_from_compute_to_exposed_sync():
    clock = _clock(start=100.0, local_done=110.0, ready=111.0, synced=112.0, end=113.0)
    clock.record_sync([(101.0, 103.0), (105.0, 109.0)], blocked_in_phase_s=1.5)
    assert clock.comm_hidden_s == 4.5
    assert clock.compute_s == 8.5 and clock.comm_s == 2.5
    total_s = clock.compute_s + clock.wait_s + clock.comm_s + clock.overhead_s
    assert total_s == clock.marks["end"] - clock.round_start


def test_blocking_sync_hides_nothing():
    clock = _clock(start=100.0, local_done=110.0, ready=111.0, synced=115.0, end=116.0)
    clock.record_sync([(111.0, 114.5)], blocked_in_phase_s=0.0)
    assert clock.comm_hidden_s == 0.0 and clock.comm_s == 4.0


def test_idle_windows_cover_lost_time_and_everything_after_the_local_phase():
    clock = _clock(lost_since=90.0, start=100.0, local_done=110.0, ready=111.0, synced=112.0, end=113.0)
    assert clock.idle_windows() == [(90.0, 100.0), (110.0, 113.0)]
    windows_s = sum(end - start for start, end in clock.idle_windows())
    assert windows_s == clock.wait_s + clock.comm_s + clock.overhead_s  # no streaming stall in this round
    assert _clock(start=0.0, local_done=5.0, ready=5.0, synced=6.0, end=6.5).idle_windows() == [(5.0, 6.5)]


def test_a_wait_for_min_nodes_at_the_round_start_is_waiting_and_an_idle_window_not_compute():
    clock = _clock(start=100.0, local_done=110.0, ready=111.0, synced=112.0, end=113.0)
    clock.members_wait_s = 4.0  # begin_round held the node until enough sites were live
    assert (clock.compute_s, clock.wait_s, clock.comm_s, clock.overhead_s) == (6.0, 5.0, 1.0, 1.0)
    assert clock.idle_windows() == [(100.0, 104.0), (110.0, 113.0)]
