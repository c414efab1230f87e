"""A 2-site run across two network namespaces linked by tbf-shaped veths."""
import pytest

from geodiloco.lab import sites
from tests.runtime_helpers import read_jsonl, small_config, start_run, write_config

pytestmark = [pytest.mark.slow, pytest.mark.netns]

USABLE, REASON = sites.can_use_netns()


@pytest.mark.skipif(not USABLE, reason=f"network namespaces unavailable: {REASON}")
def test_two_sites_in_namespaces_with_a_shaped_link(tmp_path):
    nodes = [{"name": "east", "site": "east", "emulate": {"step_time_s": 0.05}, "wan": {"bandwidth_mbps": 20}},
             {"name": "west", "site": "west", "emulate": {"step_time_s": 0.05}, "wan": {"bandwidth_mbps": 20}}]
    config = small_config(nodes)
    run_dir = tmp_path / "run"
    launcher = start_run(write_config(tmp_path, config), run_dir, "--sites", "netns")
    stdout, stderr = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, stderr[-3000:]
    assert "sites: netns" in stdout
    records = read_jsonl(run_dir / "idle.jsonl")
    assert len(records) == 4
    # tiny model: 467,584 fp32 parameters = 1.87 MB; a 2-node ring all-reduce moves 2 * 1/2 of it each way,
    # so at 20 Mbit/s the outer sync cannot take less than 1.87e6 * 8 / 20e6 = 0.75 s.
    minimum_sync_s = 467_584 * 4 * 8 / 20e6
    for record in records:
        assert record["comm_s"] >= 0.9 * minimum_sync_s, record
    left_behind = [name for name in sites.list_namespaces()
                   if (sites.namespace_owner(name, sites.DEFAULT_PREFIX) or "").split("x")[0] == str(launcher.pid)]
    assert left_behind == []
