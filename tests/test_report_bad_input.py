"""Each bad input gives one line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import json

import pytest

from geodiloco.report.cli import main
from geodiloco.report.errors import ReportError
from geodiloco.report.runs import summarize_runs
from test_report_support import default_records, default_run, write_run


def _fails(capsys, argv: list[str], expected: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("idle_report.py: error: ")
    assert expected in err, err
    return err


def test_missing_directory(tmp_path, capsys):
    _fails(capsys, [str(tmp_path / "nope")], "no such directory")


def test_file_instead_of_directory(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run / "idle.jsonl")], "not a directory")


def test_directory_without_idle_log(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _fails(capsys, [str(tmp_path / "empty")], "no idle.jsonl here")


def test_empty_log(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "idle.jsonl").write_text("\n")
    _fails(capsys, [str(tmp_path / "run")], "no complete record")


def test_only_a_truncated_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "idle.jsonl").write_text('{"run_id": "x", "rou')
    _fails(capsys, [str(tmp_path / "run")], "no complete record")


def test_truncated_last_record_is_skipped_with_a_warning(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    full = json.dumps(default_records(rounds=4)[-1])
    with open(run / "idle.jsonl", "a") as handle:
        handle.write(full[: len(full) // 2])
    assert main([str(run), "--json"]) == 0
    captured = capsys.readouterr()
    assert "line 7: truncated last record skipped" in captured.err
    report = json.loads(captured.out)
    assert report["runs"][0]["rounds"] == [0, 1, 2]
    assert report["runs"][0]["total"]["idle_gpu_s"] == pytest.approx(42)


def test_corrupt_line_in_the_middle(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    lines = (run / "idle.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "idle.jsonl").write_text("\n".join(lines) + "\n")
    _fails(capsys, [str(run)], "line 2: not valid JSON")


def test_missing_required_key_names_line_and_key(tmp_path, capsys):
    records = default_records()
    del records[3]["wait_s"]
    run = write_run(tmp_path / "run", records)
    _fails(capsys, [str(run)], "line 4: wait_s: Field required")


def test_wrong_type_and_negative_time(tmp_path, capsys):
    records = default_records()
    records[0]["compute_s"] = "fast"
    _fails(capsys, [str(write_run(tmp_path / "a", records))], "line 1: compute_s")
    records = default_records()
    records[0]["wait_s"] = -1.0
    _fails(capsys, [str(write_run(tmp_path / "b", records))], "greater than or equal to 0")
    records = default_records()
    records[0]["round_end"] = 0.0
    _fails(capsys, [str(write_run(tmp_path / "c", records))], "round_end (0.0) is before round_start")
    records = default_records()
    records[0]["compute_s"] = records[0]["round_end"] - records[0]["round_start"] + 100.0
    _fails(capsys, [str(write_run(tmp_path / "d", records))], "exceed the round's span round_end - round_start")
    records = default_records()
    records[0]["num_gpus"] = 0
    _fails(capsys, [str(write_run(tmp_path / "e", records))], "line 1: num_gpus")


def test_runs_mixed_in_one_directory(tmp_path, capsys):
    records = default_records() + default_records(run_id="run-9")[:2]
    err = _fails(capsys, [str(write_run(tmp_path / "run", records))], "records of 2 runs mixed")
    assert "'run-1' (6 records)" in err and "'run-9' (2 records)" in err


def test_same_round_logged_twice(tmp_path, capsys):
    records = default_records() + default_records()[:1]
    _fails(capsys, [str(write_run(tmp_path / "run", records))], "two records for node 'a' in round 0")


def test_metrics_of_another_run(tmp_path, capsys):
    run = write_run(tmp_path / "run", default_records(), metrics=[{"round": 0, "run_id": "other", "loss": 1.0}])
    _fails(capsys, [str(run)], "metrics of run(s) 'other' mixed")


def test_unknown_gpu_in_price_table(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    err = _fails(capsys, [str(run), "--price", "A-30=0.6", "--price", "RTX 2080 Ti=0.25"], "unknown GPU 'A-30'")
    assert "did you mean 'A30'?" in err


def test_gpu_without_a_price(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run), "--price", "A30=0.6"], "no price for GPU 'RTX 2080 Ti' of node 'b'")


def test_bad_price_values(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run), "--price", "A30"], "expected NAME=USD_PER_GPU_HOUR")
    _fails(capsys, [str(run), "--price", "A30=cheap"], "must be a number")
    _fails(capsys, [str(run), "--price", "A30=-1"], ">= 0 USD per GPU-hour")
    price_file = tmp_path / "prices.yaml"
    price_file.write_text("- A30\n")
    _fails(capsys, [str(run), "--price", str(price_file)], "must be a YAML mapping")


def test_price_file_that_does_not_exist(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run), "--price", str(tmp_path / "missing.yaml")], f"{tmp_path / 'missing.yaml'}: no such price file")
    _fails(capsys, [str(run), "--price", "A30"], "or the path of a YAML price file")


def test_prices_for_a_run_whose_gpus_are_not_named(tmp_path, capsys):
    records = default_records()
    for record in records:
        record["gpus"] = []
    run = write_run(tmp_path / "run", records)
    err = _fails(capsys, [str(run), "--price", "A30=0.6"], "(GPUs in the logs: none named)")
    assert 'price its nodes instead: --price "node:NODE=USD_PER_GPU_HOUR"' in err
    err = _fails(capsys, [str(run), "--price", "node:a=1"], "cannot price node 'b': its GPUs are not named")
    assert '--price "node:b=USD_PER_GPU_HOUR"' in err
    _fails(capsys, [str(run), "--price", "node:c=1"], "unknown node 'c': the run(s) have a, b")
    # node a: 2 GPUs x $1.80 for its 12 idle s; node b: 4 GPUs x $0.90 for 4.5 s
    assert main([str(run), "--price", "node:a=1.8", "--price", "node:b=0.9", "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["runs"][0]["total"]
    assert total["idle_cost_usd"] == pytest.approx((12 * 2 * 1.8 + 4.5 * 4 * 0.9) / 3600)


def test_the_command_line_price_wins_over_a_file_in_either_order_and_a_file_prices_each_gpu_once(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    prices = tmp_path / "prices.yaml"
    prices.write_text("A30: 0.60\nRTX 2080 Ti: 0.25\n")
    for order in ([str(prices), "A30=1.5"], ["A30=1.5", str(prices)]):
        assert main([str(run), *sum((["--price", spec] for spec in order), []), "--json"]) == 0
        nodes = json.loads(capsys.readouterr().out)["runs"][0]["nodes"]
        assert [node["usd_per_hour"] for node in nodes] == pytest.approx([2 * 1.5, 4 * 0.25])
    _fails(capsys, [str(run), "--price", "A30=1", "--price", "a30=2", "--price", "RTX 2080 Ti=1"],
           "--price 'a30=2': 'a30' was priced already by --price 'A30=1'")
    prices.write_text("A30: 0.60\nRTX 2080 Ti: 0.25\na30: 6.0\n")
    _fails(capsys, [str(run), "--price", str(prices)], f"{prices}: line 3: 'a30' is priced twice (first at line 1)")
    prices.write_text("A30: yes\n")
    _fails(capsys, [str(run), "--price", str(prices)], "got the YAML boolean true")
    prices.write_text("A30: 0.60\nRTX 2080Ti: 0.25\n")
    err = _fails(capsys, [str(run), "--price", str(prices)], "no price for GPU 'RTX 2080 Ti' of node 'b'")
    assert "the prices have 'RTX 2080Ti': if that is this GPU" in err
    prices.write_text("NVIDIA A30: 0.60\nRTX 2080 Ti: 0.25\n")  # as nvidia-smi prints it
    assert "the prices have 'NVIDIA A30'" in _fails(capsys, [str(run), "--price", str(prices)], "no price for GPU 'A30'")
    prices.write_text("node:a: 1.5\nnode:b: 0.5\n")  # a file may price nodes too
    assert main([str(run), "--price", str(prices), "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["runs"][0]["nodes"]
    assert [node["usd_per_hour"] for node in nodes] == pytest.approx([2 * 1.5, 4 * 0.5])


def test_two_outputs_to_one_file_are_refused(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run), "--json", str(tmp_path / "out"), "--html", str(tmp_path / "out")],
           "--html " + str(tmp_path / "out") + ": the same file as --json")
    assert not (tmp_path / "out").exists()


def test_skip_rounds_out_of_range(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, [str(run), "--skip-rounds", "3"], "leaves no round to report")
    _fails(capsys, [str(run), "--skip-rounds", "-1"], "must be >= 0")


def test_plot_destination_checked(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    assert main([str(run), "--plot", str(tmp_path / "out.jpg")]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "name the file *.png" in printed.err  # refused before the report is printed
    _fails(capsys, [str(run), "--plot", str(tmp_path / "no" / "out.png")], "does not exist")


def test_json_before_the_run_directory_says_where_it_goes(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    _fails(capsys, ["--json", str(run)], f"put --json after the run directories (geodiloco report {run} --json)")
    _fails(capsys, [], "no RUN_DIR: name at least one run directory")


def test_the_report_never_overwrites_the_runs_own_logs(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    before = (run / "idle.jsonl").read_bytes()
    for name in ("idle.jsonl", "config.yaml"):
        _fails(capsys, [str(run), "--json", str(run / name)], "a file of the run itself")
    assert (run / "idle.jsonl").read_bytes() == before
    assert main([str(run), "--json", str(run / "report.json")]) == 0
    assert json.loads((run / "report.json").read_text())["runs"][0]["stopped_s"] == 0.0


def test_plan_log_with_a_bad_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", default_records(), plans=[{"round": 0}])
    _fails(capsys, [str(run)], "plan.jsonl line 1: nodes: Field required")
    negative = write_run(tmp_path / "negative", default_records(),
                         plans=[{"round": 0, "nodes": [{"name": "a", "predicted_idle_s": -50.0}]}])
    _fails(capsys, [str(negative)], "plan.jsonl line 1: nodes.0.predicted_idle_s: Input should be greater than or "
                                    "equal to 0 (got -50.0)")
    not_a_number = write_run(tmp_path / "nan", default_records(), plans=[{"round": 0, "nodes": [{"name": "a"}]},
                                                                         {"round": 1, "predicted_round_s": float("nan"),
                                                                          "nodes": [{"name": "a"}]}])
    _fails(capsys, [str(not_a_number)], "plan.jsonl line 2: predicted_round_s: Input should be a finite number")


def test_not_utf8(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "idle.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    _fails(capsys, [str(tmp_path / "run")], "not a UTF-8 text file")


def test_json_line_that_is_not_an_object(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "idle.jsonl").write_text("[1, 2]\n" + json.dumps(default_records()[0]) + "\n")
    _fails(capsys, [str(tmp_path / "run")], "line 1: expected a JSON object, got list")


def test_a_price_file_may_list_gpus_the_run_lacks_but_a_flag_may_not(tmp_path):
    from geodiloco.report.errors import ReportError
    from geodiloco.report.pricing import parse_prices
    prices = tmp_path / "prices.yaml"
    prices.write_text("A30: 0.60\nH100: 2.50\n")
    parse_prices([str(prices)]).check_known({"A30"})
    with pytest.raises(ReportError, match="unknown GPU 'H100': no node of the run"):
        parse_prices(["A30=0.6", "H100=2.5"]).check_known({"A30"})


def test_a_run_named_twice_is_refused_in_one_line(tmp_path):
    run = default_run(tmp_path / "run")
    with pytest.raises(ReportError, match=r"the same run directory as .*run; name each run once"):
        summarize_runs([str(run), str(run) + "/"], [])


def test_a_log_that_is_a_folder_and_a_config_that_is_a_list_are_warned_about(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    (run / "metrics.jsonl").mkdir()
    (run / "config.yaml").write_text("- a\n- b\n")
    assert main([str(run)]) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl: not a file; left out of the report" in err
    assert "config.yaml: not a mapping of sections (a list); labels come from idle.jsonl" in err


def test_a_node_missing_from_a_round_it_took_part_in_is_warned_about_unless_it_was_absent_or_async(tmp_path, capsys):
    records = default_records()[:-1]  # b's record of round 2 lost
    assert main([str(write_run(tmp_path / "lost", records))]) == 0
    assert ("node b has no record of round 2 (the run stopped mid-round, a line was lost, or another site's run "
            "directory holds it") in capsys.readouterr().err
    absent = [dict(record, present_nodes=["a"]) if record["round"] == 2 else record for record in records]
    assert main([str(write_run(tmp_path / "absent", absent))]) == 0  # an elastic round without b
    assert "has no record" not in capsys.readouterr().err
    phases = [dict(record, mode="async") for record in records]
    assert main([str(write_run(tmp_path / "async", phases))]) == 0
    assert "has no record" not in capsys.readouterr().err
