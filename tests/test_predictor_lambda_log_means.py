"""experiments/predictor/lambda_log_means.py: the run means behind Lambda's truncated figures."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))
import lambda_log_means  # noqa: E402

COMPILE_SCRIPT = '''
import re
list_system_single = {
    "A40": ([1, 1], "RTX A40", 300, 6464),
    "V100": ([0, 1], "V100 32GB", 250, 11357),
}
list_system_multiple = {"2xA40": ([1, 2], "2x RTX A40", 300, 6464)}
list_test_fp32 = [
    {"PyTorch_bert_base_squad_FP32": ("bert_base_squad", "^.*training throughput:.*$", -1)},
    {"PyTorch_bert_base_squad_FP32": ("bert_base_squad", "^.*training_sequences_per_second :.*$", -6),
     "PyTorch_transformerxlbase_FP32": ("transformerxlbase", "^.*Training throughput:.*$", -2)},
]
def main():
    pass
'''


def e2e_line(figure: float) -> str:
    """run_squad.py's closing line as Lambda's logs hold it, trailing space included (the field index counts it)."""
    return (f"DLL 2021-06-26 16:29:11.842716 -  e2e_train_time : 89.3  training_sequences_per_second : {figure}  "
            "final_loss : 5.9 \n")


def lambda_clone(root: Path, logs: dict[str, str]) -> str:
    """A git repository laid out as Lambda's, with the compile script above and ``logs`` (path -> text)."""
    (root / "pytorch" / "scripts").mkdir(parents=True)
    (root / "pytorch" / "scripts" / "compile_results_pytorch.py").write_text(COMPILE_SCRIPT)
    for path, text in logs.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    run = lambda *args: subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "logs")
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def a40_row(commit: str, monkeypatch) -> dict:
    """A Lambda row citing the RTX A40's BERT-base SQuAD cell at ``commit``, whose compile script is the one above."""
    monkeypatch.setitem(lambda_log_means.COMPILE_SCRIPTS, (commit, False),
                        ("pytorch/scripts/compile_results_pytorch.py", "pytorch/results"))
    return {"id": "lambda-v0-bertbasesquad-rtx-a40-fp32-s384-b56", "value": 62.0, "batch_size": 56, "seq_len": 384,
            "source": "Lambda deeplearning-benchmark, pytorch/pytorch-train-throughput-fp32.csv column bert_base_squad, "
                      f"row 'RTX A40' (num_gpu 1); https://github.com/lambdal/deeplearning-benchmark/blob/{commit}/x.csv"}


def test_a_cell_is_the_mean_of_each_logs_last_figure_and_logs_without_one_are_left_out(tmp_path, monkeypatch):
    folder = "pytorch/results/A40/PyTorch_bert_base_squad_FP32"
    commit = lambda_clone(tmp_path, {
        f"{folder}/a.txt": e2e_line(60.0) + "noise\n" + e2e_line(62.5),  # the last figure counts: 62.5
        f"{folder}/b.txt": e2e_line(63.1),
        f"{folder}/c.txt": "the run crashed before printing a figure\n",
        f"{folder}/d_monitor.csv": e2e_line(999.0),  # not a .txt log
        "pytorch/results/2xA40/PyTorch_bert_base_squad_FP32/a.txt": e2e_line(120.0),  # another system
    })
    row = a40_row(commit, monkeypatch)
    mean = lambda_log_means.row_log_mean(tmp_path, row, {})
    assert mean.log_files == 2 and mean.mean == pytest.approx((62.5 + 63.1) / 2)
    assert mean.agrees  # int(round(62.8, 2)) == 62
    assert not lambda_log_means.LogMean(row["id"], 61.0, mean.mean, 2).agrees
    assert not lambda_log_means.LogMean(row["id"], 0.0, 0.0, 0).agrees
    elsewhere = dict(row, source=row["source"].replace(commit, "0" * 40))
    with pytest.raises(LookupError, match="no compile script is known for commit 00000000; add it to COMPILE_SCRIPTS"):
        lambda_log_means.row_log_mean(tmp_path, elsewhere, {})
    unnamed = dict(row, source=row["source"].replace("'RTX A40'", "'RTX A4000'"))
    with pytest.raises(LookupError, match="lambda-v0-bertbasesquad-rtx-a40-fp32-s384-b56: row 'RTX A4000' names 0"):
        lambda_log_means.row_log_mean(tmp_path, unnamed, {})


def test_the_compile_scripts_tables_choose_the_folder_pattern_and_field_of_the_rows_container_version():
    tables = lambda_log_means.script_tables(COMPILE_SCRIPT)
    version_1 = lambda_log_means.recipe(tables, "pytorch/results", "RTX A40", "fp32", "transformerxlbase", v2=False)
    assert version_1 == lambda_log_means.LogRecipe("pytorch/results/A40/PyTorch_transformerxlbase_FP32",
                                                   "^.*Training throughput:.*$", -2)
    version_0 = lambda_log_means.recipe(tables, "pytorch/results", "V100 32GB", "fp32", "bert_base_squad", v2=False)
    assert (version_0.log_dir, version_0.field) == ("pytorch/results/V100/PyTorch_bert_base_squad_FP32", -1)
    assert lambda_log_means.last_figure(" training throughput: 35.2\n training throughput: 35\n", version_0) == 35.0
    assert lambda_log_means.last_figure("Training throughput: 2772.99 tok/s\n", version_1) == 2772.99
    with pytest.raises(LookupError, match="'RTX A4000' names 0 systems"):
        lambda_log_means.recipe(tables, "pytorch/results", "RTX A4000", "fp32", "bert_base_squad", v2=False)
    with pytest.raises(LookupError, match="'ssd' names 0 tests"):
        lambda_log_means.recipe(tables, "pytorch/results", "RTX A40", "fp32", "ssd", v2=False)


def test_writing_sets_the_mean_after_the_truncation_line_once_and_keeps_the_rest_of_the_file():
    text = ("# header comment\nmeasurements:\n- id: lambda-a\n  value: 62.0\n  value_truncated_to: 1\n  unit: x\n"
            "- id: dle-b\n  value: 5.0\n  unit: x\n")
    means = {"lambda-a": lambda_log_means.LogMean("lambda-a", 62.0, 62.712581, 3)}
    written = lambda_log_means.with_log_means(text, means)
    assert written.startswith("# header comment\n")
    assert yaml.safe_load(written)["measurements"] == [
        {"id": "lambda-a", "value": 62.0, "value_truncated_to": 1, "value_from_logs": 62.713, "log_files": 3,
         "unit": "x"},
        {"id": "dle-b", "value": 5.0, "unit": "x"}]
    assert lambda_log_means.with_log_means(written, means) == written


def test_without_a_clone_it_says_what_to_clone_and_exits_2(tmp_path, capsys):
    assert lambda_log_means.main(["--lambda-repo", str(tmp_path)]) == 2
    assert "git clone https://github.com/lambdal/deeplearning-benchmark" in capsys.readouterr().err


def test_a_row_whose_logs_ran_another_batch_is_named_with_what_they_ran(tmp_path, monkeypatch, capsys):
    folder = "pytorch/results/A40/PyTorch_bert_base_squad_FP32"
    command = "python run_squad.py --do_train --train_batch_size={batch}  --max_seq_length=384  --max_steps=100\n"
    commit = lambda_clone(tmp_path, {f"{folder}/a.txt": command.format(batch=56) + e2e_line(62.5),
                                     f"{folder}/b.txt": command.format(batch=48) + e2e_line(62.9),
                                     f"{folder}/c.txt": e2e_line(62.1)})  # prints no command line: not counted
    row = a40_row(commit, monkeypatch)
    mean = lambda_log_means.row_log_mean(tmp_path, row, {})
    assert mean.agrees and mean.shape == (56, 384) and sorted(mean.logged_shapes) == [(48, 384), (56, 384)]
    assert not mean.shape_agrees
    assert not lambda_log_means.shapes_agree([mean])
    out = capsys.readouterr()
    assert "1 rows have logs that name their batch size and sequence length; 0 ran the row's" in out.out
    assert "lambda-v0-bertbasesquad-rtx-a40-fp32-s384-b56: the row says batch 56 at 384; its logs ran batch 48 at " \
           "384, batch 56 at 384" in out.out
    assert "fix those rows' batch_size or seq_len" in out.err
    assert lambda_log_means.shapes_agree([dataclasses.replace(mean, logged_shapes=((56, 384),))])


def test_transformer_xls_namespace_gives_its_training_batch_and_target_length_not_the_evaluation_ones():
    namespace = ("Namespace(adaptive=False, batch_chunk=1, batch_size=48, clamp_len=-1, eval_batch_size=16, "
                 "eval_tgt_len=128, mem_len=256, tgt_len=256, vocab='word')\n")
    assert lambda_log_means.logged_shape(namespace) == (48, 256)
    assert lambda_log_means.logged_shape("Namespace(eval_batch_size=16, eval_tgt_len=128)\n") is None
