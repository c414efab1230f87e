"""experiments/predictor/group_factors.py: a group's factor from the other folds corrects a fold's rows."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))

from group_factors import out_of_fold  # noqa: E402


def rows_off_by(groups: dict) -> list[dict]:
    """20 rows per group, each predicted ``ratio`` times its measurement."""
    return [{"id": f"{name}-{index}", "kind": name, "log_ratio": math.log(ratio)}
            for name, ratio in groups.items() for index in range(20)]


def test_a_group_off_by_its_own_factor_is_corrected_exactly_and_the_model_alone_is_not():
    rows = rows_off_by({"fast": 1.1, "slow": 0.8})
    alone_median, alone_mean = out_of_fold(rows, lambda row: None, "cv:", 0)
    assert alone_median == pytest.approx(0.15, abs=1e-9)  # half the rows 10 % off, half 20 %
    assert alone_mean == pytest.approx((math.log(1.1) - math.log(0.8)) / 2)
    assert out_of_fold(rows, lambda row: row["kind"], "cv:", 0) == pytest.approx((0.0, 0.0), abs=1e-12)


def test_shrinking_keeps_part_of_the_error():
    rows = rows_off_by({"fast": 1.1})
    _, shrunk_mean = out_of_fold(rows, lambda row: row["kind"], "cv:", 3)
    assert 0.0 < shrunk_mean < math.log(1.1)
