"""What `geodiloco run` tells a user at start: on a machine with GPUs, that its sites train on the CPU."""
import sys

from geodiloco.predictor import detect
from geodiloco.runtime.launch import announce_cpu_training, machine_gpu_count

NO_DRIVER = ([], "NVML not available")


def test_on_a_gpu_machine_the_launcher_says_its_sites_train_on_the_cpu_and_how_to_use_the_gpus(monkeypatch, capsys):
    monkeypatch.setattr(detect, "nvml_gpus", lambda: ([{"name": "NVIDIA A30"}, {"name": "NVIDIA A30"}], "NVML"))
    announce_cpu_training()
    out = capsys.readouterr().out
    assert "this machine has 2 GPU(s), but the sites `geodiloco run` starts train on the CPU" in out
    assert "scripts/launch_site.sh" in out


def test_amd_gpus_are_counted_through_rocm_smi(monkeypatch):
    monkeypatch.setattr(detect, "nvml_gpus", lambda: NO_DRIVER)
    monkeypatch.setattr(detect, "rocm_smi_gpus", lambda: ([{"name": "AMD Instinct MI300X"}] * 8, "rocm-smi"))
    assert machine_gpu_count() == 8


def test_on_a_machine_without_gpus_it_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(detect, "nvml_gpus", lambda: NO_DRIVER)
    monkeypatch.setattr(detect, "rocm_smi_gpus", lambda: ([], "rocm-smi not found"))
    announce_cpu_training()
    assert capsys.readouterr().out == ""


def test_counting_gpus_does_not_import_torch():
    import subprocess
    code = "import sys; from geodiloco.runtime.launch import machine_gpu_count; machine_gpu_count(); " \
           "print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_loopback_sites_say_the_wan_links_are_not_emulated(capsys):
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.launch import announce_unshaped_links
    shaped = load_config(None)  # the demo's nodes each have a wan: link
    announce_unshaped_links(shaped, "local")
    assert capsys.readouterr().out == (
        "[geodiloco] the nodes' wan: links are not emulated on loopback (--sites local): the outer sync runs at this "
        "machine's speed; --sites netns (root) shapes them\n")
    announce_unshaped_links(shaped, "netns")
    announce_unshaped_links(load_config(None, ["nodes=[{name: a}, {name: b}]"]), "local")
    assert capsys.readouterr().out == ""
