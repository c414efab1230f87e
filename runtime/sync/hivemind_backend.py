"""Outer sync over hivemind: no master, peers find each other through a DHT, join and leave.

Each node's leader runs a hivemind DHT peer and a ``DecentralizedAverager`` over one
flat fp32 buffer (the pseudo-gradient). What lives in the DHT (keys under
``geodiloco_<run name>``):

- ``members``: one heartbeat per live node (``round`` it works on, ``joined``: the first
  round it takes part in), refreshed by a background thread and expiring after
  ``heartbeat_ttl_s``: a node that dies stops being awaited within that time.
- ``round<r>``: each node's statistics of round ``r`` (the readiness exchange). A node
  waits until every live member that joined by round ``r`` has posted, or
  ``round_timeout_s``, then the pseudo-gradients are averaged among the nodes that came.
- ``start``: the first nodes' proposals (run id, resume round); the lowest config index wins.
- ``saved_<run id>_<last round>``: at the end of the run, the round each node's final checkpoint files hold
  on disk. A node moves ``latest`` to its last round only once every node of that round
  confirmed the same round, as the torch backend's final exchange does.

A node that finds peers already training downloads the latest global parameters and
outer-optimizer state from one of them (hivemind's state sharing) and joins the next
round. A node that falls behind (its peers finished a round without it) raises
``OutOfSync`` and does the same.

Averaging groups are separated by round: the group key carries the round number, so
a late node never mixes its pseudo-gradient into another round.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from geodiloco.balancer.network import CODEC_BITS, HIVEMIND_WIRE_CODECS, hivemind_wire_codec
from geodiloco.predictor.unknown_gpus import adopted_rows
from geodiloco.runtime import checkpoint
from geodiloco.runtime.auth import SECRET_ENV, AuthError
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import HivemindSection
from geodiloco.runtime.sync.multiaddrs import checked_multiaddrs
from geodiloco.runtime.diloco import group_average_scale, group_average_terms
from geodiloco.runtime.host_threads import choose_leader_threads, intra_op_threads
from geodiloco.runtime.plain_collectives import all_gather_values, broadcast_value
from geodiloco.runtime.sync.hivemind_session import (finish_hivemind, join_from_peers, reload_global_state,
                                                     start_hivemind)
from geodiloco.runtime.sync.protocol import (CannotStart, OutOfSync, RoundSync, StartPoint, SyncHandles,
                                              SyncOutcome, TooFewNodes, TooFewToGoOn)

POLL_S = 0.1
STATE_DECLARE_PERIOD_S = 10.0
ROUND_KEY_TTL_S = 3600.0
ROUND_BITS = 10
INITIAL_PEERS_ENV = "GEODILOCO_INITIAL_PEERS"
MADDRS_FILE_ENV = "GEODILOCO_MADDRS_FILE"
HOST_MADDRS_ENV = "GEODILOCO_HOST_MADDRS"
MISSING_SHARE_KEY = "geodiloco_missing_share"
FOUNDING_QUIET_S = 2.0
"""Seconds a founding node waits for the others before it says whom it waits for."""


def _import_hivemind():
    """hivemind warns on import (torch.jit deprecation) and logs a lot at INFO: keep warnings,
    except the advice that group sizes be powers of two (ours is the number of nodes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import hivemind
        from hivemind.averaging import DecentralizedAverager
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    logging.getLogger("hivemind.averaging.key_manager").addFilter(
        lambda record: "power of 2" not in record.getMessage())
    _register_uniform_8bit()
    return hivemind, DecentralizedAverager


def _register_uniform_8bit() -> None:
    """Make hivemind's 8-bit codec work here, in this process and the peers it forks.

    hivemind 1.1.12 decodes it with ``int()`` of a one-element numpy array, which numpy 2
    rejects, and encodes a tensor without spread (all equal, e.g. a zero pseudo-gradient) with
    a zero quantization scale. The registry entry every peer decodes with is replaced.
    """
    import numpy as np
    from hivemind.compression import serialization
    from hivemind.compression.quantization import Uniform8BitQuantization

    class Uniform8Bit(Uniform8BitQuantization):
        def quantize(self, tensor: torch.Tensor, allow_inplace: bool = False):
            if tensor.numel() < 2 or float(tensor.float().std()) == 0.0:
                value = float(tensor.flatten()[0]) if tensor.numel() else 0.0
                return (np.zeros(tuple(tensor.shape), dtype=self.indices_dtype),
                        np.full(self.n_bins, value, dtype=self.codebook_dtype))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return super().quantize(tensor, allow_inplace)

        def extract(self, serialized_tensor):
            buffer = serialized_tensor.buffer
            codebook_size = int(np.frombuffer(buffer, count=1, dtype=np.int64)[0])
            codebook = np.frombuffer(buffer, offset=8, count=codebook_size, dtype=self.codebook_dtype)
            indices = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
            indices = torch.from_numpy(indices.astype(np.int64)).reshape(tuple(serialized_tensor.size))
            values = torch.from_numpy(codebook.copy()).to(dtype=getattr(torch, serialized_tensor.dtype))
            return values[indices].requires_grad_(serialized_tensor.requires_grad)

    serialization._BASE_COMPRESSION_TYPES["UNIFORM_8BIT"] = Uniform8Bit()


def codec(name: str):
    """hivemind compression object for ``none`` | ``fp16`` | ``8bit``."""
    _import_hivemind()
    from hivemind.compression import Float16Compression, NoCompression
    from hivemind.compression import serialization
    codecs = {"none": NoCompression(), "fp16": Float16Compression(),
              "8bit": serialization._BASE_COMPRESSION_TYPES["UNIFORM_8BIT"]}
    return codecs[name]


def wire_codec(options: HivemindSection, diloco_compression: str) -> str:
    """The hivemind codec of a run (see ``balancer.network.hivemind_wire_codec``)."""
    return hivemind_wire_codec(options.compression, diloco_compression)


def wire_bits(codec_name: str) -> int:
    """Bits per element of a hivemind codec on the wire (8bit: one code byte, plus a 256-entry codebook per part)."""
    return CODEC_BITS[HIVEMIND_WIRE_CODECS[codec_name]]


def butterfly_sent_bytes(codec_name: str, numel: int, group_size: int) -> int:
    """Bytes one peer sends in hivemind's butterfly all-reduce of ``numel`` elements within a group of
    ``group_size`` peers of equal bandwidth: each other peer gets its part of this peer's vector ((n-1)/n of
    the payload), then the averaged part this peer reduced ((n-1)/n again), both encoded with the codec. The
    same 2 (n-1)/n x payload as the torch backend's ring; codebooks and framing (under 1 %) left out."""
    if group_size <= 1:
        return 0
    return int(2 * (group_size - 1) * -(-numel * wire_bits(codec_name) // 8) / group_size)


def _on_wire(flat: torch.Tensor, diloco_compression: str) -> torch.Tensor:
    """bf16 is not one of hivemind's codecs: round through it here, send fp32 (the others are the codec's job)."""
    if diloco_compression == "bf16":
        return flat.to(torch.bfloat16).to(torch.float32)
    return flat


def incomplete_share(runner) -> float:
    """Share of the averaged vector that is not an average over the whole group, as one node sees it:
    results parts that never came back, plus inputs its own reducer did not receive (a sender timed out)."""
    parts = getattr(runner, "tensor_part_container", None)
    failed_size, total_size = getattr(parts, "failed_size", 0), getattr(parts, "total_size", 0)
    share = failed_size / total_size if failed_size and total_size else 0.0
    reducer = getattr(runner, "tensor_part_reducer", None)
    expected = getattr(reducer, "num_parts", 0) * getattr(reducer, "num_senders", 0)
    if expected and total_size:
        received = sum(getattr(reducer, "num_parts_received", ()))
        own_size = sum(part.numel() for part in getattr(runner, "parts_for_local_averaging", ()))
        share += (expected - received) / expected * own_size / total_size
    return share


def round_group_bits(round_idx: int) -> str:
    """Group-key bits of a round: nodes in different rounds never meet in one all-reduce."""
    return format(round_idx % (1 << ROUND_BITS), f"0{ROUND_BITS}b")


def host_maddrs(options: HivemindSection) -> list[str]:
    """Where this node's peer listens: GEODILOCO_HOST_MADDRS (comma separated) when set, else the
    config's. ``geodiloco run`` sets it to the one address each node is reached at on this host
    (loopback, or the site's namespace address): with 0.0.0.0 a peer announces every address of
    the host, and dials to addresses that do not answer stall all-reduces until their chunk
    timeout."""
    override = [addr.strip() for addr in os.environ.get(HOST_MADDRS_ENV, "").split(",") if addr.strip()]
    return checked_multiaddrs(override, HOST_MADDRS_ENV, names_peer=False) or list(options.host_maddrs)


def initial_peers(options: HivemindSection) -> list[str]:
    """Peers to bootstrap from: the config's, plus GEODILOCO_INITIAL_PEERS (comma separated)."""
    extra = [addr.strip() for addr in os.environ.get(INITIAL_PEERS_ENV, "").split(",") if addr.strip()]
    return list(options.initial_peers) + checked_multiaddrs(extra, INITIAL_PEERS_ENV, names_peer=True)


def peer_start_failure(node_name: str, error: str, peers: list[str], start_wait_s: float) -> str:
    """Why this node's hivemind peer could not start, told apart by where bootstrapping stopped:
    p2pd reaching no one at the initial peers' addresses (nothing listens there: not started yet,
    already finished, or not reachable from here), or the DHT's ping answered by no one (the peers
    are there but refuse this node's requests, i.e. another secret)."""
    head = (f"node {node_name}: the hivemind peer did not start ({error}); initial peers: "
            f"{', '.join(peers) or 'none'}")
    if "failed to connect to bootstrap peers" in error:
        return (f"{head} (nothing answers at those addresses: is that peer running and reachable from here? "
                f"A run whose nodes did not all start within comm.hivemind.start_wait_s ({start_wait_s:g} s) "
                "began without them, and a short one may have ended already)")
    if "none of the initial_peers responded" in error:
        return (f"{head} (the peers are there but refuse this node's requests: do they use the same "
                f"{SECRET_ENV}? peers answer only requests signed with it)")
    return (f"{head} (are they running and reachable, and do they use the same {SECRET_ENV}? peers answer only "
            "requests signed with it)")


def make_averager_class():
    """DecentralizedAverager that shares a published outer state and resizes its groups."""
    _, DecentralizedAverager = _import_hivemind()

    from hivemind.averaging.allreduce import AllreduceException

    class StateSharingAverager(DecentralizedAverager):
        def __init__(self, *args, members_key: Optional[str] = None, **kwargs) -> None:
            self._members_key = members_key
            self._published: tuple[Any, list[torch.Tensor]] = (None, [])
            self._published_lock = threading.Lock()
            super().__init__(*args, **kwargs)

        def publish(self, metadata: dict, tensors: list[torch.Tensor]) -> None:
            """Offer this state (cloned) to joiners until the next publish."""
            copies = [tensor.detach().cpu().clone() for tensor in tensors]
            with self._published_lock:
                self._published = (metadata, copies)

        def get_current_state(self):
            with self._published_lock:
                metadata, tensors = self._published
            return metadata, tensors, None

        async def _members(self) -> Optional[set[str]]:
            """Peer ids of the run's members, from their DHT member records (only holders of the
            run's secret can write those: runtime/sync/hivemind_auth.py); None = anyone (no secret)."""
            if self._members_key is None:
                return None
            found = await self.dht.get(self._members_key, latest=True, return_future=True)
            entries = found.value if found is not None and isinstance(found.value, dict) else {}
            members = {str(self.peer_id)} | {item.value["peer"] for item in entries.values()
                                             if isinstance(item.value, dict) and item.value.get("peer")}
            self._known_members = (getattr(self, "_known_members", None) or set()) | members
            return members

        async def rpc_download_state(self, _request, _context):
            """State only for members: a peer without a member record gets nothing."""
            members = await self._members()
            if members is not None and str(_context.remote_id) not in members:
                return
            async for part in super().rpc_download_state(_request, _context):
                yield part

        async def _admits(self, peer: str) -> bool:
            """Whether ``peer`` is a member, answered from the members seen so far when it is one of them: a DHT
            lookup before the first reply could outlast the asking peer's request timeout (1 s) over a WAN. Members
            only join (a record is never withdrawn), so a cached member stays one."""
            known = getattr(self, "_known_members", None)
            if known is not None and peer in known:
                return True
            members = await self._members()
            if members is None:
                return True
            self._known_members = (known or set()) | members
            return peer in members

        async def rpc_join_group(self, request, context):
            """Matchmaking only with members: a peer without a member record (no secret) is refused before it is
            let into a group, where it would make every member refuse that group and fail the round's average."""
            if not await self._admits(str(context.remote_id)):
                from hivemind.proto import averaging_pb2
                yield averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
                return
            async for response in super().rpc_join_group(request, context):
                yield response

        async def _aggregate_with_group(self, group_info, min_vector_size: int, **kwargs):
            """No tensor goes to a group with a peer that is not a member (see ``_members``).

            hivemind only logs an all-reduce in which a peer's part of the results never came
            (that part keeps this node's own values), or in which this node reduced its part without
            a peer whose input timed out (that part averages the others only); tell the caller the
            missing share in the gathered data, so the node keeps the round's starting state instead
            of a half average."""
            members = await self._members()
            strangers = [] if members is None else [str(peer) for peer in group_info.peer_ids
                                                    if str(peer) not in members]
            if strangers:
                raise AllreduceException(f"refused an averaging group with peers that are not members of this "
                                         f"run (no authenticated member record): {', '.join(strangers)}")
            gathered = await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
            running = self._running_groups.get(group_info.group_id)
            runner = running.result() if running is not None and running.done() else None
            missing = incomplete_share(runner)
            if missing:
                gathered = {**gathered, MISSING_SHARE_KEY: missing}
            return gathered

        # hivemind reads a handler's protobuf types from its annotations (strings in this module)
        rpc_download_state.__annotations__ = typing.get_type_hints(DecentralizedAverager.rpc_download_state)
        rpc_join_group.__annotations__ = typing.get_type_hints(DecentralizedAverager.rpc_join_group)

        def set_target_group_size(self, size: int) -> None:
            from hivemind.utils import MPFuture
            future = MPFuture()
            self._outer_pipe.send(("_set_target_group_size", [size], dict(future=future)))
            future.result()

        async def _set_target_group_size(self, size: int, future) -> None:
            """The group key manager keeps no target: it sizes its key update by the target and
            fails on a larger group (a peer whose view of the present nodes missed one), and the
            group key is set for every round anyway (``round_group_bits``)."""
            matchmaking = self._matchmaking
            matchmaking.target_group_size = size
            matchmaking.group_key_manager.target_group_size = None
            matchmaking.potential_leaders.target_group_size = size
            future.set_result(None)

    return StateSharingAverager


@dataclass
class Member:
    """A live node as its heartbeat says: the round it works on and the first round it takes
    part in (None while it is still starting or downloading the state: not awaited yet)."""

    name: str
    round: int
    joined: Optional[int]
    gpu_rows: dict = field(default_factory=dict)
    """The rows the node plans its own GPUs with (``SyncHandles.gpu_rows``)."""


def node_topology(node_name: str, config_node_names: list[str], timeout_s: float, use_cuda: bool,
                  secret: Optional[bytes] = None) -> Topology:
    """This node's ranks only: under torchrun with several GPUs they form their own
    torch.distributed world (DDP inside the node); across nodes there is no world."""
    if node_name not in config_node_names:
        raise RuntimeError(f"node {node_name!r} is not in the config's nodes ({', '.join(config_node_names)}); "
                           "pass --node-name NAME")
    local_world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if local_world_size > 1:
        from geodiloco.runtime.comm import init_process_group
        init_process_group(timeout_s, use_cuda, secret)
        rank = dist.get_rank()
    return Topology(rank=rank, world_size=local_world_size, node_name=node_name,
                    node_index=config_node_names.index(node_name), local_rank=rank,
                    local_world_size=local_world_size, node_ranks=list(range(local_world_size)),
                    leader_ranks=list(range(len(config_node_names))), secret=secret)


class HivemindOuterSync:
    """OuterSync over a hivemind DHT and decentralized averaging (see the module docstring).

    Only the node's leader talks to peers; the other ranks of a node (DDP under torchrun)
    follow it through the node's own torch.distributed group, when there is one.
    """

    logs_own_idle_only = True
    barrier_free = False
    members_wait_s = 0.0

    def __init__(self, topology: Topology, options: HivemindSection, run_name: str, node_names: list[str],
                 num_params: int, diloco_compression: str = "none", init_timeout_s: float = 120.0,
                 min_nodes: int = 1, sync_threads: Optional[int] = None, total_rounds: Optional[int] = None) -> None:
        self.topology = topology
        self.total_rounds = total_rounds
        self.sync_threads_setting = sync_threads
        self.sync_threads = torch.get_num_threads()
        """Intra-op threads of the leader's outer step while the node's other ranks wait (``start``)."""
        self.options = options
        self.compression = diloco_compression
        self.wire_codec = wire_codec(options, diloco_compression)
        self.num_params = num_params
        self.init_timeout_s = init_timeout_s
        self.min_nodes = min_nodes
        self.handles: Optional[SyncHandles] = None
        self.writes_round = True
        self.writes_global_file = True
        self.global_withheld: Optional[str] = None
        self.majority_checksum: Optional[float] = None
        self.node_names = list(node_names)
        self.prefix = "geodiloco_" + run_name.replace(".", "_").replace("-", "_")
        self.current_round = -1
        self.joined_round: Optional[int] = None
        self._present: list[str] = []
        self._final_key: Optional[str] = None
        self._done_peers: Optional[list[str]] = None
        self._founders: list[str] = []
        self.founders_gpu_rows: list[tuple[str, dict]] = []
        """(node, the rows it plans its GPUs with) of each founder, from its founding proposal."""
        self.founders_config_views: list[tuple[str, dict]] = []
        """(node, the run settings it must share with the others) of each founder, from its proposal."""
        self.founders_resumable_rounds: list[tuple[str, list[int]]] = []
        """(founder, the committed rounds it could resume from) when the run is resumed (``--resume``)."""
        self._scheduled_time = 0.0
        self.diverged = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.dht = None
        self.peer_id: Optional[str] = None
        self.averager = None
        self._heartbeat: Optional[threading.Thread] = None
        if topology.is_leader:
            self._start_peer(num_params, self.wire_codec)

    # ----- peer start-up -----------------------------------------------------------------

    def _start_peer(self, num_params: int, codec_name: str) -> None:
        hivemind, _ = _import_hivemind()
        options = self.options
        peers = initial_peers(options)
        try:
            self.dht = hivemind.DHT(start=True, host_maddrs=host_maddrs(options),
                                    announce_maddrs=list(options.announce_maddrs) or None, initial_peers=peers,
                                    **self._auth_options())
        except Exception as err:
            raise AuthError(peer_start_failure(self.topology.node_name, str(err), peers,
                                               options.start_wait_s)) from None
        self.maddrs = [str(addr) for addr in self.dht.get_visible_maddrs()]
        self.peer_id = str(self.dht.peer_id)
        print(f"[geodiloco] node {self.topology.node_name}: hivemind peer up; other nodes can join with "
              f"--set comm.hivemind.initial_peers='[{', '.join(self.maddrs)}]'", flush=True)
        maddrs_file = os.environ.get(MADDRS_FILE_ENV)
        if maddrs_file:
            temp = Path(maddrs_file + ".tmp")
            temp.write_text("\n".join(self.maddrs) + "\n")
            os.replace(temp, maddrs_file)
        self.buffer = torch.zeros(num_params, dtype=torch.float32)
        averager_class = make_averager_class()
        self.averager = averager_class(
            [self.buffer], self.dht, start=True, prefix=self.prefix + "_outer",
            target_group_size=options.target_group_size or len(self.node_names),
            min_group_size=2, initial_group_bits=round_group_bits(0),
            min_matchmaking_time=options.matchmaking_time_s, request_timeout=options.request_timeout_s,
            allreduce_timeout=options.allreduce_timeout_s, next_chunk_timeout=options.chunk_timeout_s,
            compression=codec(codec_name), declare_state_period=STATE_DECLARE_PERIOD_S,
            allow_state_sharing=True,
            members_key=f"{self.prefix}.members" if self.topology.secret is not None else None)
        self._beat()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="geodiloco-heartbeat", daemon=True)
        self._heartbeat.start()

    def _auth_options(self) -> dict:
        """hivemind's authorization hook, keyed by the run's secret (none without one)."""
        if self.topology.secret is None:
            return {}
        from geodiloco.runtime.sync.hivemind_auth import make_authorizer
        return {"authorizer": make_authorizer(self.topology.secret)}

    # ----- DHT helpers -------------------------------------------------------------------

    def _now(self) -> float:
        from hivemind.utils import get_dht_time
        return get_dht_time()

    def _store(self, key: str, subkey: str, value: Any, ttl_s: float) -> None:
        with self._lock:
            self.dht.store(f"{self.prefix}.{key}", value, self._now() + ttl_s, subkey=subkey)

    def _read(self, key: str) -> dict[str, Any]:
        """The live subkey -> value entries of a dictionary key ({} when absent)."""
        with self._lock:
            found = self.dht.get(f"{self.prefix}.{key}", latest=True)
        if found is None or not isinstance(found.value, dict):
            return {}
        return {subkey: item.value for subkey, item in found.value.items() if item.value is not None}

    def _beat(self, left: bool = False) -> None:
        value = {"round": self.current_round, "joined": self.joined_round, "left": left, "peer": self.peer_id,
                 "gpu_rows": self.handles.gpu_rows if self.handles is not None else {}}
        self._store("members", self.topology.node_name, value, self.options.heartbeat_ttl_s)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.options.heartbeat_ttl_s / 3):
            try:
                self._beat()
            except Exception as err:  # a missed beat only risks being skipped for a round
                print(f"[geodiloco] node {self.topology.node_name}: heartbeat failed: {err}", flush=True)

    def members(self) -> dict[str, Member]:
        """Live nodes (fresh heartbeat, not left), in config order."""
        entries = self._read("members")
        live = {}
        for name in self.node_names:
            info = entries.get(name)
            if isinstance(info, dict) and not info.get("left"):
                joined = info.get("joined")
                live[name] = Member(name, int(info.get("round", -1)), None if joined is None else int(joined),
                                    info.get("gpu_rows") or {})
        return live

    def set_round(self, round_idx: int, joined: Optional[int] = None) -> None:
        """Announce the round this node now works on (and, for a joiner, its first round)."""
        self.current_round = round_idx
        if joined is not None:
            self.joined_round = joined
        if self.topology.is_leader:
            self._beat()

    # ----- in-node helpers ---------------------------------------------------------------

    def _in_node(self) -> bool:
        return dist.is_initialized() and self.topology.local_world_size > 1

    def share_in_node(self, value: Any) -> Any:
        """The leader's ``value`` on every rank of this node."""
        if not self._in_node():
            return value
        return broadcast_value(value, src=0)

    def _taking_part(self, round_idx: int, members: dict[str, Member]) -> list[str]:
        """This node, the live members that take part by round ``round_idx``, and in this node's first
        round every node that founded the run with it, whose heartbeat may not be visible yet (each
        founder then plans that round for the same nodes); config order."""
        founders = self._founders if round_idx == self.joined_round else []
        return [name for name in self.node_names
                if name == self.topology.node_name or name in founders
                or (name in members and members[name].joined is not None and members[name].joined <= round_idx)]

    def planning_nodes(self, round_idx: int) -> list[str]:
        """Nodes to plan round ``round_idx`` for (``_taking_part``). A member that joined after the
        founding and whose GPU rows this node has not adopted yet has them adopted first, so its peers
        plan it from the rows it plans itself with."""
        chosen = None
        if self.topology.is_leader:
            members = self.members()
            names = self._taking_part(round_idx, members)
            adopted = {node for node, _ in adopted_rows()}
            joiners_rows = [(name, members[name].gpu_rows) for name in names
                            if name in members and name not in adopted and members[name].gpu_rows]
            chosen = (names, joiners_rows)
        names, joiners_rows = self.share_in_node(chosen)
        if joiners_rows and self.handles is not None and self.handles.adopt_gpu_rows is not None:
            self.handles.adopt_gpu_rows(joiners_rows)
        return names

    # ----- start: found a run or join one ------------------------------------------------

    def running_round(self) -> Optional[int]:
        """The newest round live peers work on, None when no peer is training yet (leader only)."""
        rounds = [member.round for name, member in self.members().items()
                  if name != self.topology.node_name and member.round >= 0]
        return max(rounds) if rounds else None

    def found(self, proposal: dict, wait_s: float) -> Optional[dict]:
        """Founding nodes agree on a proposal (the lowest config index wins); None = join instead.

        Waits until every config node proposed, up to ``wait_s``; past that, while fewer than
        ``min_nodes`` (comm.min_nodes) have proposed, up to ``init_timeout_s`` more, then gives up
        (``TooFewNodes`` naming the missing nodes). Gives up founding as soon as a peer is seen training.
        """
        self._store("start", self.topology.node_name, proposal, ROUND_KEY_TTL_S)
        started = time.monotonic()
        said: set[str] = set()
        seen_up: set[str] = set()
        while True:
            proposals = {name: value for name, value in self._read("start").items() if not value.get("withdrawn")}
            seen_up |= set(proposals)
            running = self.running_round()
            if running is not None:
                if self._founded_without_waiting(proposals, running):
                    break
                return None
            waited_s = time.monotonic() - started
            proposed = len([name for name in self.node_names if name in proposals])
            if proposed == len(self.node_names) or (waited_s > wait_s and proposed >= self.min_nodes):
                break
            if waited_s > wait_s + self.init_timeout_s:
                # withdrawn, so that a site starting later does not count this one as up
                self._store("start", self.topology.node_name, {"withdrawn": True}, ROUND_KEY_TTL_S)
                raise TooFewNodes(self._too_few_founders(proposals, seen_up, wait_s))
            self._say_founding_wait(said, self._missing(proposals), proposed, waited_s, wait_s)
            time.sleep(POLL_S)
        self._founders = [name for name in self.node_names if name in proposals]
        self.founders_gpu_rows = [(name, proposals[name].get("gpu_rows") or {}) for name in self._founders]
        self.founders_config_views = [(name, proposals[name]["config_view"]) for name in self._founders
                                      if proposals[name].get("config_view") is not None]
        self.founders_resumable_rounds = [(name, list(proposals[name].get("resumable_rounds") or []))
                                          for name in self._founders]
        missing = self._missing(proposals)
        if missing:
            print(f"[geodiloco] node {self.topology.node_name}: starting without {', '.join(missing)} (not up "
                  f"within comm.hivemind.start_wait_s, {wait_s:g} s); they join mid-run when they come", flush=True)
        return proposals[self._founders[0]]

    def _say_founding_wait(self, said: set[str], missing: list[str], proposed: int, waited_s: float,
                           wait_s: float) -> None:
        """Each founding notice once: after a quiet moment, who is awaited; past ``wait_s``, how many of
        ``min_nodes`` are up. ``said`` holds the notices given."""
        me = self.topology.node_name
        if "waiting" not in said and waited_s > FOUNDING_QUIET_S:
            print(f"[geodiloco] node {me}: waiting up to {wait_s:g} s (comm.hivemind.start_wait_s) for "
                  f"{', '.join(missing)} to start", flush=True)
            said.add("waiting")
        if "too few" not in said and waited_s > wait_s:
            print(f"[geodiloco] node {me}: {proposed} of the {self.min_nodes} nodes comm.min_nodes asks for are up; "
                  f"waiting up to {self.init_timeout_s:g} s more (comm.init_timeout_s) for {', '.join(missing)}",
                  flush=True)
            said.add("too few")

    def _too_few_founders(self, proposals: dict, seen_up: set[str], wait_s: float) -> str:
        """Why founding gave up: the nodes that came up (and those of them that gave up first), the missing."""
        came = [name for name in self.node_names if name in seen_up]
        gave_up = [name for name in came if name not in proposals]
        left = f"; {', '.join(gave_up)} gave up waiting first" if gave_up else ""
        return (f"node {self.topology.node_name}: only {len(came)} node(s) came up ({', '.join(came)}{left}) within "
                f"comm.hivemind.start_wait_s ({wait_s:g} s) and comm.init_timeout_s ({self.init_timeout_s:g} s) "
                f"more; comm.min_nodes asks for {self.min_nodes} to start the run. Never up: "
                f"{', '.join(name for name in self.node_names if name not in seen_up)}. Start those sites (with "
                "this node's address in their initial peers), or lower comm.min_nodes")

    def _missing(self, proposals: dict) -> list[str]:
        """Config nodes that have not proposed (not started, or not reachable yet)."""
        return [name for name in self.node_names if name not in proposals]

    def _founded_without_waiting(self, proposals: dict, running_round: int) -> bool:
        """Peers started the first round as soon as they saw this node's proposal: it is a founder."""
        if self.topology.node_name not in proposals:
            return False
        winner = proposals[next(name for name in self.node_names if name in proposals)]
        resume_round = winner.get("resume_round")
        return running_round == (0 if resume_round is None else resume_round + 1)

    def announce_join(self) -> int:
        """Announce taking part from the round after the one live peers work on, and wait until
        they finish it; returns that round (-1 when no peer is training)."""
        running = self.running_round()
        if running is None:
            return -1
        if self.total_rounds is not None and running + 1 >= self.total_rounds:
            raise CannotStart(f"node {self.topology.node_name}: the peers are in the run's last round ({running + 1} "
                              f"of {self.total_rounds}): nothing is left to join; once it ends, continue it with "
                              "--resume and more diloco.rounds, or start a new run")
        self.current_round, self.joined_round = -1, running + 1
        self._beat()
        print(f"[geodiloco] node {self.topology.node_name}: peers are in round {running + 1}; "
              f"joining from round {running + 2} once they finish it", flush=True)
        while True:
            now_running = self.running_round()
            if now_running is None or now_running > running:
                return running
            time.sleep(POLL_S)

    def publish_state(self, metadata: dict, tensors: list[torch.Tensor]) -> None:
        """Offer the global state after a round to joiners."""
        if self.averager is not None:
            self.averager.publish(metadata, tensors)

    def download_state(self, timeout_s: float, min_round: int = -1,
                       checksum: Optional[float] = None) -> Optional[tuple[dict, list[torch.Tensor]]]:
        """(metadata, tensors) from a peer that published its state after round ``min_round`` or
        later (and, given ``checksum``, whose parameters agree with it within ``resync_tolerance``);
        None if none could give it within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            loaded = self.averager.load_state_from_peers(timeout=self.options.chunk_timeout_s)
            if loaded is not None and loaded[0] and loaded[0]["round"] >= min_round and (
                    checksum is None or self._agree(self._params_checksum(loaded[1]), checksum)):
                return loaded
            time.sleep(0.2)
        return None

    def _params_checksum(self, tensors: list[torch.Tensor]) -> float:
        """Sum of |global parameters| of a downloaded state (its leading tensors), as ``NodeTrainer.param_checksum``
        sums a node's: computed here, on the rare reload, rather than by every node at every publish."""
        return float(sum(tensor.detach().double().abs().sum() for tensor in tensors[:len(self.handles.params)]))

    def last_round_members(self) -> list[str]:
        """The nodes of the last round's group (its readiness exchange), in config order."""
        return list(self._present)

    def share_state(self, allowed: bool) -> None:
        """Offer this node's state to peers that download one, or stop offering it (a node whose parameters
        left the majority's must not be the state another such node reloads)."""
        if self.averager is not None:
            self.averager.allow_state_sharing = allowed

    # ----- the round loop's seam (runtime/sync/protocol.py) ------------------------------

    def start(self, resume: bool, handles: SyncHandles) -> StartPoint:
        self.handles = handles
        if self.topology.is_leader:
            self.sync_threads = choose_leader_threads(self.topology.node_name, self.topology.local_world_size,
                                                      self.sync_threads_setting,
                                                      handles.params[0].is_cuda if handles.params else False)
        return start_hivemind(self, resume)

    def begin_round(self, round_idx: int) -> Optional[list[str]]:
        """Wait for ``comm.min_nodes`` live nodes (``await_min_nodes``), then announce the round."""
        self.await_min_nodes(round_idx)
        self.set_round(round_idx)
        return self.planning_nodes(round_idx)

    def await_min_nodes(self, round_idx: int) -> None:
        """Between rounds, while fewer than ``min_nodes`` nodes would take part in round ``round_idx``,
        wait up to ``init_timeout_s`` for sites to (re)join, then raise ``TooFewToGoOn``. The heartbeat
        still names the round before, so a joiner announces this round as its first and is counted."""
        self.members_wait_s = 0.0
        if self.min_nodes <= 1:
            return
        started = time.monotonic()
        outcome = self._min_nodes_wait(round_idx) if self.topology.is_leader else None
        outcome = self.share_in_node(outcome)
        self.members_wait_s = time.monotonic() - started
        if outcome is not None:
            raise TooFewToGoOn(outcome)

    def _min_nodes_wait(self, round_idx: int) -> Optional[str]:
        """None once enough nodes take part in ``round_idx``; why this node stops when none came in time."""
        me, started, said = self.topology.node_name, time.monotonic(), False
        while True:
            live = self._taking_part(round_idx, self.members())
            if len(live) >= self.min_nodes:
                if said:
                    print(f"[geodiloco] node {me}: {', '.join(live)} take part; going on with round {round_idx + 1}",
                          flush=True)
                return None
            gone = ", ".join(name for name in self.node_names if name not in live)
            if time.monotonic() - started > self.init_timeout_s:
                return (f"node {me}: only {len(live)} node(s) live before round {round_idx + 1} ({', '.join(live)}) "
                        f"for comm.init_timeout_s ({self.init_timeout_s:g} s); comm.min_nodes asks for "
                        f"{self.min_nodes} to go on. Gone: {gone}")
            if not said:
                print(f"[geodiloco] node {me}: {len(live)} of the {self.min_nodes} nodes comm.min_nodes asks for are "
                      f"live before round {round_idx + 1}; waiting up to {self.init_timeout_s:g} s "
                      f"(comm.init_timeout_s) for {gone} to (re)join", flush=True)
                said = True
            time.sleep(POLL_S)

    def before_step(self, step_idx: int, local_steps: int, round_sync: RoundSync) -> None:
        """Blocking sync only: nothing happens during the local phase."""

    def outer_step(self, round_sync: RoundSync) -> SyncOutcome:
        """The leader averages with the group that forms and takes the outer step (none when the
        average came back incomplete); every rank learns the group, or the leader's ``OutOfSync``.
        The group's first node writes the round's shared logs, and its global checkpoint unless its
        own average was partial (``global_withheld``)."""
        outer, me = self.handles.outer, self.topology.node_name
        outcome: object = None
        self.global_withheld = None
        started = time.time()
        if outer is not None:
            try:
                with intra_op_threads(self.sync_threads):  # the node's other ranks wait for the outcome
                    averaged, group = self.average_round(outer.pseudo_gradient(self.handles.params),
                                                         round_sync.weighting, round_sync.stats_by_node[me])
                    if averaged is not None:  # an incomplete average: keep the round's starting global state
                        outer.apply(averaged)
                    outer.load_into(self.handles.params)
                outcome = {item["node"]: item for item in group}
            except OutOfSync as err:
                outcome = str(err)
        outcome = self.share_in_node(outcome)
        if isinstance(outcome, str):
            raise OutOfSync(outcome)
        self.broadcast_in_node([param.data for param in self.handles.params])
        writer = next(iter(outcome))
        self.writes_round = writer == me
        self.writes_global_file = self.writes_round or not checkpoint.node_uses_dir(self.handles.run_dir, writer)
        return SyncOutcome(stats_by_node=outcome, sync_intervals=[(started, time.time())],
                           sent_bytes=butterfly_sent_bytes(self.wire_codec, self.num_params, len(outcome)))

    def end_round(self, round_idx: int, run_id: str) -> None:
        """Reload the global state when this node drifted from the majority; share ours for joiners.
        A drifted node that found no peer to reload from keeps parameters that are not the round's
        full average: it writes no global checkpoint of the round."""
        if self.share_in_node(self.diverged) and not reload_global_state(self, round_idx):
            self.global_withheld = ("its parameters differ from the majority's and no peer shared the global "
                                    "state to reload")
        if self.handles.outer is not None:
            self.publish_state(*self.handles.export_state(round_idx, run_id))

    def recover(self, error: OutOfSync) -> StartPoint:
        return join_from_peers(self)

    def finish(self, run_id: str, last_round: int) -> None:
        finish_hivemind(self, run_id, last_round)
        self._final_key = f"saved_{run_id}_{last_round}"  # a resumed run of the same id ends at another round

    def state_dict(self) -> dict:
        """Nothing in flight between rounds: the blocking average completed or was given up."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """See ``state_dict``."""

    def global_state_dict(self) -> dict:
        return {}

    def load_global_state_dict(self, state: dict) -> None:
        """Nothing beyond the global parameters and outer optimizer."""

    def state_lock(self) -> typing.Any:
        import contextlib
        return contextlib.nullcontext()

    # ----- OuterSync ---------------------------------------------------------------------

    def exchange(self, stats: Any) -> list[Any]:
        """Round statistics (dicts with ``round``) go through the DHT readiness barrier among the
        live nodes; the exchange after ``finish`` confirms each node's saved round across sites
        (``_confirm_saved``); anything else is gathered among this node's own ranks only."""
        local = self._gather_in_node(stats)
        if self._final_key is not None and isinstance(stats, dict) and "saved_round" in stats:
            return self._confirm_saved(local)
        is_round = isinstance(stats, dict) and "round" in stats and "node" in stats
        if not is_round:
            return local
        outcome = None
        if self.topology.is_leader:
            try:
                outcome = self._round_barrier(stats["round"], local[0])
            except OutOfSync as err:
                outcome = str(err)
        outcome = self.share_in_node(outcome)
        if isinstance(outcome, str):
            raise OutOfSync(outcome)
        self._present = [item["node"] for item in outcome]
        peers = [item for item in outcome if item["node"] != self.topology.node_name]
        return peers + local

    def _confirm_saved(self, local: list[dict]) -> list[dict]:
        """The run's last exchange: post the round this node's checkpoint files hold (its leader's
        ``saved_round``, on disk by now) and wait (bounded) for every node of the last round to post
        its own. A node that never posts (it died while writing, or never reached the end) is returned
        with ``saved_round`` None, so ``commit_checkpoint`` leaves ``latest`` on the round before on every site, and a
        later ``--resume`` starts all sites from a round each of them holds."""
        peers = None
        if self.topology.is_leader:
            me = self.topology.node_name
            saved = local[0].get("saved_round")
            # a node of the last round that never said it was done (it timed out in ``finish``) is not
            # awaited a second round_timeout_s: it confirms nothing, and ``latest`` stays where it was
            awaited = [name for name in self._present if name != me
                       and (self._done_peers is None or name in self._done_peers)]
            posted = self._post_and_wait(self._final_key, {"saved_round": saved}, awaited)
            peers = [{"node": name, "local_rank": 0, "previous_record": None,
                      "saved_round": posted.get(name, {}).get("saved_round")}
                     for name in self._present if name != me]
            unconfirmed = [item["node"] for item in peers if item["saved_round"] != saved]
            if saved is not None and unconfirmed:
                print(f"[geodiloco] node {me}: {', '.join(unconfirmed)} did not confirm the checkpoint of "
                      f"round {saved + 1}; `latest` stays on the round before", flush=True)
        return self.share_in_node(peers) + local

    def _gather_in_node(self, stats: Any) -> list[Any]:
        if not self._in_node():
            return [stats]
        return all_gather_values(stats)

    def _round_barrier(self, round_idx: int, my_stats: dict) -> list[dict]:
        """Post this node's stats, wait for the live members of this round (bounded); return the posted."""
        me = self.topology.node_name
        my_stats = {**my_stats, "posted_at": self._now()}
        self._store(f"round{round_idx}", me, my_stats, ROUND_KEY_TTL_S)
        started = time.monotonic()
        while True:
            posted = self._read(f"round{round_idx}")
            members = self.members()
            ahead = sorted(name for name, member in members.items() if member.round > round_idx and name != me)
            if ahead:
                raise OutOfSync(f"peers {', '.join(ahead)} finished round {round_idx + 1} without node {me}")
            awaited = [name for name, member in members.items()
                       if member.joined is not None and member.joined <= round_idx and name not in posted]
            awaited += self._founders_awaited(round_idx, members, posted, time.monotonic() - started)
            if not awaited or time.monotonic() - started > self.options.round_timeout_s:
                break
            time.sleep(POLL_S)
        posted[me] = my_stats
        present = [posted[name] for name in self.node_names if name in posted]
        self.diverged = self._is_outlier(present, me)
        self._scheduled_time = max(item.get("posted_at", 0.0) for item in present) + self.options.matchmaking_time_s
        return present

    def _founders_awaited(self, round_idx: int, members: dict[str, Member], posted: dict, waited_s: float) -> list[str]:
        """Nodes that founded the run with this one, in its first round: awaited while they still
        start (no ``joined`` yet), and, when their heartbeat is not visible yet, for one heartbeat TTL."""
        if round_idx != self.joined_round:
            return []
        awaited = []
        for name in self._founders:
            if name in posted or name == self.topology.node_name:
                continue
            member = members.get(name)
            if (member is not None and member.joined is None) or (member is None and
                                                                   waited_s < self.options.heartbeat_ttl_s):
                awaited.append(name)
        return awaited

    def _is_outlier(self, present: list[dict], me: str) -> bool:
        """Whether this node's parameters differ from the majority's (the group of the node first in the
        config on a tie) by more than ``resync_tolerance`` (relative). Every node orders the checksums the
        same way, so all agree on the majority even when no two agree (8-bit rounding); the majority's
        first node's checksum is kept as ``majority_checksum``."""
        order = {name: index for index, name in enumerate(self.node_names)}
        checksums = {item["node"]: item["start_checksum"]
                     for item in sorted(present, key=lambda item: order.get(item.get("node"), len(order)))
                     if "start_checksum" in item}
        self.majority_checksum = None
        if me not in checksums or len(checksums) < 2:
            return False
        clusters = [[name for name in checksums if self._agree(checksums[name], checksums[anchor])]
                    for anchor in checksums]
        majority = max(clusters, key=len)
        self.majority_checksum = checksums[majority[0]]
        return me not in majority

    def _agree(self, first: Optional[float], second: float) -> bool:
        """Two parameter checksums within ``resync_tolerance`` of each other (relative)."""
        if first is None:
            return False
        tolerance = self.options.resync_tolerance_for(self.wire_codec)
        return abs(first - second) <= tolerance * max(abs(first), abs(second), 1e-30)

    def reduce_weighted(self, flat: torch.Tensor, weight: float,
                        total_weight: Optional[float] = None) -> torch.Tensor:
        """sum_i weight_i * flat_i over the nodes that take part in this round's all-reduce.

        hivemind averages with weights (sum w_i x_i / sum w_i); multiplying by the present
        nodes' total weight gives the sum. If a node vanished between the readiness exchange
        and the all-reduce, the others' weights are renormalized to the same total. The
        training loop uses ``average_round``, which also tells who took part.
        """
        gather = {"node": self.topology.node_name, "total": float(total_weight) if total_weight is not None else 1.0}
        averaged, group, _ = self._average_in_group(_on_wire(flat, self.compression), float(weight), gather)
        if len(group) == 1:
            return averaged.mul_(weight)
        return averaged.mul_(group[0]["total"])

    def average_round(self, flat: torch.Tensor, weighting: str,
                      own_stats: dict) -> tuple[Optional[torch.Tensor], list[dict]]:
        """This round's weighted pseudo-gradient sum over the nodes whose pseudo-gradients it
        holds, and those nodes' round statistics (config order; this node's own ``own_stats``).
        The sum is None when part of it never came back from a peer (see ``_average_in_group``).

        Each node decides who is present from its own read of the DHT, and two reads can differ
        while a node joins or leaves at the barrier; the group hivemind forms is what counts.
        So a node's weight does not depend on who else is present (``group_average_terms``),
        its statistics travel in the group's gather, and the weighting is completed over the
        group that formed. A node left out of the group raises ``OutOfSync``.
        """
        scale, weight = group_average_terms(weighting, own_stats["tokens"], own_stats["steps"],
                                            own_stats["batch_size"])
        if not own_stats.get("finite", True):  # left out: zeros at (almost) no weight (runtime/finite_guard.py)
            flat, weight = torch.zeros_like(flat), 0.0
        shared = {key: value for key, value in own_stats.items() if key != "previous_record"}
        gather = {"node": self.topology.node_name, "stats": shared}
        scaled = flat if scale == 1.0 else flat.mul(scale)
        averaged, group, missing_share = self._average_in_group(_on_wire(scaled, self.compression), weight, gather)
        group_stats = [own_stats if item["node"] == self.topology.node_name else item["stats"] for item in group]
        self.global_withheld = self._partial_average(missing_share, [item["node"] for item in group])
        if missing_share:
            return None, group_stats
        averaged.mul_(group_average_scale(weighting, [item["steps"] for item in group_stats],
                                          [item["batch_size"] for item in group_stats]))
        return averaged, group_stats

    def _partial_average(self, missing_share: float, group_names: list[str]) -> Optional[str]:
        """Why this node's average of the round is not the full one, or None when it is: part of it
        never came back (the node kept the round's starting state), or its group lacked nodes that
        posted at the round's readiness exchange (they averaged elsewhere, or not at all). Groups
        that ``target_group_size`` keeps smaller than the present nodes count as full."""
        if missing_share:
            return (f"part of this node's outer all-reduce never came back ({missing_share * 100:.1f} %), so its "
                    "parameters are not the round's full average")
        absent = [name for name in self._present if name not in group_names]
        target = self.options.target_group_size
        if not absent or (target and len(group_names) >= min(target, len(self._present))):
            return None
        return (f"its averaging group lacked {', '.join(absent)} (present at the round's readiness exchange), "
                "so its parameters may not be the round's full average")

    def _average_in_group(self, flat: torch.Tensor, weight: float,
                          gather: dict) -> tuple[torch.Tensor, list[dict], float]:
        """hivemind's weighted mean sum w_i x_i / sum w_i over the group that forms for this
        round, the group's ``gather`` dicts in config order, and the share of the mean that never
        came back (0.0: none; hivemind keeps this node's own values for a part whose reducer never
        answered, and only logs it); a node whose peers are all gone gets its own ``flat`` and ``[gather]``.

        Every present node schedules the all-reduce at the same moment (the last readiness post
        plus ``matchmaking_time_s``): hivemind then picks the same leader on every node (earliest
        time, then peer id), so the group does not split.
        """
        alone = (flat.to(torch.float32).clone(), [gather], 0.0)
        others = [name for name in self._present if name != self.topology.node_name]
        if not others:
            return alone
        round_idx = self.current_round
        self.averager.set_group_bits(round_group_bits(round_idx))
        self.averager.set_target_group_size(min(len(self._present),
                                                self.options.target_group_size or len(self._present)))
        with self.averager.get_tensors() as tensors:
            tensors[0].copy_(flat)
        now = self._now()
        scheduled = self._scheduled_time if self._scheduled_time > now + self.options.request_timeout_s else (
            now + self.options.matchmaking_time_s)
        try:
            gathered = self.averager.step(gather=gather, weight=max(weight, 1e-12), scheduled_time=scheduled,
                                          timeout=scheduled - now + self.options.matchmaking_timeout_s)
        except Exception as err:
            self._after_failed_step(round_idx, err)
            return alone
        gathered = dict(gathered or {})
        missing_share = gathered.pop(MISSING_SHARE_KEY, 0.0)
        if not gathered:
            self._after_failed_step(round_idx, RuntimeError("no group"))
            return alone
        if missing_share:
            print(f"[geodiloco] node {self.topology.node_name}: {missing_share * 100:.1f} % of the outer "
                  f"all-reduce of round {round_idx + 1} never came back from a peer or was reduced without one; "
                  "this node keeps the round's starting global state (nodes that differ from the majority "
                  "reload the global state next round)", flush=True)
        order = {name: index for index, name in enumerate(self.node_names)}
        group = sorted(gathered.values(), key=lambda item: order[item["node"]])
        with self.averager.get_tensors() as tensors:
            return tensors[0].clone(), group, missing_share

    def _after_failed_step(self, round_idx: int, err: Exception) -> None:
        """No group: behind the peers or left out by live peers -> OutOfSync; every peer gone ->
        return, and this node keeps its own update."""
        if self.running_round() is not None and self.running_round() > round_idx:
            raise OutOfSync(f"outer all-reduce of round {round_idx + 1} failed ({err}); peers moved on")
        others = [name for name in self.members() if name != self.topology.node_name]
        if others:
            raise OutOfSync(f"outer all-reduce of round {round_idx + 1} failed ({err}) with live peers "
                            f"{', '.join(others)}")
        print(f"[geodiloco] node {self.topology.node_name}: outer all-reduce of round {round_idx + 1} failed "
              f"({type(err).__name__}: {err}) and no live peer is left; this node applies its own update alone",
              flush=True)

    def final_parameters_differ(self, run_id: str, checksum: float) -> bool:
        """Post this node's final parameter checksum, wait (bounded) for every live peer's, and
        say whether this node's differs from the majority's (leader only)."""
        posted = self._post_and_wait(f"final_{run_id}", {"node": self.topology.node_name,
                                                         "start_checksum": checksum})
        return self._is_outlier(list(posted.values()), self.topology.node_name)

    def wait_for_peers_to_finish(self, run_id: str) -> None:
        """Stay until every live peer is done (bounded), so a peer still reloading the final
        global state finds someone to load it from (leader only). The peers that said so are the
        ones the run's last exchange waits for (``_confirm_saved``)."""
        posted = self._post_and_wait(f"done_{run_id}", {"node": self.topology.node_name})
        self._done_peers = [name for name in posted if name != self.topology.node_name]

    def _post_and_wait(self, key: str, value: dict, awaited: Optional[list[str]] = None) -> dict[str, dict]:
        """Post ``value`` under ``key`` and wait until each of ``awaited`` (default: every live peer) posted
        or stopped being a live member, or ``round_timeout_s``; returns what every node posted."""
        me = self.topology.node_name
        self._store(key, me, value, ROUND_KEY_TTL_S)
        deadline = time.monotonic() + self.options.round_timeout_s
        while True:
            posted = self._read(key)
            live = self.members()
            if all(name in posted for name in (live if awaited is None else awaited) if name != me and name in live):
                break
            if time.monotonic() > deadline:
                print(f"[geodiloco] node {me}: not every live peer reached the end of the run within "
                      f"comm.hivemind.round_timeout_s ({self.options.round_timeout_s:g} s); finishing without them",
                      flush=True)
                break
            time.sleep(POLL_S)
        posted[me] = value
        return posted

    def broadcast_in_node(self, tensors: list[torch.Tensor]) -> None:
        if not self._in_node():
            return
        for tensor in tensors:
            dist.broadcast(tensor, src=0)

    def leave(self) -> None:
        """Peers leave the DHT in close(); there is no shared store to outlive."""

    def barrier(self) -> None:
        """Only this node's ranks: peers never wait for each other outside the round barrier."""
        if self._in_node():
            dist.barrier()

    def close(self) -> None:
        """Say goodbye (peers stop awaiting this node at once), stop the averager and the DHT."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self.dht is not None:
            try:
                self._beat(left=True)
            except Exception:
                pass
        if self.averager is not None:
            self.averager.shutdown()
            self.averager = None
        if self.dht is not None:
            self.dht.shutdown()
            self.dht = None
        if dist.is_initialized():
            dist.destroy_process_group()
