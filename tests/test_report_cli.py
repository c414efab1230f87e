"""The report's entry points: tables, --rounds, --compare, --json, --html, --plot, the script and geodiloco."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from geodiloco.report.cli import main
from test_report_support import NODE_A, NODE_B, default_run, idle_record, write_jsonl, write_run

REPO = Path(__file__).resolve().parent.parent
PRICES = ["--price", "A30=0.60", "--price", "RTX 2080 Ti=0.25"]


@pytest.fixture(autouse=True)
def piped_width(monkeypatch):
    """The tables as a pipe gets them (160 columns): a COLUMNS exported in the shell running the tests would
    otherwise set the width and wrap the lines these tests read."""
    monkeypatch.delenv("COLUMNS", raising=False)


def _tuned_run(directory: Path) -> Path:
    """The default cluster under a better policy: a waits 1 s instead of 3 s, rounds of 8 s."""
    records = [idle_record(r, dict(NODE_A, wait_s=1.0), run_id="run-2", policy="time", round_s=8.0) for r in range(3)]
    records += [idle_record(r, dict(NODE_B, compute_s=6.5), run_id="run-2", policy="time", round_s=8.0)
                for r in range(3)]
    return write_run(directory, records, config={"run": {"name": "tuned"}})


def test_terminal_report_shows_hand_computed_numbers(tmp_path, capsys):
    run = default_run(tmp_path / "run")
    assert main([str(run), *PRICES, "--skip-rounds", "1", "--rounds"]) == 0
    out = capsys.readouterr().out
    assert "warm-up rounds 0 excluded (--skip-rounds 1)" in out
    assert "2 rounds reported (1–2; from 0, as the logs count: the console's round 1 is round 0)" in out
    # a: idle 8 s of 20 s = 40 %, 16 GPU-s; total 28 GPU-s of 120 = 23.3 %, 28/2*1000/3600 = 3.889 GPU-h
    assert "40.0 %" in out and "16.0" in out
    # its parts: a waits 2 x 3 s x 2 GPUs; sync 2 x 1 s x (2 + 4 GPUs); b's other 2 x 0.5 s x 4 GPUs
    assert ("28.0 GPU-s idle of 120 GPU-s (23.3 %): waiting 12.0, exposed sync 12.0, other 4.00 GPU-s; "
            "3.889 GPU-h per 1,000 rounds") in out
    assert "priced in USD per GPU-hour: A30 0.6 (--price 'A30=0.60'); RTX 2080 Ti 0.25 (--price 'RTX 2080 Ti=0.25')" in out
    # cost: (8 s x $1.20/h + 3 s x $1.00/h) / 3600 = $0.0035; per 1k rounds $1.75
    assert "$0.0035 idle ($1.75 per 1,000 rounds)" in out
    assert "4.00  H 100 B 4" in out
    assert "Energy not available" in out


def test_compare_shows_each_runs_final_eval_and_names_the_best_model_apart_from_the_least_idle(tmp_path, capsys):
    """The least idle run (tuned) ended on the worse model: the table shows both losses, and a second line says
    which run's model scored best."""
    def metrics(train_loss, eval_loss, run_id):
        return [{"round": 2, "node": name, "loss": train_loss, "run_id": run_id} for name in "ab"] + [
            {"round": 2, "node": "global", "eval_loss": eval_loss, "run_id": run_id}]

    base = default_run(tmp_path / "uniform")
    write_jsonl(base / "metrics.jsonl", metrics(2.6, 2.612, "run-1"))
    tuned = _tuned_run(tmp_path / "time")
    write_jsonl(tuned / "metrics.jsonl", metrics(2.5, 4.870, "run-2"))
    assert main([str(base), str(tuned), "--compare"]) == 0
    out = capsys.readouterr().out
    assert "final" in out and "eval" in out
    assert next(line for line in out.splitlines() if line.strip().startswith("tuned ★")).split()[-2:] == [
        "2.500", "4.870"]
    assert "Least idle: tuned (time)" in out
    assert "Lowest final eval loss: demo (uniform), 2.612; the least idle run, tuned, ended at 4.870" in out


def test_compare_shows_reduction_and_throughput(tmp_path, capsys):
    base, tuned = default_run(tmp_path / "uniform"), _tuned_run(tmp_path / "time")
    assert main([str(base), str(tuned), "--compare"]) == 0
    out = capsys.readouterr().out
    assert "-28.6 %" in out  # 30 / 42 - 1
    assert "1.25×" in out  # 30 s / 24 s for the same tokens
    assert "Least idle: tuned (time)" in out
    assert "demo" in out and "tuned ★" in out


def test_a_narrow_terminal_wraps_the_tables_lines_instead_of_cutting_their_numbers(tmp_path, capsys, monkeypatch):
    run = default_run(tmp_path / "run")
    monkeypatch.setenv("COLUMNS", "60")
    assert main([str(run), *PRICES, "--rounds"]) == 0
    captured = capsys.readouterr()
    [row_a] = [line for line in captured.out.splitlines() if line.startswith("  a ")]
    # a: compute 18 s, wait 9, sync 3, other 0, idle 12 of 30 s = 40 %
    assert row_a.split()[4:11] == ["18.0", "9.00", "3.00", "0.00", "12.0", "40.0", "%"] and "…" not in captured.out
    assert len(row_a) > 60
    assert "note: the report's tables need" in captured.err and "the terminal has 60" in captured.err


def test_compare_marks_async_and_simulated_runs(tmp_path, capsys):
    simulated = default_run(tmp_path / "sim")
    records = [idle_record(r, node, run_id="run-2", source="runtime", mode="async") for r in range(3)
               for node in (NODE_A, NODE_B)]
    asynchronous = write_run(tmp_path / "async", records, config={"run": {"name": "async"}})
    assert main([str(simulated), str(asynchronous), "--compare"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the caption wraps at the table's width
    assert "uniform · simulated" in out and "uniform · async" in out
    assert "async: a round is each node's phase of that number" in out
    assert "simulated: times from geodiloco simulate, not from a run" in out


def test_json_report(tmp_path, capsys):
    base, tuned = default_run(tmp_path / "uniform"), _tuned_run(tmp_path / "time")
    out_file = tmp_path / "report.json"
    assert main([str(base), str(tuned), *PRICES, "--json", str(out_file)]) == 0
    document = json.loads(out_file.read_text())
    first, second = document["runs"]
    assert first["total"]["idle_gpu_s"] == pytest.approx(42)
    assert first["total"]["idle_cost_usd"] == pytest.approx((12 * 1.2 + 4.5) / 3600)
    assert first["energy_available"] is False and first["total"]["energy"]["idle_energy_kwh"] is None
    assert [node["node"] for node in second["nodes"]] == ["a", "b"]
    assert document["comparison"][1]["idle_change"] == pytest.approx(30 / 42 - 1)
    assert "GPU time per node" in capsys.readouterr().out  # a JSON file leaves the tables on stdout
    assert main([str(base), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["run_id"] == "run-1"


def test_html_export(tmp_path, capsys):
    html = tmp_path / "report.html"
    assert main([str(default_run(tmp_path / "run")), "--html", str(html)]) == 0
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "GPU time per node" in page and "23.3 %" in page


def test_an_output_path_that_cannot_be_written_fails_before_the_report(tmp_path, capsys):
    run = str(default_run(tmp_path / "run"))
    assert main([run, "--plot", str(tmp_path / "missing" / "x.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", "nothing of the report is printed first"
    assert f"--plot {tmp_path / 'missing' / 'x.png'}: its folder {tmp_path / 'missing'} does not exist" in captured.err
    assert main([run, "--html", str(tmp_path)]) == 2
    assert f"--html {tmp_path}: a folder; give a file name" in capsys.readouterr().err


def test_plot_timeline_and_bars(tmp_path, capsys):
    base, tuned = default_run(tmp_path / "uniform"), _tuned_run(tmp_path / "time")
    single, both = tmp_path / "single.png", tmp_path / "both.png"
    assert main([str(base), "--plot", str(single)]) == 0
    assert main([str(base), str(tuned), "--compare", "--plot", str(both)]) == 0
    single_image, both_image = matplotlib.image.imread(single), matplotlib.image.imread(both)
    assert single.stat().st_size > 20_000
    assert single_image.shape[1] == 1440 and single_image.shape[0] >= 300
    assert both_image.shape[0] > 2 * single_image.shape[0]
    assert single_image[..., :3].std() > 0.05  # not a blank canvas


NOT_INSTALLED = (
    "import runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
    "sys.path[:] = [p for p in sys.path if '__editable__' not in p]\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")
"""Runs a script as from a checkout that is not installed: the editable install's finder is taken away."""


def test_script_runs_from_a_checkout(tmp_path):
    run = default_run(tmp_path / "run")
    result = subprocess.run([sys.executable, "-c", NOT_INSTALLED, str(REPO / "scripts" / "idle_report.py"), str(run),
                             "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["runs"][0]["total"]["idle_gpu_s"] == pytest.approx(42)
    broken = subprocess.run([sys.executable, str(REPO / "scripts" / "idle_report.py"), str(tmp_path / "nope")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert broken.returncode == 2
    assert broken.stderr.strip().startswith("idle_report.py: error:") and "Traceback" not in broken.stderr


def test_script_without_the_reports_dependencies_says_which_and_how(tmp_path):
    without_rich = "import sys\nsys.modules['rich'] = None\n" + NOT_INSTALLED  # import rich then fails
    run = default_run(tmp_path / "run")
    result = subprocess.run([sys.executable, "-c", without_rich, str(REPO / "scripts" / "idle_report.py"), str(run)],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "idle_report.py: error: this Python lacks 'rich', which the report needs: run it with the project's "
        "environment (.venv/bin/python scripts/idle_report.py ...), or pip install numpy pyyaml pydantic rich")


def test_geodiloco_report_subcommand(tmp_path, capsys):
    from geodiloco.runtime.cli import main as geodiloco

    assert geodiloco(["report", str(default_run(tmp_path / "run")), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["label"] == "demo"
    assert geodiloco(["report", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("geodiloco report: error:")


E2E_CONFIG = """\
run: {name: report-e2e, out_dir: runs, seed: 0}
model: {preset: tiny, seq_len: 32}
data: {source: stdlib, max_bytes: 200000, eval_batches: 1, eval_batch_size: 2}
diloco: {rounds: 2, local_steps: 2, batch_size: 2}
balancing: {policy: uniform}
checkpoint: {every_rounds: 5}
nodes:
  - {name: fast, site: seoul, gpus: ["A30"], emulate: {step_time_s: 0.02}}
  - {name: slow, site: busan, gpus: ["RTX 2080 Ti"], emulate: {step_time_s: 0.3}}
"""


@pytest.mark.slow
def test_report_of_a_real_run(tmp_path):
    config, run_dir = tmp_path / "run.yaml", tmp_path / "run"
    config.write_text(E2E_CONFIG)
    launched = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--config", str(config),
                               "--sites", "local", "--run-dir", str(run_dir), "--no-report"],
                              capture_output=True, text=True, cwd=REPO, timeout=170)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert main([str(run_dir), "--json", str(tmp_path / "report.json"), "--plot", str(tmp_path / "run.png")]) == 0
    run = json.loads((tmp_path / "report.json").read_text())["runs"][0]
    nodes = {node["node"]: node for node in run["nodes"]}
    assert run["rounds"] == [0, 1] and run["sources"] == ["runtime"]
    assert nodes["fast"]["wait_s"] > nodes["slow"]["wait_s"]  # the emulated A30 waits for the slow GPU
    assert run["total"]["idle_gpu_s"] == pytest.approx(sum(node["idle_gpu_s"] for node in nodes.values()))
    assert run["energy_note"].startswith("not available")
    assert (tmp_path / "run.png").stat().st_size > 20_000


def test_the_planner_column_is_labelled_as_wait_plus_sync(tmp_path, capsys):
    """The planner predicts waiting and exposed sync, not "other": its column must not read as idle."""
    from test_report_support import default_records
    plans = [{"policy": "uniform", "round": r, "nodes": [{"name": "a", "predicted_idle_s": 2.5},
                                                         {"name": "b", "predicted_idle_s": 0.5}]} for r in range(3)]
    run = write_run(tmp_path / "run", default_records(), plans=plans, config={"run": {"name": "demo"}})
    assert main([str(run), "--rounds"]) == 0
    out = capsys.readouterr().out
    assert out.count("wait+sync s") == 2  # the node table's and the per-round table's headers (two lines each)
    assert "predicted\nidle" not in out and "predicted idle s" not in out
    total_row = next(line for line in out.splitlines() if line.strip().startswith("total"))
    assert total_row.split()[-1] == "9.00"  # 3 rounds x (2.5 + 0.5)


def test_a_reader_that_stops_early_costs_neither_the_plot_nor_the_html_and_exits_141_quietly(tmp_path):
    run = default_run(tmp_path / "run")
    plot, html = tmp_path / "idle.png", tmp_path / "report.html"
    process = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "report", str(run), "--rounds",
                                "--plot", str(plot), "--html", str(html)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, bufsize=1)
    assert process.stdout.readline().startswith("Run demo")
    process.stdout.close()  # what `| head -1` does after its line
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 141, stderr
    assert plot.read_bytes().startswith(b"\x89PNG") and "<html" in html.read_text()
    assert "Traceback" not in stderr and "Error" not in stderr


def test_run_directories_may_follow_an_option_and_an_unknown_option_gets_the_reports_usage(tmp_path):
    base, tuned = default_run(tmp_path / "uniform"), _tuned_run(tmp_path / "time")
    shown = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "report", str(base), "--compare", str(tuned)],
                           cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "Least idle: tuned (time)" in shown.stdout
    refused = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "report", str(base), "--bogus"],
                             cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2
    assert refused.stderr.startswith("usage: geodiloco report")
    assert refused.stderr.rstrip().endswith("geodiloco report: error: unrecognized arguments: --bogus")


def test_the_per_round_view_of_an_async_run_says_its_rounds_overlap(tmp_path, capsys):
    records = [idle_record(r, dict(node, mode="async", staleness=1)) for r in range(2) for node in (NODE_A, NODE_B)]
    assert main([str(write_run(tmp_path / "async", records)), "--rounds"]) == 0
    assert "the nodes' phases overlap" in " ".join(capsys.readouterr().out.split())
    assert main([str(default_run(tmp_path / "sync")), "--rounds"]) == 0
    assert "phases overlap" not in capsys.readouterr().out


def test_a_run_still_training_is_reported_as_in_progress_with_its_latest_loss(tmp_path, capsys, monkeypatch):
    """The launcher's lock names a live geodiloco process: the loss is the latest, not the final one."""
    run = default_run(tmp_path / "run")
    write_jsonl(run / "metrics.jsonl", [{"round": 2, "node": "a", "loss": 2.5, "run_id": "run-1"}])
    launcher = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)",
                                 "geodiloco"], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline() == "up\n"  # running under its own command line
        (run / ".launcher.lock").write_text(f"pid {launcher.pid}\n")
        assert main([str(run)]) == 0
        out = capsys.readouterr().out
        assert "latest loss 2.500" in out and "final loss" not in out
        assert f"in progress: its launcher (pid {launcher.pid}) is still training" in out
        # the launcher reports its own run at its end, still holding the lock: that run has finished
        monkeypatch.setattr("geodiloco.report.run_dir.os.getpid", lambda: launcher.pid)
        assert main([str(run)]) == 0
        assert "in progress" not in capsys.readouterr().out
        monkeypatch.undo()
    finally:
        launcher.kill()
        launcher.wait()
    assert main([str(run)]) == 0  # the launcher has ended: the lock file stays, the run is finished
    out = capsys.readouterr().out
    assert "final loss 2.500" in out and "in progress" not in out


def test_timeline_labels_keep_their_distance_on_rounds_of_unequal_lengths():
    from geodiloco.report.plots import MAX_ROUND_LABELS, labelled_round_starts
    # 300 rounds: 280 of 1 s, then 20 of 50 s (a slow stretch): the labels fall by time, not by count
    starts, clock_s = [], 0.0
    for round_index in range(300):
        starts.append((round_index, clock_s))
        clock_s += 1.0 if round_index < 280 else 50.0
    chosen = labelled_round_starts(starts, clock_s)
    assert len(chosen) <= MAX_ROUND_LABELS + 1 and chosen[0] == (0, 0.0)
    gaps_s = [later[1] - earlier[1] for earlier, later in zip(chosen, chosen[1:])]
    assert min(gaps_s) >= clock_s / MAX_ROUND_LABELS  # 1,280 s / 25: no two labels closer than 51 s
    assert labelled_round_starts([(0, 0.0), (1, 5.0)], 10.0) == [(0, 0.0), (1, 5.0)]


def test_names_in_edited_logs_reach_the_terminal_and_the_html_as_plain_text(tmp_path, capsys):
    # a run folder someone edited: escape sequences (window title, colour) and rich markup in a node's name
    named = dict(NODE_A, node="a\x1b]0;TITLE\x07\x1b[31m[bold]x[/bold][link=javascript:alert(1)]y[/link]\u202egpj")
    records = [idle_record(r, named) for r in range(2)] + [idle_record(r, NODE_B) for r in range(2)]
    run = write_run(tmp_path / "run", records, config={"run": {"name": "edited\x1b[2J"}})
    html = tmp_path / "report.html"
    assert main([str(run), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "[bold]x[/bold]" in out  # shown as written, not turned into a style
    page = html.read_text()
    assert "javascript:" not in page.replace("[link=javascript:alert(1)]", "")
    assert 'href="javascript' not in page
