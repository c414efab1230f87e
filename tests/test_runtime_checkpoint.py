"""Checkpoint retention when several nodes share one run directory."""
from __future__ import annotations



def test_pruning_old_rounds_goes_on_when_another_node_deleted_a_folder_first(tmp_path, monkeypatch):
    """Nodes on one machine share the run directory and each prunes after its commit: a round folder listed by
    one may be gone when it reads it (a demo node crashed on exactly that, FileNotFoundError, and restarted)."""
    from geodiloco.runtime import checkpoint
    for round_idx in range(4):
        checkpoint.save_global(tmp_path, round_idx, {"outer": {"step": round_idx}})
        checkpoint.save_node(tmp_path, round_idx, "a", {"round": round_idx})
    import pathlib
    vanished = checkpoint.round_dir(tmp_path, 0)
    real_glob, real_iterdir = pathlib.Path.glob, pathlib.Path.iterdir

    def gone_while_listed(listing):
        def listing_of(self, *args):
            if self == vanished:  # another node deletes it between this node's listing and its reading
                raise FileNotFoundError(2, "No such file or directory", str(self))
            return listing(self, *args)
        return listing_of

    monkeypatch.setattr(pathlib.Path, "glob", gone_while_listed(real_glob))
    monkeypatch.setattr(pathlib.Path, "iterdir", gone_while_listed(real_iterdir))
    checkpoint.mark_latest(tmp_path, 3, keep=2)
    monkeypatch.undo()
    assert checkpoint.latest_round(tmp_path) == 3
    assert checkpoint._saved_rounds(tmp_path) == [2, 3]
