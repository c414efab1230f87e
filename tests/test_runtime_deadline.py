"""The deadline stop rule: one more step only if it ends less than step/N after the deadline."""
import pytest

from geodiloco.runtime.trainer import stop_before_deadline


@pytest.mark.parametrize("elapsed_s, step_s, deadline_s, nodes, stop", [
    (8.0, 1.0, 10.0, 4, False),    # ends at 9.0, before the deadline
    (9.0, 1.0, 10.0, 4, False),    # ends exactly at the deadline
    (9.2, 1.0, 10.0, 4, False),    # 0.2 s over < 1.0 / 4: the others wait 3 x 0.2, less than 0.8 alone
    (9.3, 1.0, 10.0, 4, True),     # 0.3 s over >= 0.25: stop, this node waits 0.7 s instead
    (9.003, 1.0, 10.0, 2, False),  # the slowest node, a fraction of a percent late, still finishes its plan
    (9.6, 1.0, 10.0, 2, True),
    (9.5, 1.0, 10.0, 1, False),    # alone: nobody waits for it
])
def test_stop_rule(elapsed_s, step_s, deadline_s, nodes, stop):
    assert stop_before_deadline(elapsed_s, step_s, deadline_s, nodes) is stop
