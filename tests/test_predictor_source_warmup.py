"""experiments/predictor/source_warmup.py: the published and steady step of one logged run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))
import source_warmup  # noqa: E402

PATH = "pytorch/results/A100_SXM4/PyTorch_bert_base_squad_FP16/04-11-2020_20-58-09.txt"


def tqdm_lines(step_s: dict[int, float], total: int = 139) -> str:
    """tqdm's carriage-return progress, one entry per finished iteration, as Lambda's logs hold it."""
    parts = []
    for n, seconds in step_s.items():
        rate = f"{1 / seconds:.2f}it/s" if seconds < 1 else f"{seconds:.2f}s/it"
        parts.append(f"Iteration:  {100 * n // total}%|#  | {n}/{total} [00:{n:02d}<00:10, {rate}]")
    return "\r".join(parts)


def test_the_published_step_is_the_batch_over_the_figure_and_the_steady_one_the_median_rate():
    steps = {1: 1.5, **{n: 0.25 for n in range(2, 102)}}
    steps[60] = 0.8  # a stall inside the steady window moves the median not at all
    text = (f"python run_squad.py --train_batch_size=40 --max_steps=100 --fp16\n{tqdm_lines(steps)}\n"
            "DLL 2020-11-04 - e2e_train_time : 27.1 training_sequences_per_second : 147.6 final_loss : 5.8\n")
    log = source_warmup.parse_log(PATH, text)
    assert log.batch_size == 40 and log.from_e2e
    assert log.published_step_s == pytest.approx(40 / 147.6)
    assert log.steady_step_s == pytest.approx(0.25)
    assert log.ratio == pytest.approx(40 / 147.6 / 0.25)


def test_a_2020_log_takes_lambdas_own_line_and_a_multi_gpu_or_unfinished_run_is_left_out():
    steps = {n: 0.5 for n in range(1, 41)}
    text = f"python run_squad.py --train_batch_size=52 --fp16\n{tqdm_lines(steps)}\n training throughput: 100.0\nDONE!\n"
    log = source_warmup.parse_log(PATH.replace("A100_SXM4", "TitanRTX"), text)
    assert not log.from_e2e and log.published_step_s == pytest.approx(0.52) and log.steady_step_s == pytest.approx(0.5)
    assert source_warmup.parse_log(PATH, text.replace("python run_squad.py", "torchrun --nproc_per_node=2 run_squad.py")) is None
    assert source_warmup.parse_log(PATH, text.replace(" training throughput: 100.0", "")) is None
    assert source_warmup.parse_log("pytorch/results/A100_SXM4/PyTorch_resnet50_AMP/x.txt", text) is None


def test_without_a_clone_it_says_what_to_clone_and_exits_2(tmp_path, capsys):
    assert source_warmup.main(["--lambda-repo", str(tmp_path), "--out", str(tmp_path / "out.md")]) == 2
    assert "git clone https://github.com/lambdal/deeplearning-benchmark" in capsys.readouterr().err
    assert not (tmp_path / "out.md").exists()
