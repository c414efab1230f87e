"""Mistakes a user makes on the command line end in one line that names the path, option or field and
exit status 2 (or 141 when the reader of the output went away), never in a traceback or a silent run."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from geodiloco.balancer.cluster import SlowdownEvent
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import expand_gpu_counts
from geodiloco.runtime.cli import main
from tests.runtime_helpers import REPO_ROOT

CLUSTER = str(REPO_ROOT / "experiments" / "configs" / "clusters" / "paper4.yaml")


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_an_output_path_that_is_a_file_or_cannot_be_made_is_one_line(tmp_path, capsys):
    taken = tmp_path / "afile"
    taken.write_text("")
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--rounds", "2", "--out", str(taken))
    assert code == 2 and err == f"geodiloco simulate: error: {taken}: file exists; choose another path\n"
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--rounds", "2", "--out", str(taken / "below"))
    assert code == 2 and err == f"geodiloco simulate: error: {taken / 'below'}: not a directory; choose another path\n"


@pytest.mark.parametrize("written", ["-2 x A30", "2.5 x A30", "4 x", "3 *"])
def test_a_gpu_count_written_wrongly_is_an_error_not_a_gpu_name(written):
    with pytest.raises(ConfigError, match="a GPU count is a whole number of 1 or more followed by the GPU's name"):
        expand_gpu_counts([written])


@pytest.mark.parametrize("written, message", [
    ("", "'': a GPU name is empty"),
    ("   ", "'   ': a GPU name is empty"),
    ("x A30", "'x A30': the GPU count is missing before the 'x' (e.g. \"4 x A30\")"),
])
def test_an_empty_gpu_name_or_a_count_left_out_is_an_error_not_an_unknown_gpu(written, message):
    with pytest.raises(ConfigError) as caught:
        expand_gpu_counts([written])
    assert str(caught.value).startswith(message)


def test_gpu_counts_written_as_people_do_expand():
    assert expand_gpu_counts(["2 * A30", "3x RTX 3090", "V100"]) == ["A30", "A30"] + ["RTX 3090"] * 3 + ["V100"]


def test_a_name_that_starts_with_digits_and_an_x_is_one_gpu_not_a_count():
    """"9070 XT" once read as 9070 GPUs named "T": an x after a space counts only when a space follows it."""
    assert expand_gpu_counts(["9070 XT", "7900 XTX 24GB", "2 x 9060 XT", "8xH100", "2 × V100", "4 X A30"]) == \
        ["9070 XT", "7900 XTX 24GB"] + ["9060 XT"] * 2 + ["H100"] * 8 + ["V100"] * 2 + ["A30"] * 4


def test_a_slowdown_that_cannot_take_effect_is_refused(capsys):
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--rounds", "5", "--slowdown", "node3:4:2:2")
    assert code == 2 and "--slowdown 'node3:4:2:2': UNTIL (2) must come after ROUND (4)" in err
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--rounds", "5", "--slowdown", "node3:50:2")
    assert code == 2 and "it starts after the last simulated round (--rounds 5 runs rounds 0-4)" in err
    with pytest.raises(ValueError, match="until_round \\(3\\) must come after from_round \\(3\\)"):
        SlowdownEvent(from_round=3, factor=2.0, until_round=3)


def test_an_error_in_an_option_names_the_option_not_only_the_file(capsys):
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--straggler-prob", "1.5")
    assert code == 2 and f"{CLUSTER} (with --straggler-prob 1.5): balancing.simulation.straggler_prob" in err
    code, _, err = run(capsys, "run", "--no-report", "--set", "diloco.locl_steps=3")
    assert code == 2 and "(with --set diloco.locl_steps=3): diloco.locl_steps: unknown key" in err


def test_a_folder_given_as_the_config_file_says_so(tmp_path, capsys):
    code, _, err = run(capsys, "plan", "--cluster", str(tmp_path))
    assert code == 2 and err == f"geodiloco plan: error: {tmp_path}: a folder, not a file; pass the path of a YAML config\n"


def test_elastic_and_fixed_membership_together_are_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--elastic", "--no-elastic"])
    assert stopped.value.code == 2
    assert "argument --no-elastic: not allowed with argument --elastic" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_a_table_with_status_141():
    process = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "plan", "--cluster", CLUSTER],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # like `| head` that has already exited
    err = process.stderr.read()
    assert process.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_geodiloco_train_names_itself_in_its_usage_and_errors(tmp_path):
    def train(*argv):
        return subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "train", *argv], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60)
    shown = train("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: geodiloco train [-h] --config CONFIG")
    missing = train("--config", str(tmp_path / "none.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.rstrip().endswith(f"geodiloco train: error: {tmp_path / 'none.yaml'}: no such file; "
                                            "pass the path of a YAML config")


def test_a_permission_error_names_the_path_and_both_fixes():
    import errno

    from geodiloco.runtime.cli import path_error
    assert path_error(PermissionError(errno.EACCES, "Permission denied", "run/config.yaml")) == \
        "run/config.yaml: permission denied; check its permissions, or choose another path"


def two_node_file(tmp_path, head: str, node_a: str = '{name: a, gpus: ["A30"]}') -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(f'{head}\nnodes:\n  - {node_a}\n  - {{name: b, gpus: ["RTX 3090"]}}\n')
    return str(path)


@pytest.mark.parametrize("head, message", [
    ("balancng: {policy: time}", "balancng: unknown section; did you mean 'balancing'?"),
    ("model: {preset: small, seq_lenn: 512}", "model.seq_lenn: unknown key; did you mean 'seq_len'?"),
    ("diloco: {local_step: 50}", "diloco.local_step: unknown key; did you mean 'local_steps'?"),
    ("balancing: time", "balancing: Input should be a valid dictionary"),
    ("balancing: {policy: time, round_time_s: .inf}", "balancing.round_time_s: Input should be a finite number"),
    ('diloco: {local_steps: "0"}', "diloco.local_steps: Input should be greater than"),
    ("diloco: {overlap: streaming, fragments: true}", "diloco.fragments: expected a number, not a boolean (got True)"),
    ("diloco: {rounds: true}", "diloco.rounds: expected a number, not a boolean (got True)"),
    # a finite but huge wait overflowed torch's C int in every worker, after the nodes started
    ("comm: {timeout_s: 1.0e+308}", "comm.timeout_s: Input should be less than or equal to 2592000"),
    ("comm: {elastic: {failure_timeout_s: 1.0e+20}}",
     "comm.elastic.failure_timeout_s: Input should be less than or equal to 2592000"),
])
def test_plan_checks_a_run_configs_sections_as_a_run_does(tmp_path, capsys, head, message):
    path = two_node_file(tmp_path, head)
    code, out, err = run(capsys, "plan", "--cluster", path)
    assert code == 2 and out == "" and err.startswith(f"geodiloco plan: error: {path}: ") and message in err, err


def test_plan_reads_a_files_whole_numbers_as_a_run_reads_them(tmp_path, capsys):
    path = two_node_file(tmp_path, "diloco: {overlap: streaming, fragments: '8', local_steps: 40.0}")
    code, out, err = run(capsys, "plan", "--cluster", path, "--json")
    assert code == 0, err  # both were refused ("must be a positive integer, got 40.0")
    assert max(node["local_steps"] for node in json.loads(out)["nodes"]) >= 40


def test_a_cluster_files_own_notes_are_left_alone_and_its_precision_is_planned(tmp_path, capsys):
    path = two_node_file(tmp_path, "paper_notes: {source: table 3}\nmodel: {preset: llama-150m, seq_len: 1024, "
                                   "precision: fp32}")
    code, out, _ = run(capsys, "plan", "--cluster", path, "--policy", "time", "--json")
    assert code == 0
    fp32 = {node["name"]: node["predicted_step_s"] for node in __import__("json").loads(out)["nodes"]}
    code, out, _ = run(capsys, "plan", "--cluster", path, "--policy", "time", "--json", "--precision", "bf16")
    bf16 = {node["name"]: node["predicted_step_s"] for node in __import__("json").loads(out)["nodes"]}
    # the A30's FP32 rate is a twentieth of its BF16 tensor rate; the RTX 3090's FP32 rate half its FP16 one
    assert fp32["a"] > 3 * bf16["a"] and fp32["a"] > fp32["b"] and bf16["a"] < bf16["b"]


@pytest.mark.parametrize("node_a, message", [
    ("{name: a, gpus: {A30: 2}}", 'nodes[0].gpus: a list of GPU names, not a mapping; write ["2 x A30"]'),
    ('{name: a, gpus: ["100000 x A30"]}', "a GPU count of at most 65,536 per entry is planned"),
    ('{name: a, gpus: ["A30"], measured: {batch_size: 4, step_time_s: .inf}}', "Input should be a finite number"),
])
def test_a_node_whose_gpus_or_times_cannot_be_planned_is_refused(tmp_path, capsys, node_a, message):
    code, _, err = run(capsys, "plan", "--cluster", two_node_file(tmp_path, "", node_a))
    assert code == 2 and message in err, err


def test_gpu_files_written_as_one_path_and_a_missing_env_file_are_named(tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "plan", "--cluster", two_node_file(tmp_path, "gpu_files: mine.yaml"))
    assert code == 2 and "gpu_files: a list of GPU files, e.g. gpu_files: [mine.yaml]" in err
    from geodiloco.predictor import specs
    monkeypatch.setattr(specs, "_registry", None)
    monkeypatch.setenv("GEODILOCO_GPU_FILES", str(tmp_path / "nope.yaml"))
    code, out, err = run(capsys, "predict", "--gpu", "A30", "--model", "llama-150m")
    assert code == 2 and out == ""
    assert f"GEODILOCO_GPU_FILES: {tmp_path / 'nope.yaml'}: no such file" in err and "fix the path or unset" in err
    monkeypatch.delenv("GEODILOCO_GPU_FILES")
    monkeypatch.setattr(specs, "_registry", None)


@pytest.mark.parametrize("factor", ["nan", "inf", "1e300"])
def test_a_slowdown_factor_that_is_not_a_finite_number_up_to_1000_is_refused(capsys, factor):
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--rounds", "2", "--slowdown", f"node3:1:{factor}")
    assert code == 2 and "FACTOR a number above 0 and at most 1000" in err and "Traceback" not in err


def test_a_key_written_twice_is_refused_with_both_lines(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text('nodes:\n  - {name: a, gpus: ["A30"]}\n  - {name: b, gpus: ["A30"]}\nnodes:\n  - {name: c, gpus: ["A30"]}\n')
    code, out, err = run(capsys, "plan", "--cluster", str(path))
    assert code == 2 and out == ""
    assert err == (f"geodiloco plan: error: {path}: line 4: 'nodes' is written twice (first on line 1); a mapping "
                   "holds each key once, so one of them would be lost\n")


def test_a_node_that_fits_no_sample_is_named_and_the_advice_leaves_out_what_was_tried(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text('nodes:\n  - {name: slice, gpus: ["A100-SXM4-40GB MIG 1g.5gb"]}\n  - {name: b, gpus: ["RTX 3090"]}\n')
    code, _, err = run(capsys, "plan", "--cluster", str(path))
    assert code == 2
    assert err.startswith("geodiloco plan: error: node slice: 12-layer model with hidden 1024 does not fit in "
                          "A100-SXM4-40GB MIG 1g.5gb memory (5.0 GiB) even at batch 1; use a smaller model, "
                          "activation checkpointing or a larger GPU"), err
    code, _, err = run(capsys, "predict", "--gpu", "A100-SXM4-40GB MIG 1g.5gb", "--model", "llama-150m",
                       "--batch-size", "1", "--seq-len", "1024", "--activation-checkpointing")
    assert code == 2 and err.rstrip().endswith("even at batch 1 with activation checkpointing; use a smaller model "
                                               "or a larger GPU"), err


def test_no_elastic_is_saved_with_the_run_so_a_resume_keeps_fixed_membership(tmp_path, monkeypatch):
    import contextlib

    import yaml

    from geodiloco.runtime import launch
    started = []

    @contextlib.contextmanager
    def no_sites(config, mode, train_args, elastic):
        started.append(elastic)
        yield [], None

    monkeypatch.setattr(launch, "site_processes", no_sites)
    monkeypatch.setattr(launch, "watch_sites", lambda *args: 1)
    assert main(["run", "--no-elastic", "--sites", "local", "--run-dir", str(tmp_path / "r")]) == 1
    assert main(["run", "--sites", "local", "--run-dir", str(tmp_path / "r2")]) == 1
    saved = [yaml.safe_load((tmp_path / name / "config.yaml").read_text())["comm"]["elastic"]["enabled"]
             for name in ("r", "r2")]
    assert saved == [False, True]
    assert started == [False, True]


def test_a_node_the_launcher_waits_for_that_never_comes_up_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    import subprocess as sp

    from geodiloco.runtime import launch
    exited = sp.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()

    def first_node_fails(config, run_dir, *rest):
        launch.wait_for_file(tmp_path / "never", exited, 5.0, "the first node's hivemind peer")

    monkeypatch.setattr(launch, "launch_local", first_node_fails)
    code, _, err = run(capsys, "run", "--run-dir", str(tmp_path / "r"))
    assert code == 1
    assert err == ("geodiloco run: error: the first node's hivemind peer exited (code 3) before it was up; its error "
                   "is above\n")


def test_config_errors_name_their_field_once_and_fit_the_model_kind(tmp_path, capsys):
    import json as json_module
    dims = {"hidden_size": 256, "intermediate_size": 512, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
            "vocab_size": 256, "max_seq_len": 256}
    (tmp_path / "kv.json").write_text(json_module.dumps(dims))
    code, _, err = run(capsys, "run", "--set", f"model={{file: {tmp_path / 'kv.json'}, seq_len: 128}}",
                       "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "model.file: num_kv_heads 2: the built-in model trains full multi-head attention" in err
    code, _, err = run(capsys, "run", "--set", "model={preset: tiny, file: x.json}", "--run-dir", str(tmp_path / "r"))
    assert code == 2 and ": model: give exactly one of model.preset, model.file or model.hf" in err
    assert "model: model:" not in err  # the validator's own sentence names the field already
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("gpu, message", [
    ("A100-SXM4-40GB MIG 3g.40gb", "A100-SXM4-40GB has no MIG profile 3g.40gb; its profiles: 1g.5gb"),
    ("RTX 4090 MIG 1g.5gb", "RTX 4090 does not support MIG"),
    ("NVIDIA A10-48Q", "a 48Q vGPU needs 48 GB and A10 has 24 GB"),
    ("MI300A QPX", "MI300A has no QPX mode"),
])
def test_predict_refuses_a_slice_its_part_does_not_have_and_plans_an_unknown_gpu(capsys, gpu, message):
    code, out, err = run(capsys, "predict", "--gpu", gpu)
    assert code == 2 and out == "" and message in err  # not a stand-in's numbers under that name
    code, out, _ = run(capsys, "predict", "--gpu", "Tesla K80")
    assert code == 0 and "node: 1 x Tesla K80" in out  # an unknown GPU stays usable, planned like the stand-in
    _, stand_in, _ = run(capsys, "predict", "--gpu", "L4")
    assert step_time_line(out) == step_time_line(stand_in)


def step_time_line(predict_out: str) -> str:
    return next(line for line in predict_out.splitlines() if line.startswith("step time: "))


def test_version_names_the_package_torch_and_python_and_the_module_runs_as_the_command():
    import platform
    import subprocess
    import sys

    import geodiloco
    result = subprocess.run([sys.executable, "-m", "geodiloco", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(f"geodiloco {geodiloco.__version__} (torch ")
    assert result.stdout.strip().endswith(f"Python {platform.python_version()})")
    from importlib.metadata import version
    assert version("geodiloco") == geodiloco.__version__  # one version, read by the build from the package
