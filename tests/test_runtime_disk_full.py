"""A full disk stops a run in a few lines: no restart loop (a restart meets the same disk), the path, the space left,
the checkpoint kept and the command that continues, and a node log that cannot be written does not kill the
launcher's output forwarding."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from geodiloco.runtime.checkpoint_writer import CheckpointWriteError
from geodiloco.runtime.launcher_watch import LAUNCHER_PID_ENV
from geodiloco.runtime.train import storage_failure, storage_message
from tests.runtime_helpers import REPO_ROOT, small_config, write_config


def test_disk_errors_stop_the_site_and_other_errors_do_not(tmp_path, monkeypatch):
    write_failed = CheckpointWriteError("writing the checkpoint of round 3 of node a failed: SafetensorError: I/O error")
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "idle.jsonl"))
    assert storage_failure(write_failed) and storage_failure(full)
    assert not storage_failure(OSError(errno.ECONNRESET, "Connection reset by peer"))
    assert not storage_failure(RuntimeError("Connection closed by peer"))
    monkeypatch.setenv(LAUNCHER_PID_ENV, "1")
    message = storage_message(full, tmp_path)
    assert message.startswith(f"stopping this site: writing {tmp_path / 'idle.jsonl'}: No space left on device (")
    assert message.endswith("MiB free there now); no round was saved, so there is nothing to resume: free space or "
                            "fix the path, then start the run again")
    from geodiloco.runtime import checkpoint
    checkpoint.save_global(tmp_path, 3, {"outer": {"step": 4}})
    checkpoint.mark_latest(tmp_path, 3, keep=2)
    assert storage_message(full, tmp_path).endswith(
        f"MiB free there now); the last complete checkpoint (after round 4) stays in {tmp_path}; free space or fix "
        f"the path, then to continue: geodiloco run --resume --run-dir {tmp_path}")
    monkeypatch.delenv(LAUNCHER_PID_ENV)
    assert storage_message(write_failed, tmp_path).endswith(
        "the path, then to continue, start every site with its command plus --resume (under torchrun with a new --run-id: a "
        "rendezvous that closed is not joined again)")


def test_a_node_log_that_cannot_be_written_is_said_once_and_the_output_still_comes(tmp_path, capfd):
    from geodiloco.runtime.node_output import NodeOutput
    process = subprocess.Popen([sys.executable, "-c", "print('one'); print('two')"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    output = NodeOutput(process, Path("/dev/full"))  # every write there fails with ENOSPC, as on a full disk
    process.wait()
    assert output.tail() == ["one", "two"]
    captured = capfd.readouterr()
    assert captured.out == "one\ntwo\n"
    assert captured.err.count("this node's log stops here (its output still comes here)") == 1


def can_mount_tmpfs(target: Path) -> bool:
    if os.geteuid() != 0:
        return False
    target.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6M", "tmpfs", str(target)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_run_on_a_full_disk_stops_in_a_few_lines_without_restarting_its_sites(tmp_path):
    small = tmp_path / "small"
    if not can_mount_tmpfs(small):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        nodes = [{"name": name, "emulate": {"step_time_s": 0.01}} for name in "ab"]
        config = small_config(nodes, comm={"timeout_s": 60, "elastic": {"enabled": True}})
        config["diloco"]["rounds"] = 30
        config["model"]["seq_len"] = 32
        run_dir = small / "run"
        done = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--no-report", "--sites", "local",
                               "--config", str(write_config(tmp_path, config)), "--run-dir", str(run_dir)],
                              capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 2, output[-3000:]
        assert "No space left on device" in output and "Traceback" not in output
        assert "no round was saved, so there is nothing to resume: free space or fix the path, then start the run " \
               "again" in output  # a 6 MiB disk holds no round of the two nodes
        assert "resuming" not in output  # no agent restarted a worker into the same full disk
        assert "[geodiloco] stopped every site: a restart would meet the same error" in output
        assert "was not restarted" not in output  # each site's agent leaves that to the launcher's one line
        assert len(output.strip().splitlines()) <= 8, output
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_a_write_that_fails_leaves_no_temp_file_and_the_old_file_as_it_was(tmp_path, monkeypatch):
    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.runlog import RunLog
    target = tmp_path / "latest"
    target.write_text("2\n")

    def disk_full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_fsync_path", disk_full)
    with pytest.raises(OSError):
        checkpoint.write_text_durably(target, "3\n")
    with pytest.raises(OSError):
        checkpoint.save_global(tmp_path, 0, {"outer": {"step": 1}})
    monkeypatch.undo()
    log = RunLog(tmp_path)
    log.append("idle.jsonl", [{"round": 0, "node": "a"}, {"round": 1, "node": "a"}])
    monkeypatch.setattr("os.replace", disk_full)
    with pytest.raises(OSError):
        log.drop_rounds_from("idle.jsonl", 1)
    monkeypatch.undo()
    assert sorted(path.name for path in tmp_path.rglob("*") if ".tmp" in path.name) == []
    assert target.read_text() == "2\n" and len((tmp_path / "idle.jsonl").read_text().splitlines()) == 2


def test_the_launchers_fatal_error_file_is_away_from_the_run_directory_and_an_unwritten_one_still_stops(
        tmp_path, monkeypatch):
    """On a full disk a worker's one line could not be written into the run directory, and the launcher would not
    stop the sites: the file lies in a private temp folder, and one its writer created but could not fill (that disk
    full too) reads as a stop once it is a few seconds old."""
    import stat
    import time

    from geodiloco.runtime import fatal
    path = fatal.private_fatal_file()
    try:
        assert path.parent.parent == Path(tempfile.gettempdir())
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and not path.exists()
        fatal.record_fatal("node a: stopping this site: writing x: No space left on device",
                           {fatal.FATAL_FILE_ENV: str(path)})
        assert fatal.read_fatal(path) == "node a: stopping this site: writing x: No space left on device"
    finally:
        fatal.remove_fatal_file(path)
    assert not path.parent.exists()
    empty = tmp_path / "fatal_error.txt"
    empty.touch()
    assert fatal.read_fatal(empty) is None  # its writer may be between creating and writing it
    old_s = time.time() - 10
    os.utime(empty, (old_s, old_s))
    assert fatal.read_fatal(empty) == fatal.UNWRITTEN_MESSAGE
    assert fatal.read_fatal(tmp_path / "none.txt") is None
