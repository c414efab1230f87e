"""`geodiloco evaluate`: each kept round's global model scored on the run's held-out set, after the run."""
import json

import pytest

from runtime_helpers import geodiloco, read_jsonl, small_config, write_config

pytestmark = pytest.mark.slow


def run(tmp_path, eval_every_rounds):
    nodes = [{"name": "a"}, {"name": "b"}]
    config = small_config(nodes, diloco={"rounds": 3, "local_steps": 3, "batch_size": 4},
                          checkpoint={"every_rounds": 1, "keep": 3})
    config["data"].update({"eval_batches": 4, "eval_batch_size": 4, "eval_every_rounds": eval_every_rounds})
    run_dir = tmp_path / f"run{eval_every_rounds}"
    completed = geodiloco("run", "--config", str(write_config(tmp_path, config, f"c{eval_every_rounds}.yaml")),
                          "--sites", "local", "--run-dir", str(run_dir), "--no-report", timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return run_dir


def test_offline_scores_equal_the_in_run_evaluation_of_the_same_rounds(tmp_path):
    run_dir = run(tmp_path, eval_every_rounds=1)
    in_run = {row["round"]: row for row in read_jsonl(run_dir / "metrics.jsonl")
              if row["node"] == "global" and row["eval_loss"] is not None}
    completed = geodiloco("evaluate", str(run_dir), "--json")
    assert completed.returncode == 0, completed.stderr
    offline = json.loads(completed.stdout)
    assert [row["round"] for row in offline] == [0, 1, 2] == sorted(in_run)
    for row in offline:
        assert row["sequences"] == 16
        assert row["eval_loss"] == pytest.approx(in_run[row["round"]]["eval_loss"], abs=1e-5)
        assert row["eval_loss_se"] == pytest.approx(in_run[row["round"]]["eval_loss_se"], abs=1e-5)
    assert read_jsonl(run_dir / "eval.jsonl") == offline

    # later: round 1's checkpoint pruned, round 2's damaged. Evaluating again scores round 3, names round 2,
    # and keeps the earlier rows of both in eval.jsonl instead of wiping them
    import shutil
    shutil.rmtree(run_dir / "checkpoints" / "round_00000")
    damaged = run_dir / "checkpoints" / "round_00001" / "global.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    again = geodiloco("evaluate", str(run_dir))
    assert again.returncode == 0, again.stderr
    assert f"round 2 (logs: 1) skipped: checkpoint refused: {damaged}: not a readable safetensors file" in again.stderr
    assert [line.split(":")[0] for line in again.stdout.splitlines()] == ["round 3 (logs"]
    assert read_jsonl(run_dir / "eval.jsonl") == offline


def test_eval_every_rounds_0_keeps_the_set_out_but_evaluates_nothing_in_the_run(tmp_path):
    run_dir = run(tmp_path, eval_every_rounds=0)
    global_rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] == "global"]
    assert len(global_rows) == 3 and all(row["eval_loss"] is None for row in global_rows)
    completed = geodiloco("evaluate", str(run_dir))
    assert completed.returncode == 0, completed.stderr
    assert "round 3 (logs: 2): eval loss" in completed.stdout and "(16 sequences)" in completed.stdout


def test_evaluate_names_what_is_missing(tmp_path):
    completed = geodiloco("evaluate", str(tmp_path))
    assert completed.returncode == 2
    assert "has no config.yaml" in completed.stderr
    gone = geodiloco("evaluate", str(tmp_path / "gone"))
    assert gone.returncode == 2 and f"{tmp_path / 'gone'}: no such directory" in gone.stderr


def test_evaluate_and_export_say_alike_what_is_wrong_with_the_path_and_that_no_round_is_saved_yet(tmp_path, capsys):
    import yaml

    from geodiloco.runtime.cli import main
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for command in (["evaluate", str(a_file)], ["export", str(a_file), "--out", str(tmp_path / "out")]):
        assert main(command) == 2
        assert f"{a_file}: a file, not a run directory" in capsys.readouterr().err
    for command in (["evaluate", str(tmp_path / "gone")], ["export", str(tmp_path / "gone"), "--out", str(tmp_path / "o")]):
        assert main(command) == 2
        assert f"{tmp_path / 'gone'}: no such directory" in capsys.readouterr().err
    starting = tmp_path / "starting"
    starting.mkdir()
    (starting / "config.yaml").write_text(yaml.safe_dump(small_config([{"name": "a"}])))
    assert main(["evaluate", str(starting)]) == 2
    assert "no checkpoint yet: the run has not saved a round (a running one saves after every 1 round(s))" in \
        capsys.readouterr().err
