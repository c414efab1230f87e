"""Fakes at the driver boundary (torch.cuda device properties) shared by the detection tests."""
import sys
import types


def install_fake_torch_cuda(monkeypatch, name: str, total_memory: int, compute_units: int, count: int = 1,
                            hip: str = "6.2", arch: str = "") -> None:
    """Make ``import torch`` give a torch whose CUDA (ROCm when ``hip``) lists ``count`` such devices; ``arch`` is
    the ``gcnArchName`` ROCm builds report ("gfx1100"), and ``compute_units`` what torch reports as
    ``multi_processor_count``."""
    props = types.SimpleNamespace(name=name, total_memory=total_memory, multi_processor_count=compute_units,
                                  gcnArchName=arch)
    fake_cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: count,
                                      get_device_properties=lambda index: props)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=fake_cuda,
                                                                    version=types.SimpleNamespace(hip=hip)))
