"""A node name started at two sites is refused: its ranks would be merged into one node trained with DDP
across the WAN, and the node the second site meant would never train."""
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.comm import settle_double_claims
from geodiloco.runtime.config_agreement import OtherSitesLeave

NODES = ["a", "b", "c"]
# ranks 0-1: site a's agent (group rank 0, two GPUs); rank 2: site b; rank 3: a second site calling itself a
DOUBLED = [["a", "0"], ["a", "0"], ["b", "1"], ["a", "2"]]


def elastic(monkeypatch, restarts: int) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", str(restarts))


def test_one_agent_per_node_passes_whatever_its_rank_count():
    for node_name in NODES:  # neither the node itself nor the others are stopped
        assert settle_double_claims([["a", "0"], ["a", "0"], ["b", "1"], ["c", "2"]], node_name, NODES) is None
        assert settle_double_claims([["a", "0"], ["b", "1"], ["b", "1"], ["b", "1"], ["c", "2"]], node_name,
                                    NODES) is None
    assert settle_double_claims([["a", None], ["b", None]], "a", NODES) is None  # no torchrun agent: nothing to compare


def test_both_claimants_stop_and_the_others_go_on_without_them_when_restarted(monkeypatch):
    elastic(monkeypatch, restarts=3)
    with pytest.raises(ConfigError, match=r"^node a was started by 2 sites \(torchrun agents 0, 2\): each site needs "
                                          r"its own --node-name from the config's nodes \(a, b, c\); this site stops"):
        settle_double_claims(DOUBLED, "a", NODES)
    with pytest.raises(OtherSitesLeave, match="those sites stop, and the run goes on without them"):
        settle_double_claims(DOUBLED, "b", NODES)


def test_without_restarts_every_site_stops(monkeypatch):
    elastic(monkeypatch, restarts=0)
    with pytest.raises(ConfigError, match=r"node a was started by 2 sites .*\(a, b, c\)$"):
        settle_double_claims(DOUBLED, "b", NODES)
