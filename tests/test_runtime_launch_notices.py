"""What `geodiloco run` tells a user at start: on a machine with GPUs, that its sites train on the CPU."""
import torch

from geodiloco.runtime.launch import announce_cpu_training


def test_on_a_gpu_machine_the_launcher_says_its_sites_train_on_the_cpu_and_how_to_use_the_gpus(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    announce_cpu_training()
    out = capsys.readouterr().out
    assert "this machine has 2 GPU(s), but the sites `geodiloco run` starts train on the CPU" in out
    assert "scripts/launch_site.sh" in out


def test_on_a_machine_without_gpus_it_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    announce_cpu_training()
    assert capsys.readouterr().out == ""
