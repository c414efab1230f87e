"""Checkpoint files: safetensors tensors + JSON structure + SHA-256, loaded without pickle."""
from __future__ import annotations

import math

import pytest
import torch

from geodiloco.runtime.state_file import CorruptStateFile, load_state, save_state


def trained_optimizer_state() -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 6)).pow(2).sum().backward()
    optimizer.step()
    return model, optimizer.state_dict()


def test_round_trip_keeps_types_keys_and_values(tmp_path):
    model, optimizer_state = trained_optimizer_state()
    state = {"round": 3, "optimizer": optimizer_state, "rng": torch.get_rng_state(),
             "mixed": [1.5, float("inf"), (2, "x"), None, True], "half": torch.arange(4, dtype=torch.bfloat16),
             "empty": torch.zeros(0)}
    path = tmp_path / "state.safetensors"
    save_state(state, path)
    loaded = load_state(path)
    assert loaded["round"] == 3
    assert list(loaded["optimizer"]["state"]) == [0, 1]  # int keys survive JSON
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert loaded["mixed"][0] == 1.5 and math.isinf(loaded["mixed"][1]) and loaded["mixed"][2] == (2, "x")
    assert loaded["mixed"][3] is None and loaded["mixed"][4] is True
    assert loaded["half"].dtype == torch.bfloat16 and loaded["half"].tolist() == [0, 1, 2, 3]
    assert torch.equal(loaded["rng"], state["rng"]) and loaded["empty"].numel() == 0
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fresh.load_state_dict(loaded["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer_state["state"][0]["exp_avg"])


@pytest.mark.parametrize("damage", ["flip_tensor_byte", "truncate", "random_bytes", "empty"])
def test_damaged_files_are_refused(tmp_path, damage):
    path = tmp_path / "state.safetensors"
    save_state({"weights": torch.randn(64, 64), "step": 7}, path)
    data = bytearray(path.read_bytes())
    if damage == "flip_tensor_byte":
        data[-10] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "random_bytes":
        data[200:4296] = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1)).to(torch.uint8).numpy().tobytes()
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateFile, match=str(path)):
        load_state(path)


def test_a_pickle_file_is_not_loaded(tmp_path):
    """A torch.save file (pickle, can run code on load) is refused, never unpickled."""
    path = tmp_path / "global.safetensors"
    torch.save({"weights": torch.ones(2)}, path)
    with pytest.raises(CorruptStateFile, match="not a readable safetensors file"):
        load_state(path)


def test_a_foreign_safetensors_file_is_refused(tmp_path):
    from safetensors.torch import save_file
    path = tmp_path / "other.safetensors"
    save_file({"weight": torch.ones(3)}, str(path))
    with pytest.raises(CorruptStateFile, match="not a GeoDiLoCo state file"):
        load_state(path)


@pytest.mark.parametrize("structure", ['{"__tuple__": 5}', '{"__items__": [[[1], 2]]}', "[" * 100_000 + "]" * 100_000])
def test_a_file_whose_hash_matches_but_whose_structure_is_malformed_is_refused(tmp_path, structure):
    # hashed anew after the edit: the check that remains is the decoding, which must refuse rather than crash
    from safetensors.torch import save_file
    from geodiloco.runtime.checkpoint import usable_file
    from geodiloco.runtime.state_file import FORMAT, content_hash, from_bytes
    path = tmp_path / "edited.safetensors"
    tensors = {"t0": torch.zeros(2)}
    save_file(tensors, str(path), metadata={"format": FORMAT, "structure": structure,
                                            "sha256": content_hash(structure, tensors)})
    with pytest.raises(CorruptStateFile, match="malformed structure"):
        load_state(path)
    assert usable_file(path) is False  # an older round is used instead
    wire = len(structure).to_bytes(8, "little") + structure.encode()
    from safetensors.torch import save
    with pytest.raises(CorruptStateFile, match="malformed state from a peer"):
        from_bytes(wire + save(tensors))
