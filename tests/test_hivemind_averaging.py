"""hivemind outer sync in one process: three peers on loopback, driven from threads.

Checks the readiness barrier and the weighted pseudo-gradient sum (the numbers are worked
out by hand below), compression, and that no p2pd process outlives the peers.
"""
import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import HivemindSection
from geodiloco.runtime.diloco import outer_weights
from geodiloco.runtime.sync.hivemind_backend import (MISSING_SHARE_KEY, HivemindOuterSync, OutOfSync, make_averager_class,
                                   incomplete_share, peer_start_failure, round_group_bits, wire_codec)

pytestmark = pytest.mark.slow

NAMES = ["a", "b", "c"]
NUMEL = 1000


def peer_options(initial_peers, **options):
    return HivemindSection(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                           heartbeat_ttl_s=3.0, round_timeout_s=30.0, start_wait_s=5.0, **options)


def topology(index):
    return Topology(rank=0, world_size=1, node_name=NAMES[index], node_index=index, local_rank=0,
                    local_world_size=1, node_ranks=[0], leader_ranks=[0, 1, 2])


def live_processes():
    """{pid: (name, parent pid)} of every live process, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name_end = stat.rindex(")")
        found[int(entry.name)] = (stat[stat.index("(") + 1:name_end], int(stat[name_end + 2:].split()[1]))
    return found


def p2pd_pids(below_this_process=False):
    """Live p2pd processes; with ``below_this_process`` only those this test started (another
    pytest worker may be running peers of its own)."""
    processes = live_processes()
    candidates = set(processes)
    if below_this_process:
        candidates, frontier = set(), {os.getpid()}
        while frontier:
            frontier = {pid for pid, (_, parent) in processes.items() if parent in frontier} - candidates
            candidates |= frontier
    return {pid for pid in candidates if processes[pid][0] == "p2pd"}


def bootstrapping_from(maddr):
    """Live p2pd processes anywhere on the machine started with ``maddr`` among their bootstrap peers."""
    found = set()
    for pid in p2pd_pids():
        with contextlib.suppress(OSError):
            if maddr.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    return found


@contextlib.contextmanager
def three_peers(run_name, **options):
    before = p2pd_pids(below_this_process=True)
    first = HivemindOuterSync(topology(0), peer_options([], **options), run_name, NAMES, NUMEL, "none")
    syncs = [first] + [HivemindOuterSync(topology(index), peer_options(first.maddrs, **options), run_name, NAMES,
                                         NUMEL, "none") for index in (1, 2)]
    started = p2pd_pids(below_this_process=True) - before
    try:
        yield syncs
    finally:
        for sync in syncs:
            sync.close()
    assert len(started) == 3
    assert not (p2pd_pids() & started), "p2pd processes outlived the peers"


@pytest.fixture(scope="module")
def peers():
    # every sum below needs all three in each round's group: on a loaded machine (the full suite on two cores) a
    # peer of this one process may reach the all-reduce past the default 2 s matchmaking window
    with three_peers("unit", matchmaking_time_s=6.0, request_timeout_s=2.0) as syncs:
        yield syncs


def run_round(syncs, round_idx, contributions, weights):
    """Every peer: readiness exchange then reduce_weighted, in parallel threads."""
    results, errors = {}, []

    def node(index):
        try:
            sync = syncs[index]
            sync.set_round(round_idx, joined=0)
            gathered = sync.exchange({"node": NAMES[index], "round": round_idx, "local_rank": 0, "tokens": index})
            total = sum(weights[item["node"]] for item in gathered)
            results[NAMES[index]] = ([item["node"] for item in gathered],
                                     sync.reduce_weighted(contributions[index].clone(), weights[NAMES[index]],
                                                          total_weight=total))
        except Exception as err:  # surfaced by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=node, args=(index,)) for index in range(len(syncs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_weighted_sum_over_three_peers(peers):
    contributions = [torch.full((NUMEL,), 1.0), torch.full((NUMEL,), 2.0), torch.linspace(-1.0, 1.0, NUMEL)]
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    results = run_round(peers, 0, contributions, weights)
    expected = 0.5 * contributions[0] + 0.3 * contributions[1] + 0.2 * contributions[2]
    for name, (present, summed) in results.items():
        assert sorted(present) == NAMES, name
        torch.testing.assert_close(summed, expected, rtol=0, atol=1e-6)


def test_weights_that_do_not_sum_to_one_keep_their_total(peers):
    # normalized (FedNova) weights sum to more than one: the result is sum w_i x_i, not the mean
    contributions = [torch.full((NUMEL,), 3.0), torch.full((NUMEL,), -1.0), torch.full((NUMEL,), 0.5)]
    weights = {"a": 0.9, "b": 0.4, "c": 0.1}
    results = run_round(peers, 1, contributions, weights)
    expected_value = 0.9 * 3.0 + 0.4 * -1.0 + 0.1 * 0.5
    for _, summed in results.values():
        torch.testing.assert_close(summed, torch.full((NUMEL,), expected_value), rtol=0, atol=1e-5)


def round_stats(index, round_idx):
    steps, batches = [6, 2, 3], [4, 8, 2]
    return {"node": NAMES[index], "round": round_idx, "local_rank": 0, "tokens": steps[index] * batches[index] * 16,
            "steps": steps[index], "batch_size": batches[index], "previous_record": {"round": round_idx - 1}}


def average_rounds(syncs, round_idx, contributions, mode, stale_views=None):
    """Every peer: readiness exchange then average_round; ``stale_views`` overrides what a peer
    believes is present, as a read of the DHT that missed a node would. Returns per node
    (summed, group stats) or the OutOfSync it raised."""
    outcomes = {}

    def node(index):
        sync, stats = syncs[index], round_stats(index, round_idx)
        sync.set_round(round_idx, joined=0)
        sync.exchange(stats)
        if stale_views and NAMES[index] in stale_views:
            sync._present = stale_views[NAMES[index]]
        try:
            outcomes[NAMES[index]] = sync.average_round(contributions[index].clone(), mode, stats)
        except OutOfSync as err:
            outcomes[NAMES[index]] = err

    threads = [threading.Thread(target=node, args=(index,)) for index in range(len(syncs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert set(outcomes) == set(NAMES), outcomes
    return outcomes


def complete_round(syncs, round_idx, contributions, mode, attempts=3):
    """``average_rounds`` until no node's average came back incomplete (a hivemind hiccup the
    runtime recovers from; these tests check the arithmetic), each try in a fresh round."""
    for attempt in range(attempts):
        outcomes = average_rounds(syncs, round_idx + 100 * attempt, contributions, mode)
        if all(isinstance(outcome, OutOfSync) or outcome[0] is not None for outcome in outcomes.values()):
            return outcomes
    raise AssertionError(f"{attempts} rounds in a row came back incomplete: {outcomes}")


def expected_sum(mode, group_names, contributions):
    indices = [NAMES.index(name) for name in group_names]
    stats = [round_stats(index, 0) for index in indices]
    weights = outer_weights(mode, [item["tokens"] for item in stats], [item["steps"] for item in stats],
                            [item["batch_size"] for item in stats])
    return sum(weight * contributions[index] for weight, index in zip(weights, indices))


CONTRIBUTIONS = [torch.full((NUMEL,), 1.5), torch.linspace(-2.0, 2.0, NUMEL), torch.full((NUMEL,), -0.5)]


@pytest.mark.parametrize("round_idx, mode", [(4, "normalized"), (5, "tokens")])
def test_average_round_applies_the_weighting_over_the_group(peers, round_idx, mode):
    outcomes = complete_round(peers, round_idx, CONTRIBUTIONS, mode)
    expected = expected_sum(mode, NAMES, CONTRIBUTIONS)
    for name, (summed, group) in outcomes.items():
        assert [item["node"] for item in group] == NAMES
        own = next(item for item in group if item["node"] == name)
        assert own["previous_record"]["round"] % 100 == round_idx - 1  # this node's own stats, untouched
        assert all("previous_record" not in item for item in group if item["node"] != name)
        torch.testing.assert_close(summed, expected, rtol=0, atol=1e-5)


def test_views_that_disagree_on_who_is_present_still_average_consistently():
    # node a missed c's readiness post, b and c did not: whichever group hivemind forms, every node
    # in it holds the exact weighted sum over that group and the same member list; a node left
    # out raises OutOfSync instead of keeping an average nobody else has
    with three_peers("stale", matchmaking_timeout_s=5.0) as syncs:
        outcomes = average_rounds(syncs, 0, CONTRIBUTIONS, "normalized", stale_views={"a": ["a", "b"]})
    groups = {name: [item["node"] for item in outcome[1]] for name, outcome in outcomes.items()
              if not isinstance(outcome, OutOfSync)}
    assert any(len(group) >= 2 for group in groups.values()), outcomes
    for name, group in groups.items():
        assert name in group
        for member in group:
            assert groups.get(member) == group, outcomes
        if outcomes[name][0] is not None:  # None: part of the average never came back, said so
            torch.testing.assert_close(outcomes[name][0], expected_sum("normalized", group, CONTRIBUTIONS),
                                       rtol=0, atol=1e-5)
    left_out = [name for name, outcome in outcomes.items() if isinstance(outcome, OutOfSync)]
    assert sorted(left_out + list(groups)) == NAMES


@pytest.mark.parametrize("failed_peer, missing_share", [(None, None), (1, 0.5)])
def test_an_all_reduce_missing_part_of_its_results_is_reported(monkeypatch, failed_peer, missing_share):
    # hivemind keeps a node's own values where a reducer's results never came and only logs it;
    # the averager hands the missing share back with the gathered data (hivemind's own part container)
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.partition import TensorPartContainer

    parts = TensorPartContainer([torch.ones(100)], [0.5, 0.5], part_size_bytes=40)
    if failed_peer is not None:
        parts.register_failed_reducer(failed_peer)

    async def hivemind_aggregate(self, group_info, min_vector_size, **kwargs):
        return {"peer-b": {"node": "b"}}

    async def aggregate():
        monkeypatch.setattr(DecentralizedAverager, "_aggregate_with_group", hivemind_aggregate)
        class Unstarted(make_averager_class()):
            def __del__(self):  # nothing was started: no process or pipes to shut down
                pass

        averager = object.__new__(Unstarted)
        averager._members_key = None  # no secret: any peer
        runner = asyncio.get_running_loop().create_future()
        runner.set_result(SimpleNamespace(tensor_part_container=parts))
        averager._running_groups = {b"group": runner}
        return await averager._aggregate_with_group(SimpleNamespace(group_id=b"group"), 0)

    gathered = asyncio.run(aggregate())
    assert gathered["peer-b"] == {"node": "b"}
    assert gathered.get(MISSING_SHARE_KEY) == missing_share


def test_a_peer_ahead_means_this_one_is_out_of_sync(peers):
    peers[1].set_round(5, joined=0)
    peers[0].set_round(3, joined=0)
    with pytest.raises(OutOfSync, match="finished round 4 without node a"):
        peers[0].exchange({"node": "a", "round": 3, "local_rank": 0})


def test_rounds_average_in_separate_groups():
    assert round_group_bits(3) != round_group_bits(4)
    assert len(round_group_bits(7)) == len(round_group_bits(1023))


def test_codec_follows_diloco_compression_unless_set():
    assert wire_codec(HivemindSection(), "fp16") == "fp16"
    assert wire_codec(HivemindSection(), "bf16") == "none"
    assert wire_codec(HivemindSection(), "int8") == "8bit"
    assert wire_codec(HivemindSection(compression="8bit"), "fp16") == "8bit"


@pytest.mark.parametrize("name, max_error", [("none", 0.0), ("fp16", 1e-3), ("8bit", 0.02)])
def test_codecs_round_trip_within_their_rounding(name, max_error):
    from hivemind.compression import CompressionInfo
    from hivemind.compression.serialization import deserialize_torch_tensor

    from geodiloco.runtime.sync.hivemind_backend import codec
    spread = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    for original in (spread, torch.zeros(100), torch.full((7,), 0.25)):
        wire = codec(name).compress(original, CompressionInfo.from_tensor(original))
        restored = deserialize_torch_tensor(wire)
        assert float((restored - original).abs().mean()) <= max_error


def averager_of_members(*members: str):
    """The run's averager, not started (no DHT), whose member records name ``members``."""
    class Unstarted(make_averager_class()):
        def __del__(self):
            pass

        async def _members(self):
            return set(members)

    return object.__new__(Unstarted)


def test_an_averaging_group_with_a_stranger_is_refused_before_any_tensor_moves(monkeypatch):
    """With a secret, only peers that wrote a member record (which needs the secret) may be in a group."""
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.allreduce import AllreduceException

    aggregated = []

    async def hivemind_aggregate(self, group_info, min_vector_size, **kwargs):
        aggregated.append(group_info.peer_ids)
        return {}

    monkeypatch.setattr(DecentralizedAverager, "_aggregate_with_group", hivemind_aggregate)

    averager = averager_of_members("peer-a", "peer-b")
    averager._running_groups = {}
    with pytest.raises(AllreduceException, match="not members of this run .*: peer-x"):
        asyncio.run(averager._aggregate_with_group(SimpleNamespace(group_id=b"g", peer_ids=["peer-a", "peer-x"]), 0))
    assert aggregated == []
    asyncio.run(averager._aggregate_with_group(SimpleNamespace(group_id=b"g", peer_ids=["peer-a", "peer-b"]), 0))
    assert aggregated == [["peer-a", "peer-b"]]


def test_a_stranger_asking_to_join_a_group_is_refused_before_matchmaking(monkeypatch):
    """Without a member record a peer cannot enter matchmaking at all: let in, it would make every member refuse
    the group and fail the round's average (seen with a peer holding no secret, only an address and the run name)."""
    from hivemind.averaging import DecentralizedAverager
    from hivemind.proto import averaging_pb2

    matched = []

    async def hivemind_join(self, request, context):
        matched.append(str(context.remote_id))
        yield averaging_pb2.MessageFromLeader(code=averaging_pb2.ACCEPTED)

    monkeypatch.setattr(DecentralizedAverager, "rpc_join_group", hivemind_join)

    averager = averager_of_members("peer-a", "peer-b")

    async def answers(peer: str) -> list[str]:
        stream = averager.rpc_join_group(averaging_pb2.JoinRequest(), SimpleNamespace(remote_id=peer))
        return [averaging_pb2.MessageCode.Name(message.code) async for message in stream]

    assert asyncio.run(answers("peer-x")) == ["PROTOCOL_VIOLATION"]
    assert matched == []
    assert asyncio.run(answers("peer-b")) == ["ACCEPTED"]
    assert matched == ["peer-b"]
    # a member seen once is answered without another lookup (one could outlast the asker's 1 s request timeout)
    lookups = []

    async def no_lookup():
        lookups.append(1)
        return set()

    averager._members = no_lookup
    assert asyncio.run(answers("peer-b")) == ["ACCEPTED"] and lookups == []
    assert asyncio.run(answers("peer-y")) == ["PROTOCOL_VIOLATION"] and lookups == [1]


def test_incomplete_share_counts_lost_results_and_inputs_this_node_reduced_without():
    """1000 values, this node reduces 300 of them in 2 parts from 3 senders: one sender's input to one part
    timed out (1/6 of 300 values averaged over two peers only), and 100 values of results never came back."""
    runner = SimpleNamespace(
        tensor_part_container=SimpleNamespace(failed_size=100, total_size=1000),
        tensor_part_reducer=SimpleNamespace(num_parts=2, num_senders=3, num_parts_received=[2, 1, 2]),
        parts_for_local_averaging=[torch.zeros(200), torch.zeros(100)])
    assert incomplete_share(runner) == pytest.approx(0.1 + (1 / 6) * 0.3)
    complete = SimpleNamespace(
        tensor_part_container=SimpleNamespace(failed_size=0, total_size=1000),
        tensor_part_reducer=SimpleNamespace(num_parts=2, num_senders=3, num_parts_received=[2, 2, 2]),
        parts_for_local_averaging=[torch.zeros(200), torch.zeros(100)])
    assert incomplete_share(complete) == 0.0
    assert incomplete_share(None) == 0.0


def test_a_peer_with_no_one_at_its_initial_peers_is_told_the_run_may_have_begun_or_ended_without_it():
    """A real p2pd bootstrapping from an address where nothing listens (a peer that finished, or never
    started): the error names that case and start_wait_s, not a secret mismatch."""
    from geodiloco.runtime.auth import AuthError
    from geodiloco.runtime.launch import free_port

    nobody = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/12D3KooWAZuFGWf4wHQD99X5L2GRFnsBzn21quhQRVL5TbhwEemT"
    with pytest.raises(AuthError) as refused:
        HivemindOuterSync(topology(1), peer_options([nobody]), "orphan", NAMES, NUMEL, "none")
    message = str(refused.value)
    assert message.startswith("node b: the hivemind peer did not start (") and nobody in message
    assert "nothing answers at those addresses" in message
    assert "comm.hivemind.start_wait_s (5 s) began without them" in message
    assert "GEODILOCO_SECRET" not in message
    deadline = time.monotonic() + 10
    while bootstrapping_from(nobody) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not bootstrapping_from(nobody), "the failed peer's p2pd outlived it"


@pytest.mark.parametrize("error, says, not_says", [
    ("DHTNode bootstrap failed: none of the initial_peers responded to a ping. (set ensure_bootstrap_success=False "
     "to ignore)", "refuse this node's requests: do they use the same GEODILOCO_SECRET?", "start_wait_s"),
    ("Daemon failed to start in 15.0 seconds", "are they running and reachable, and do they use the same "
     "GEODILOCO_SECRET?", "start_wait_s"),
])
def test_a_peer_that_cannot_start_is_told_the_likely_cause(error, says, not_says):
    message = peer_start_failure("c", error, ["/ip4/10.0.0.1/tcp/31337/p2p/Qm"], 60.0)
    assert message.startswith(f"node c: the hivemind peer did not start ({error}); initial peers: /ip4/10.0.0.1/")
    assert says in message and not_says not in message


def test_founders_say_whom_they_wait_for_and_start_without_a_node_that_never_came(capsys, monkeypatch):
    from geodiloco.runtime.sync import hivemind_backend

    monkeypatch.setattr(hivemind_backend, "FOUNDING_QUIET_S", 0.8)
    first = HivemindOuterSync(topology(0), peer_options([]), "founding", NAMES, NUMEL, "none")
    syncs = [first, HivemindOuterSync(topology(1), peer_options(first.maddrs), "founding", NAMES, NUMEL, "none")]
    agreed = {}

    def found(sync):
        name = sync.topology.node_name
        agreed[name] = sync.found({"run_id": f"run-of-{name}", "resume_round": None, "node": name}, 2.5)

    try:
        threads = [threading.Thread(target=found, args=(sync,)) for sync in syncs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        for sync in syncs:
            sync.close()
    # c never started: both founders wait the whole start_wait_s, then agree on a's proposal (lowest index)
    assert agreed == {"a": {"run_id": "run-of-a", "resume_round": None, "node": "a"},
                      "b": {"run_id": "run-of-a", "resume_round": None, "node": "a"}}
    out = capsys.readouterr().out
    for name in "ab":
        assert f"node {name}: waiting up to 2.5 s (comm.hivemind.start_wait_s) for c to start" in out, out
        assert (f"node {name}: starting without c (not up within comm.hivemind.start_wait_s, 2.5 s); they join "
                "mid-run when they come") in out, out


def final_exchange(sync, run_id, saved_round):
    """The run's last exchange as ``_train_rounds`` makes it, after ``finish`` (set here directly)."""
    sync._final_key = f"saved_{run_id}_4"
    sync._present = list(NAMES)
    return sync.exchange({"local_rank": 0, "previous_record": None, "saved_round": saved_round})


def test_the_last_checkpoint_is_confirmed_by_every_site_before_it_is_committed(capsys):
    with three_peers("final") as syncs:
        for sync in syncs:
            sync.set_round(4, joined=0)
        results = {}
        threads = [threading.Thread(target=lambda index=index: results.__setitem__(
            NAMES[index], final_exchange(syncs[index], "run1", 4))) for index in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for name in NAMES:
            leaders = {item.get("node", name): item["saved_round"] for item in results[name]}
            assert leaders == {"a": 4, "b": 4, "c": 4}, name

        # c is alive but timed out in finish (it never said it was done): not awaited a second round_timeout_s
        syncs[0]._done_peers, syncs[1]._done_peers = ["b"], ["a"]
        confirm_b = threading.Thread(target=final_exchange, args=(syncs[1], "run0", 4))
        confirm_b.start()
        started = time.monotonic()
        gathered = final_exchange(syncs[0], "run0", 4)
        assert time.monotonic() - started < 15.0
        confirm_b.join(timeout=60)
        assert {item.get("node", "a"): item["saved_round"] for item in gathered} == {"a": 4, "b": 4, "c": None}
        syncs[0]._done_peers = syncs[1]._done_peers = None

        # c dies while writing its files (its goodbye stands in for the heartbeat's expiry); b confirms
        syncs[2].close()
        confirm_b = threading.Thread(target=final_exchange, args=(syncs[1], "run2", 4))
        confirm_b.start()
        started = time.monotonic()
        gathered = final_exchange(syncs[0], "run2", 4)
        confirm_b.join(timeout=60)
        assert time.monotonic() - started < 15.0  # not the 30 s round_timeout_s: c is no longer awaited
        assert {item.get("node", "a"): item["saved_round"] for item in gathered} == {"a": 4, "b": 4, "c": None}
        assert "c did not confirm the checkpoint of round 5; `latest` stays on the round before" in capsys.readouterr().out


def test_a_failed_all_reduce_with_no_peer_left_says_why_before_going_on_alone(capsys):
    """Every peer gone: the node applies its own update, and says what failed (a TypeError of ours would
    otherwise pass for a lost peer); with a live peer left it is out of sync instead."""
    def sync_with(members):
        return SimpleNamespace(running_round=lambda: 3, members=lambda: members,
                               topology=SimpleNamespace(node_name="a"))

    HivemindOuterSync._after_failed_step(sync_with(["a"]), 3, TypeError("unsupported operand"))
    out = capsys.readouterr().out
    assert ("node a: outer all-reduce of round 4 failed (TypeError: unsupported operand) and no live peer is left; "
            "this node applies its own update alone") in out
    with pytest.raises(OutOfSync, match="failed \\(timed out\\) with live peers b"):
        HivemindOuterSync._after_failed_step(sync_with(["a", "b"]), 3, TimeoutError("timed out"))
