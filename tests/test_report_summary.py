"""Report numbers on synthetic logs, each checked against a hand computation."""
from __future__ import annotations

import pytest

from geodiloco.report.compare import compare, least_idle
from geodiloco.report.errors import ReportError
from geodiloco.report.pricing import parse_prices
from geodiloco.report.run_dir import load_run
from geodiloco.report.summary import summarize
from test_report_support import NODE_A, NODE_B, default_records, default_run, idle_record, write_run

PRICES = ["A30=0.60", "RTX 2080 Ti=0.25"]


def _node(summary, name):
    return next(node for node in summary.nodes if node.node == name)


def test_idle_sums_shares_and_gpu_hours(tmp_path):
    summary = summarize(load_run(default_run(tmp_path / "run")))
    a, b, total = _node(summary, "a"), _node(summary, "b"), summary.total
    # a: 3 rounds x (wait 3 + sync 1) = 12 s idle of 30 s wall; 2 GPUs -> 24 GPU-s
    assert (a.compute_s, a.wait_s, a.comm_s, a.idle_s, a.wall_s) == pytest.approx((18, 9, 3, 12, 30))
    assert a.idle_share == pytest.approx(0.4)
    assert a.idle_gpu_s == pytest.approx(24)
    assert a.idle_gpu_h_per_1k_rounds == pytest.approx(24 / 3 * 1000 / 3600)
    # b: 3 x (sync 1 + other 0.5) = 4.5 s; 4 GPUs -> 18 GPU-s
    assert (b.idle_s, b.overhead_s, b.idle_gpu_s) == pytest.approx((4.5, 1.5, 18))
    assert b.idle_share == pytest.approx(0.15)
    # total share is GPU-weighted: 42 idle GPU-s of 2*30 + 4*30 = 180 GPU-s
    assert total.idle_gpu_s == pytest.approx(42)
    assert total.idle_share == pytest.approx(42 / 180)
    assert total.idle_gpu_h_per_1k_rounds == pytest.approx(42 / 3 * 1000 / 3600)
    # its parts in GPU-s: waiting 9 s x 2 GPUs; sync (3 x 2) + (3 x 4); other 1.5 s x 4 GPUs
    assert (total.wait_gpu_s, total.comm_gpu_s, total.overhead_gpu_s) == pytest.approx((18, 18, 6))
    assert summary.run_wall_s == pytest.approx(30)
    assert summary.tokens == 9000
    assert summary.tokens_per_hour == pytest.approx(9000 / 30 * 3600)
    assert summary.label == "demo" and summary.policy == "uniform"


def test_a_stop_between_sessions_is_neither_run_time_nor_idle(tmp_path):
    # rounds 0-1 run 1000-1020; the run is stopped and resumed 40 s later: round 2 runs 1060-1070
    records = default_records()
    for record in records:
        if record["round"] == 2:
            record["round_start"], record["round_end"] = 1060.0, 1070.0
    summary = summarize(load_run(write_run(tmp_path / "run", records)))
    assert summary.run_wall_s == pytest.approx(30)
    assert summary.stopped_s == pytest.approx(40)
    assert summary.tokens_per_hour == pytest.approx(9000 / 30 * 3600)
    assert summary.total.idle_gpu_s == pytest.approx(42)
    # the runtime's sub-millisecond gaps between rounds are no stop
    records = default_records()
    for record in records:
        record["round_end"] -= 0.0002
    assert summarize(load_run(write_run(tmp_path / "contiguous", records))).stopped_s == 0.0


def test_skip_rounds_drops_warm_up(tmp_path):
    summary = summarize(load_run(default_run(tmp_path / "run")), skip_rounds=1)
    assert summary.rounds == [1, 2] and summary.skipped_rounds == [0]
    assert _node(summary, "a").idle_s == pytest.approx(8)
    assert summary.total.idle_gpu_s == pytest.approx(2 * 8 + 4 * 3)
    assert summary.run_wall_s == pytest.approx(20)
    with pytest.raises(ReportError, match="leaves no round"):
        summarize(load_run(tmp_path / "run"), skip_rounds=3)


def test_cost_from_price_table(tmp_path):
    summary = summarize(load_run(default_run(tmp_path / "run")), prices=parse_prices(PRICES))
    a, b = _node(summary, "a"), _node(summary, "b")
    assert a.usd_per_hour == pytest.approx(1.20)
    assert a.idle_cost_usd == pytest.approx(12 * 1.20 / 3600)
    assert b.idle_cost_usd == pytest.approx(4.5 * 1.00 / 3600)
    assert summary.total.idle_cost_usd == pytest.approx((12 * 1.2 + 4.5) / 3600)
    assert summary.total.idle_cost_usd_per_1k_rounds == pytest.approx((12 * 1.2 + 4.5) / 3600 / 3 * 1000)


def test_price_yaml_file_and_case_insensitive_names(tmp_path):
    price_file = tmp_path / "prices.yaml"
    price_file.write_text("a30: 0.5\n'rtx  2080 ti': 0.1\n")
    table = parse_prices([str(price_file)])
    assert table.price("A30") == 0.5 and table.price("RTX 2080 Ti") == 0.1


def test_comparison_ratios(tmp_path):
    base = load_run(default_run(tmp_path / "uniform"))
    faster = [idle_record(r, dict(NODE_A, wait_s=1.0), run_id="run-2", policy="time", round_s=8.0)
              for r in range(3)]
    faster += [idle_record(r, dict(NODE_B, compute_s=6.5), run_id="run-2", policy="time", round_s=8.0)
               for r in range(3)]
    tuned = load_run(write_run(tmp_path / "time", faster))
    summaries = [summarize(base), summarize(tuned)]
    rows = compare(summaries)
    # idle GPU-s: uniform 42, time (2*2 + 1.5*4) * 3 = 30 -> 30/42 - 1
    assert rows[0].idle_change == pytest.approx(0.0)
    assert rows[1].idle_change == pytest.approx(30 / 42 - 1)
    # same tokens in 24 s instead of 30 s
    assert rows[1].tokens_per_hour_ratio == pytest.approx(30 / 24)
    assert least_idle(summaries) is summaries[1]


def test_comparison_is_per_round_when_lengths_differ(tmp_path):
    short = summarize(load_run(default_run(tmp_path / "short", rounds=2)))
    long = summarize(load_run(write_run(tmp_path / "long", default_records(rounds=4, run_id="run-2"))))
    assert short.total.idle_gpu_s == pytest.approx(28) and long.total.idle_gpu_s == pytest.approx(56)
    assert compare([short, long])[1].idle_change == pytest.approx(0.0)


def test_with_nodes_that_logged_different_rounds_the_total_per_1000_rounds_is_the_sum_of_the_rows(tmp_path):
    # a logs 3 rounds (24 idle GPU-s: 8 per round), b only 2 (2 x 1.5 s x 4 GPUs = 12 GPU-s: 6 per round), as an
    # async run's nodes log their own phase counts; the rows read 8 and 6 GPU-s per round
    records = [idle_record(r, NODE_A) for r in range(3)] + [idle_record(r, NODE_B) for r in range(2)]
    summary = summarize(load_run(write_run(tmp_path / "run", records)))
    per_1k = 1000 / 3600
    assert _node(summary, "a").idle_gpu_h_per_1k_rounds == pytest.approx(8 * per_1k)
    assert _node(summary, "b").idle_gpu_h_per_1k_rounds == pytest.approx(6 * per_1k)
    assert summary.total.idle_gpu_h_per_1k_rounds == pytest.approx(14 * per_1k)  # 36 GPU-s / 3 rounds read 12


def test_the_least_idle_run_is_the_one_with_the_smallest_total_gpu_idle_share(tmp_path):
    base = summarize(load_run(default_run(tmp_path / "uniform")))  # 42 of 180 GPU-s idle: 23.3 %, 14 GPU-s a round
    # about twice the local steps: 20 s rounds, a computes 15.5 s and waits 3.5, b computes 18: the idle per
    # round grows by 1 GPU-s (15 GPU-s, more than the base's 14) in rounds twice as long (15 / 120 = 12.5 %)
    longer = [idle_record(r, dict(NODE_A, compute_s=15.5, wait_s=3.5), run_id="run-2", policy="time", round_s=20.0)
              for r in range(3)]
    longer += [idle_record(r, dict(NODE_B, compute_s=18.0), run_id="run-2", policy="time", round_s=20.0)
               for r in range(3)]
    long_rounds = summarize(load_run(write_run(tmp_path / "time", longer)))
    assert long_rounds.total.idle_gpu_h_per_1k_rounds > base.total.idle_gpu_h_per_1k_rounds
    assert long_rounds.total.idle_share == pytest.approx(45 / 360)
    assert least_idle([base, long_rounds]) is long_rounds


def test_energy_estimated_from_power_and_measured_when_logged(tmp_path):
    records = default_records()
    for record in records:
        if record["node"] == "a":
            record.update(power_w=300.0, energy_j=3000.0, gpu_util=70.0)
        elif record["round"] == 0:
            record.update(power_w=500.0, energy_j=5000.0, idle_energy_j=400.0, gpu_util=90.0)
    summary = summarize(load_run(write_run(tmp_path / "run", records)))
    a, b = _node(summary, "a"), _node(summary, "b")
    assert a.energy.energy_j == pytest.approx(9000)
    assert a.energy.idle_energy_j == pytest.approx(3 * 300 * 4)
    assert b.energy.idle_energy_j == pytest.approx(400) and b.energy.rounds_with_energy == 1
    assert summary.total.energy.idle_energy_kwh == pytest.approx((3600 + 400) / 3.6e6)
    # the nodes draw at once: the run's power is a's 300 W plus b's 500 W (its one round with power)
    assert summary.total.energy.mean_power_w == pytest.approx(800)
    assert summary.energy_available
    assert "covers 4 of 6 node-rounds" in summary.energy_note


def test_cpu_only_run_says_energy_not_available(tmp_path):
    summary = summarize(load_run(default_run(tmp_path / "run")))
    assert not summary.energy_available
    assert summary.energy_note.startswith("not available")
    assert summary.total.energy.idle_energy_j is None


def test_predicted_idle_and_losses_from_plan_and_metrics(tmp_path):
    plans = [{"policy": "uniform", "round": r, "nodes": [{"name": "a", "predicted_idle_s": 3.5},
                                                          {"name": "b", "predicted_idle_s": 1.0}]}
             for r in range(3)]
    metrics = [{"round": 2, "node": "a", "loss": 3.0}, {"round": 2, "node": "b", "loss": 4.0},
               {"round": 1, "loss": 5.0, "eval_loss": 4.5}, {"round": 2, "eval_loss": 3.9}]
    summary = summarize(load_run(write_run(tmp_path / "run", default_records(), plans, metrics)))
    assert _node(summary, "a").predicted_idle_s == pytest.approx(10.5)
    assert summary.total.predicted_idle_s == pytest.approx(13.5)
    assert summary.per_round[0].predicted_idle_s == pytest.approx(4.5)
    assert summary.final_loss == pytest.approx(3.5) and summary.final_eval_loss == pytest.approx(3.9)
    # stopped after round 3's metrics were logged but before its idle records: the report ends at round 2
    metrics += [{"round": 3, "node": "a", "loss": 1.0}, {"round": 3, "node": "b", "loss": 1.0},
                {"round": 3, "eval_loss": 0.5}]
    stopped = summarize(load_run(write_run(tmp_path / "stopped", default_records(), plans, metrics)))
    assert stopped.rounds == [0, 1, 2]
    assert stopped.final_loss == pytest.approx(3.5) and stopped.final_eval_loss == pytest.approx(3.9)


def test_per_round_view(tmp_path):
    records = default_records()
    records[2]["local_steps"] = 120  # node a, round 1
    summary = summarize(load_run(write_run(tmp_path / "run", records)))
    row = summary.per_round[1]
    assert row.round == 1 and row.wall_s == pytest.approx(10)
    assert row.idle_gpu_s == pytest.approx(2 * 4 + 4 * 1.5)
    assert row.nodes["a"].local_steps == 120 and row.nodes["b"].idle_s == pytest.approx(1.5)


def test_gpu_count_falls_back_to_named_gpus(tmp_path):
    records = default_records(rounds=1)
    for record in records:
        del record["num_gpus"]
    summary = summarize(load_run(write_run(tmp_path / "run", records)))
    assert _node(summary, "b").num_gpus == 4
    assert summary.total.idle_gpu_s == pytest.approx(2 * 4 + 4 * 1.5)


def test_every_field_the_runtime_writes_is_read_back_by_the_report():
    """The report keeps its own schema (it reads logs of any version), so a field added to the writer
    alone would be dropped silently: this fails when the two drift apart."""
    import json
    from dataclasses import fields

    from geodiloco.balancer.records import IdleRecord
    from geodiloco.report.records import NodeRound

    written = IdleRecord(run_id="r", round=2, node="a", site="s", policy="time", local_steps=7, batch_size=4,
                         tokens=896, compute_s=9.0, wait_s=1.5, comm_s=0.5, round_start=100.0, round_end=111.5,
                         overhead_s=0.5, comm_hidden_s=0.25, sync_bytes=1024, lost_s=0.0, present_nodes=["a", "b"],
                         gpus=["A30"], num_gpus=1, gpu_util=80.0, power_w=150.0, energy_j=1725.0,
                         idle_energy_j=180.0, staleness=1, mode="async")
    missing = {field.name for field in fields(IdleRecord)} - set(NodeRound.model_fields)
    assert not missing, f"report/records.py does not read {sorted(missing)}"
    read = NodeRound.model_validate(json.loads(written.to_json()))
    assert {name: getattr(read, name) for name in json.loads(written.to_json())} == json.loads(written.to_json())
    assert read.idle_s == pytest.approx(2.5)


def test_a_node_whose_loss_went_non_finite_is_left_out_of_the_final_loss_and_json_writes_null(tmp_path):
    import json as json_module

    from geodiloco.report.export import write_json
    metrics = [{"round": 2, "node": "a", "loss": 3.0}, {"round": 2, "node": "b", "loss": float("nan")},
               {"round": 2, "eval_loss": 3.9}]
    run = tmp_path / "run"
    write_run(run, default_records())
    (run / "metrics.jsonl").write_text("".join(json_module.dumps(row) + "\n" for row in metrics))  # NaN, as Python logs it
    summary = summarize(load_run(run))
    assert summary.final_loss == pytest.approx(3.0) and summary.final_eval_loss == pytest.approx(3.9)
    summary.final_eval_loss = float("inf")  # whatever a summary holds, the JSON stays JSON
    text = write_json([summary], "-")
    assert "NaN" not in text and "Infinity" not in text
    document = json_module.loads(text, parse_constant=lambda token: pytest.fail(f"non-standard JSON {token}"))
    assert document["runs"][0]["final_eval_loss"] is None and document["runs"][0]["final_loss"] == pytest.approx(3.0)


def test_the_directories_of_one_run_at_several_sites_are_joined_into_one_report(tmp_path):
    from geodiloco.report.runs import summarize_runs
    records = default_records(rounds=4)
    # site a's coordinator logged rounds 0-1 and died; site b's took over, logged round 1 again from its
    # checkpoint (ending later: the resumed run closed it) and rounds 2-3
    first = [record for record in records if record["round"] <= 1]
    second = [dict(record, round_end=record["round_end"] + 5.0) if record["round"] == 1 else record
              for record in records if record["round"] >= 1]
    site_a, site_b = write_run(tmp_path / "site_a", first), write_run(tmp_path / "site_b", second)
    other = write_run(tmp_path / "other", default_records(run_id="run-9"))
    alone = summarize_runs([str(site_b)], [])[0]
    assert alone.rounds == [1, 2, 3]
    [joined, separate] = summarize_runs([str(site_a), str(site_b), str(other)], [])
    assert joined.rounds == [0, 1, 2, 3] and separate.run_id == "run-9"
    assert joined.run_dir == f"{site_a} + {site_b}"
    a = _node(joined, "a")
    # a idles 4 s a round; round 1's record from site b counts once, with its 5 s longer wall
    assert a.idle_s == pytest.approx(16) and a.wall_s == pytest.approx(45)
    assert not [warning for warning in joined.warnings if "has no record" in warning]
    assert joined.warnings[0].startswith("2 directories hold one run (run_id run-1): joined into one report")


def test_the_report_names_who_left_and_rejoined_from_the_membership_log(tmp_path):
    import json
    run = default_run(tmp_path / "run")
    events = [{"time": 1.0, "event": "peer_failed", "node": "a", "how": "connection", "error": "closed by peer"},
              {"time": 2.0, "event": "resumed", "after_round": 0, "present": ["a"], "members_before": ["a", "b"]},
              {"time": 3.0, "event": "resumed", "after_round": 1, "present": ["a", "b"], "members_before": ["a"]},
              {"time": 4.0, "event": "resumed", "after_round": 1, "present": ["a", "b"], "members_before": ["a", "b"]},
              {"time": 5.0, "event": "non_finite", "node": "b", "round": 2}]
    (run / "membership.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events) + "{broken\n")
    summary = summarize(load_run(run))
    assert summary.membership == ["after round 0: went on without b (a present)",
                                  "after round 1: went on with b again (a, b present)",
                                  "round 2: node b left out of the average (its model went non-finite)"]
    assert "membership.jsonl line 6: not JSON; skipped" in summary.warnings


def test_drill_events_join_the_membership_line_in_time_order_with_the_round_they_fired_in(tmp_path):
    """A restart that leaves the members as they were shows in no membership event: the drill log says it."""
    import json
    run = default_run(tmp_path / "run")
    (run / "membership.jsonl").write_text(json.dumps(
        {"time": 2.0, "event": "resumed", "after_round": 1, "present": ["a"], "members_before": ["a", "b"]}) + "\n")
    drills = [{"time": 1.0, "action": "kill", "node": "b", "round": 2, "fired_in_round": 2},
              {"time": 3.0, "action": "restart", "node": "b", "round": 3, "fired_in_round": 4},
              {"time": 4.0, "action": "thaw", "node": "b", "round": 4, "fired_in_round": 4,
               "note": "skipped: the site is not running (it exited with code 1)"}]
    (run / "drill.jsonl").write_text("".join(json.dumps(row) + "\n" for row in drills))
    summary = summarize(load_run(run))
    assert summary.membership == [  # --drill counts rounds from 1 as the console does; the report from 0
        "drill: kill b in round 1",
        "after round 1: went on without b (a present)",
        "drill: restart b in round 3, asked for round 2",
        "drill: thaw b in round 3 (skipped: the site is not running (it exited with code 1))"]


def test_the_report_reads_gpu_counts_as_the_config_writes_them_and_a_radeon_name_as_one_gpu():
    from geodiloco.report.run_dir import expand_gpu_names
    assert expand_gpu_names(["2 x A30", "3x RTX 3090", "9070 XT", "7900 XTX 24GB"]) == \
        ["A30"] * 2 + ["RTX 3090"] * 3 + ["9070 XT", "7900 XTX 24GB"]
