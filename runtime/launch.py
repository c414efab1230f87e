"""``geodiloco run``: start every node of a config as a process on this machine.

One process per node (one process-group member each, gloo on CPU), either on
loopback (``--sites local``) or each in its own network namespace with links
shaped as the config's ``wan:`` says (``--sites netns``, needs root).

On the torch backend with ``comm.elastic.enabled`` (the default) each node is a
torchrun elastic agent and a rendezvous store runs beside them
(runtime/elastic_launch.py): a node that fails is left out and the others go on;
``--drill`` fails nodes on purpose (lab/drill.py). With fixed membership the
launcher, like torchrun, stops the others when one fails. Ctrl+C or SIGTERM
stops them all, and the last complete checkpoint is kept.

With ``comm.backend: hivemind`` the first node starts alone; once its DHT peer is up
it writes its multiaddrs to ``RUN_DIR/hivemind_peers.txt`` and the others start with
them as initial peers. Each node's peer listens on the one address it is reached at
here (127.0.0.1, or its site's namespace address), whatever ``host_maddrs`` says:
the config's addresses are for sites on separate machines. Each node runs in its
own session (process group) so that stopping it also stops its DHT, averager and
p2pd processes, and a node that fails does not stop the others (there is no master
to lose).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterable, Iterator, Optional

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.checkpoint import write_text_durably
from geodiloco.runtime.auth import launch_env, load_secret, rendezvous_id
from geodiloco.runtime.node_output import NodeOutput, log_path
from geodiloco.runtime.launcher_watch import launcher_env, resume_command
from geodiloco.runtime.preflight import GPU_NOTICES_ENV, check_host_memory, preflight
from geodiloco.runtime.run_dir import check_run_dir, resume_changes
from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.store_socket import STORE_FD_ENV, reserve_port
from geodiloco.runtime.heartbeat import PEER_FAILED_EXIT_CODE
from geodiloco.runtime.fatal import (FATAL_FILE_ENV, LaunchError, private_fatal_file, read_fatal,
                                     remove_fatal_file)
from geodiloco.lab.drill import DrillRunner, parse_drill
from geodiloco.lab.process_tree import descendants

STOP_GRACE_S = 15.0
PEERS_FILE = "hivemind_peers.txt"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def choose_sites(requested: str) -> tuple[str, str]:
    """Resolve ``auto`` to netns (root + namespaces work) or local; returns (mode, reason)."""
    if requested == "local":
        return "local", "requested"
    from geodiloco.lab import sites
    usable, reason = sites.can_use_netns()
    if requested == "netns" and not usable:
        raise ConfigError(f"--sites netns is not possible here: {reason}; use --sites local")
    if usable:
        return "netns", "network namespaces are available"
    return "local", f"network namespaces unavailable ({reason})"


def announce_unshaped_links(config: RunConfig, mode: str) -> None:
    """On loopback the nodes' ``wan:`` links are not shaped: say so, or the sync times look like the WAN's."""
    if mode == "local" and any(node.wan is not None for node in config.nodes):
        print("[geodiloco] the nodes' wan: links are not emulated on loopback (--sites local): the outer sync "
              "runs at this machine's speed; --sites netns (root) shapes them", flush=True)


def node_env(config: RunConfig, index: int, master_addr: str, master_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "RANK": str(index), "WORLD_SIZE": str(len(config.nodes)), "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(index), "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port), "GEODILOCO_NODE": config.nodes[index].name,
        "GEODILOCO_DEVICE": "cpu", "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1", "GEODILOCO_CPU_GROUP_OWNER": str(os.getpid()),
        GPU_NOTICES_ENV: "shown",
        # loopback, where every node of this machine talks (a netns site's env names its own interface instead):
        # otherwise gloo listens on the address the host name resolves to, often one the network reaches
        "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo",
    })
    # Inside a namespace the host name has no reverse lookup; c10d warns about it on every connect.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


class NodeLauncher:
    """Starts (and restarts) the process of each config node: ``python -m geodiloco.runtime.train`` with a fixed
    world, or, with ``comm.elastic.enabled`` on the torch backend, that node's torchrun elastic agent
    (runtime/elastic_launch.py), which starts and restarts the node's worker."""

    def __init__(self, config: RunConfig, mode: str, site_set, train_args: list[str], master_addr: str,
                 port: int, rendezvous_endpoint: Optional[str], fatal_file: Path,
                 store_socket: Optional[socket.socket] = None) -> None:
        self.config, self.mode, self.site_set = config, mode, site_set
        self.store_socket = store_socket
        self.train_args, self.master_addr, self.port = train_args, master_addr, port
        self.rendezvous_endpoint = rendezvous_endpoint
        self.peers_file = Path(train_args[train_args.index("--run-dir") + 1]) / PEERS_FILE
        self.fatal_file = fatal_file
        self.hivemind = config.comm.backend == "hivemind"
        self.secret_env = launch_env()
        self.outputs: dict[str, NodeOutput] = {}
        self._job: Optional[str] = None

    def address(self, index: int) -> str:
        return self.site_set[index].address if self.mode == "netns" else "127.0.0.1"

    def start(self, index: int, first: Optional[subprocess.Popen] = None) -> subprocess.Popen:
        config = self.config
        env = {**node_env(config, index, self.master_addr, self.port), **self.secret_env,
               FATAL_FILE_ENV: str(self.fatal_file), **launcher_env()}
        command = [sys.executable, "-m", "geodiloco.runtime.train", *self.train_args]
        if self.rendezvous_endpoint is not None:
            from geodiloco.runtime.elastic_launch import agent_command, agent_env
            command = agent_command(config, self.rendezvous_endpoint, self.address(index), self.run_name(),
                                    self.train_args)
            env = agent_env(env)
        if self.mode == "netns":
            env = self.site_set.env(index, master_port=self.port, base=env)
            command = self.site_set.command(index, command)
        if self.hivemind:
            env.update({"RANK": "0", "WORLD_SIZE": "1",
                        "GEODILOCO_HOST_MADDRS": f"/ip4/{self.address(index)}/tcp/0"})
            if index == 0:
                self.peers_file.unlink(missing_ok=True)
                env["GEODILOCO_MADDRS_FILE"] = str(self.peers_file)
            else:
                env["GEODILOCO_INITIAL_PEERS"] = ",".join(wait_for_peers(self.peers_file, first,
                                                                         config.comm.init_timeout_s))
        inherited = ()
        if index == 0 and self.store_socket is not None:
            inherited = (self.store_socket.fileno(),)
            env[STORE_FD_ENV] = str(self.store_socket.fileno())
        # its own session: a terminal's Ctrl+C reaches the launcher alone, which stops the sites in order
        # (torchrun agents hit by SIGINT directly print a traceback each and report a failed run)
        process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, errors="replace", pass_fds=inherited)
        name = config.nodes[index].name
        self.outputs[name] = NodeOutput(process, log_path(self.peers_file.parent, name))
        return process

    def run_name(self) -> str:
        """The rendezvous id: one per launch, so a new launch never takes an old one's checkpoints
        for its own (it resumes only with --resume)."""
        if self._job is None:
            name = f"geodiloco-{self.peers_file.parent.resolve().name}-{uuid.uuid4().hex[:8]}"
            self._job = rendezvous_id(load_secret(environ={**os.environ, **self.secret_env}), name)
        return self._job


@contextlib.contextmanager
def site_processes(config: RunConfig, mode: str, train_args: list[str],
                   elastic: bool = False) -> Iterator[tuple[list[subprocess.Popen], NodeLauncher]]:
    """Start one training process per node (in its namespace for netns); stop them on exit.
    ``elastic``: a rendezvous store and one torchrun elastic agent per node instead."""
    stack = contextlib.ExitStack()
    processes: list[subprocess.Popen] = []
    store_socket = None
    with stack:
        if mode == "netns":
            from geodiloco.lab import sites
            site_set = stack.enter_context(sites.netns_sites(sites.site_links(config.nodes)))
            master_addr, port = site_set.master_addr, 29500
        else:
            site_set, master_addr = None, "127.0.0.1"
            if not elastic and config.comm.backend == "torch":  # the first node serves the world's store
                store_socket = stack.enter_context(reserve_port(master_addr))
                port = store_socket.getsockname()[1]
            else:
                port = free_port()
        run_dir = Path(train_args[train_args.index("--run-dir") + 1])
        endpoint = None
        if elastic:
            from geodiloco.runtime.elastic_launch import rendezvous_store
            endpoint = stack.enter_context(rendezvous_store(site_set, master_addr, port, run_dir,
                                                            config.comm.init_timeout_s))
        fatal_file = private_fatal_file()  # away from the run directory: its disk may be the error to tell
        stack.callback(remove_fatal_file, fatal_file)
        launcher = NodeLauncher(config, mode, site_set, train_args, master_addr, port, endpoint, fatal_file,
                                store_socket)
        try:
            for index in range(len(config.nodes)):
                processes.append(launcher.start(index, processes[0] if processes else None))
            yield processes, launcher
        finally:
            workers = [pid for process in processes for pid in descendants(process.pid)] if elastic else []
            stop_processes(processes)
            for pid in workers:  # an agent stopped hard leaves its workers behind
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if launcher.hivemind:
                for process in processes:
                    kill_session(process)
            if mode == "netns":
                write_site_traffic(run_dir, sites.site_traffic(site_set))


SITE_TRAFFIC_FILE = "site_traffic.json"


def write_site_traffic(run_dir: Path, traffic: dict) -> None:
    """Bytes each emulated site's link carried during the run (measured by the kernel), so
    benchmarks can report bytes on the wire without trusting the runtime's own count."""
    if traffic and run_dir.is_dir():
        (run_dir / SITE_TRAFFIC_FILE).write_text(json.dumps(traffic, indent=1) + "\n")


def wait_for_peers(peers_file: Path, first: subprocess.Popen, timeout_s: float) -> list[str]:
    """The first hivemind node's multiaddrs, once it has written them."""
    wait_for_file(peers_file, first, timeout_s, "the first node's hivemind peer")
    return [line.strip() for line in peers_file.read_text().splitlines() if line.strip()]


def wait_for_file(path: Path, writer: subprocess.Popen, timeout_s: float, what: str) -> None:
    """Block until ``writer`` has written ``path`` (how a helper process says it is up)."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if writer.poll() is not None:
            raise LaunchError(f"{what} exited (code {writer.returncode}) before it was up; its error is above")
        if time.monotonic() > deadline:
            raise LaunchError(f"{what} did not come up within comm.init_timeout_s ({timeout_s:g} s)")
        time.sleep(0.1)


def stop_processes(processes: list[subprocess.Popen]) -> None:
    """SIGTERM the live ones, then SIGKILL whatever is left after the grace period."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        if process.poll() is None:
            process.kill()
            process.wait()


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL what is left in the process group of a node started in its own session
    (its DHT, averager and p2pd processes outlive it when it is killed)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def exit_cause(code: int) -> str:
    """A node process's exit code in words."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in {item.value for item in signal.Signals}:
        return f"killed by {signal.Signals(code - 128).name} (exit {code})"
    return {2: "exit 2: bad input, see its error above", PEER_FAILED_EXIT_CODE: f"exit {code}: it lost a peer"}.get(
        code, f"exit {code}: see its output above")


def watch(processes: list[subprocess.Popen], names: Optional[list[str]] = None,
          outputs: Optional[dict[str, NodeOutput]] = None) -> int:
    """Wait for all to finish; the first failure stops the rest and is returned. The failed node is named
    with its exit cause and the last lines of its output (``names``: the nodes of ``processes``;
    ``outputs``: their kept output by name)."""
    names = names or [f"#{index}" for index in range(len(processes))]
    while True:
        codes = [process.poll() for process in processes]
        failed = [(name, code) for name, code in zip(names, codes) if code not in (None, 0)]
        failed.sort(key=lambda item: item[1] == PEER_FAILED_EXIT_CODE)  # the cause before those that lost it
        if failed:
            name, code = failed[0]
            others = "; the other nodes were stopped" if len(processes) > 1 else ""
            print(f"[geodiloco] node {name} failed ({exit_cause(code)}){others}", file=sys.stderr, flush=True)
            print_tail(name, (outputs or {}).get(name))
            return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.2)


def watch_until_all_end(processes: list[subprocess.Popen]) -> list[int]:
    """hivemind: wait until every node has ended (one failing stops nobody), clearing what each left of its
    process group (its DHT, averager and p2pd) as it ends; their exit codes."""
    cleaned: set = set()
    while True:
        codes = [process.poll() for process in processes]
        for process, code in zip(processes, codes):
            if code is not None and process.pid not in cleaned:
                kill_session(process)
                cleaned.add(process.pid)
        if None not in codes:
            return codes
        time.sleep(0.2)


def resume_after_round(run_dir: Path, node_names: list[str]) -> Optional[int]:
    """The round (0-based) a resume of ``run_dir`` starts after: the newest round every node saved in full, else
    the committed one; None when nothing was saved."""
    from geodiloco.runtime.checkpoint import latest_round
    from geodiloco.runtime.recovery import choose_resume_point, saved_rounds
    point = choose_resume_point([saved_rounds(run_dir, name) for name in node_names], node_names)
    return point.round if point is not None else latest_round(run_dir)


def say_how_to_resume(run_dir: Path, node_names: list[str], barrier_free: bool = False) -> None:
    """After a failed or stopped run: the round a resume would start after, and the command that continues it.
    That round is read from the checkpoint files (the newest round every node saved in full, as a resume
    chooses it), not from ``latest``, which a background write moves only after the next round's exchange.
    ``barrier_free`` (async mode): each node resumes after its own phase, so no one round is named."""
    resume_after = resume_after_round(run_dir, node_names)
    if resume_after is None and not (barrier_free and checkpoint.saved_global_rounds(run_dir)):
        print(f"[geodiloco] no round was saved in {run_dir}", file=sys.stderr, flush=True)
        return
    where = ("each node continues after its own newest phase the saved global model holds" if barrier_free else
             f"a resume continues after round {resume_after + 1} (its checkpoint is complete in {run_dir})")
    print(f"[geodiloco] {where}; continue with: {resume_command(run_dir)}", file=sys.stderr, flush=True)


def print_tail(name: str, output: Optional[NodeOutput]) -> None:
    """The last lines a failed node wrote, and where the rest is."""
    if output is None:
        return
    lines = [line for line in output.tail() if line.strip()]
    shown = "\n".join(f"    {line}" for line in lines) if lines else "    (it wrote nothing)"
    print(f"[geodiloco] last lines of node {name} (all of it: {output.log_path}):\n{shown}", file=sys.stderr,
          flush=True)


LOCK_FILE = ".launcher.lock"


def hold_run_dir(run_dir: Path):
    """An exclusive lock on ``run_dir`` for this launcher (the open file holds it; the kernel drops it when the
    process ends, however it ends). A second ``geodiloco run`` into the same directory is refused before it
    touches a file there: it would rewrite config.yaml and the fatal-error file the first run's launcher watches."""
    import fcntl
    try:  # never through a link: another user's link in a shared run directory would aim it at any file
        handle = os.fdopen(os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644),
                           "a+")
    except OSError as err:
        raise ConfigError(f"--run-dir {run_dir}: cannot take its {LOCK_FILE} ({err.strerror}; a link there is "
                          "refused); remove it or choose another --run-dir") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ConfigError(f"--run-dir {run_dir}: in use by another geodiloco run ({holder}); wait for it to end, "
                          "or choose another --run-dir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def launch_local(config: RunConfig, run_dir: Path, sites: str, resume: bool, elastic: Optional[bool] = None,
                 drill: Optional[str] = None) -> int:
    """Run every node here; ``elastic`` None = ``comm.elastic.enabled`` (torch backend only);
    ``drill``: failures to inject (lab/drill.py)."""
    preflight(config)
    check_host_memory(config)
    check_run_dir(run_dir, resume)
    mode, reason = choose_sites(sites)
    if mode == "netns":
        from geodiloco.lab.sites import site_links
        site_links(config.nodes)  # a link the kernel cannot shape is refused before anything is made
    elastic = config.comm.backend == "torch" and (config.comm.elastic.enabled if elastic is None else elastic)
    resumed_after = resume_after_round(run_dir, [node.name for node in config.nodes]) if resume else None
    rounds_done = 0 if resumed_after is None else resumed_after + 1
    drill_events = parse_drill(drill, config, rounds_done) if drill is not None else []
    if drill_events and not elastic:
        raise ConfigError("--drill needs elastic membership on the torch backend (comm.elastic.enabled: true); "
                          "without it one failed site stops the run")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = hold_run_dir(run_dir)  # held until this process ends; the sites do not inherit it
    config_path = run_dir / "config.yaml"
    for change in (resume_changes(run_dir, config) if resume else []):
        print(f"[geodiloco] resuming with a changed setting: {change}", flush=True)
    write_text_durably(config_path, config.to_yaml())  # replaces a link there rather than writing through it
    train_args = ["--config", str(config_path), "--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    membership = (f"elastic (torchrun agents, at least {config.comm.min_nodes} of {len(config.nodes)} nodes)"
                  if elastic else "hivemind (whoever is alive; nodes may stop and come back)"
                  if config.comm.backend == "hivemind" else "fixed")
    print(f"[geodiloco] {len(config.nodes)} nodes on this machine, sites: {mode} ({reason}); membership: "
          f"{membership}; run directory {run_dir}", flush=True)
    announce_unshaped_links(config, mode)

    def forward_term(signum, _frame):
        raise KeyboardInterrupt

    announce_cpu_shares(config)
    announce_cpu_training()
    # the sites run in sessions of their own: a closed terminal's SIGHUP must stop them too
    previous = {signum: signal.signal(signum, forward_term) for signum in (signal.SIGTERM, signal.SIGHUP)}
    announced = False
    try:
        with site_processes(config, mode, train_args, elastic) as (processes, launcher):
            try:
                return watch_sites(config, run_dir, processes, launcher, elastic, drill_events)
            except KeyboardInterrupt:
                for output in launcher.outputs.values():
                    output.log_only()  # the sites' shutdown messages go to their logs, not over this line
                print("[geodiloco] stopping all nodes (interrupted)", file=sys.stderr, flush=True)
                announced = True
                raise
    except KeyboardInterrupt:
        if not announced:
            print("[geodiloco] stopping all nodes (interrupted)", file=sys.stderr, flush=True)
        say_how_to_resume(run_dir, [node.name for node in config.nodes], config.diloco.mode == "async")
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        from geodiloco.lab.cpu_share import cleanup_stale
        cleanup_stale(owner_pid=os.getpid())
        lock.close()


def watch_sites(config: RunConfig, run_dir: Path, processes: list[subprocess.Popen], launcher: NodeLauncher,
                elastic: bool, drill_events: list) -> int:
    """Wait for the started sites (fixed or elastic membership, drills fired on the way); the run's exit code."""
    if elastic:
        return watch_elastic_sites(config, run_dir, processes, launcher, drill_events)
    if config.comm.backend == "hivemind":
        # a failed node stops nobody: the run succeeds when comm.min_nodes of them finished it
        code = elastic_exit_code(config, watch_until_all_end(processes), launcher.outputs)
    else:
        code = watch(processes, names=[node.name for node in config.nodes], outputs=launcher.outputs)
    if code not in (0, 2):
        say_how_to_resume(run_dir, [node.name for node in config.nodes], config.diloco.mode == "async")
    return code


def watch_elastic_sites(config: RunConfig, run_dir: Path, processes: list[subprocess.Popen], launcher: NodeLauncher,
                        drill_events: list) -> int:
    """torchrun agents: every site ends by itself (drills fired on the way); a worker's bad input stops them all."""
    with DrillRunner(drill_events, processes, launcher, run_dir):
        codes = watch_all(processes, launcher.fatal_file, launcher.outputs.values())
    fatal = read_fatal(launcher.fatal_file)
    if fatal:
        print(f"geodiloco run: error: {fatal}", file=sys.stderr, flush=True)
        print("[geodiloco] stopped every site: a restart would meet the same error",
              file=sys.stderr, flush=True)
        return 2
    return elastic_exit_code(config, codes, launcher.outputs)


def watch_all(processes: list[subprocess.Popen], fatal_file: Optional[Path] = None,
              outputs: Iterable[NodeOutput] = ()) -> list[int]:
    """Elastic: wait until every site's agent has ended (one failing stops nobody); their exit codes.
    The list may change while waiting (a drill restarts a site). A worker's configuration error
    (``fatal_file``, runtime/fatal.py) stops every site at once."""
    while any(process.poll() is None for process in list(processes)):
        if fatal_file is not None and read_fatal(fatal_file):
            for output in outputs:
                output.log_only()
            stop_processes(list(processes))
            break
        time.sleep(0.2)
    return [process.returncode for process in processes]


def elastic_exit_code(config: RunConfig, codes: list[int], outputs: Optional[dict[str, NodeOutput]] = None) -> int:
    """0 when at least ``comm.min_nodes`` sites finished the run; the others are reported."""
    finished = [node.name for node, code in zip(config.nodes, codes) if code == 0]
    failed = {node.name: code for node, code in zip(config.nodes, codes) if code != 0}
    enough = len(finished) >= config.comm.min_nodes
    if failed:
        listed = ", ".join(f"{name} ({exit_cause(code)})" for name, code in failed.items())
        outcome = ("the run went on without them" if enough else
                   f"fewer than comm.min_nodes ({config.comm.min_nodes}) finished: the run failed")
        print(f"[geodiloco] sites that did not finish: {listed}; {outcome}", file=sys.stderr, flush=True)
        if not enough:
            for name in failed:
                print_tail(name, (outputs or {}).get(name))
    if enough:
        return 0
    return failed_run_status(list(failed.values()))


def failed_run_status(codes: list[int]) -> int:
    """The launcher's exit status for sites that failed with ``codes``: the first site's own error (a positive
    code), else 128 + the signal that ended the first site, as a shell reports it (a negative code, -9, became
    status 247)."""
    errors = [code for code in codes if code > 0]
    if errors:
        return errors[0]
    return 128 - codes[0] if codes else 1


def machine_gpu_count() -> int:
    """GPUs this machine's drivers report: NVML (NVIDIA), else rocm-smi (AMD). Asked of the drivers rather
    than torch, which the launcher does not otherwise import: importing it costs every launch about two
    seconds of CPU that its sites need."""
    from geodiloco.predictor.detect import nvml_gpus, rocm_smi_gpus
    nvidia, _ = nvml_gpus()
    return len(nvidia) or len(rocm_smi_gpus()[0])


def announce_cpu_training(gpu_count: Optional[int] = None) -> None:
    """On a machine with GPUs, say that the sites this launcher starts train on the CPU (they stand in for
    the config's GPUs, ``emulate:`` sets their speed), and how a site trains on its GPUs instead.
    ``gpu_count``: the GPUs this machine has (default: ask the drivers, see ``machine_gpu_count``)."""
    if gpu_count is None:
        gpu_count = machine_gpu_count()
    if gpu_count:
        print(f"[geodiloco] this machine has {gpu_count} GPU(s), but the sites `geodiloco run` starts train on the "
              "CPU: they emulate the config's GPUs on one machine. To train on GPUs, start each site with "
              "scripts/launch_site.sh (torchrun, one process per GPU); see docs/sites.md", flush=True)


def announce_cpu_shares(config: RunConfig) -> None:
    """Say which nodes run real compute under a CPU quota, or why their quota will be skipped."""
    shares = {node.name: node.emulate.cpu_share for node in config.nodes
              if node.emulate is not None and node.emulate.cpu_share is not None}
    if not shares:
        return
    from geodiloco.lab.cpu_share import can_use_cpu_share
    usable, reason = can_use_cpu_share()
    listed = ", ".join(f"{name} {share:g}" for name, share in shares.items())
    if usable:
        print(f"[geodiloco] real compute under CPU quotas (cores): {listed}; {reason}", flush=True)
        total = sum(shares.values())
        if total > (os.cpu_count() or 1) * 0.8:
            print(f"[geodiloco] note: the quotas add up to {total:g} cores of {os.cpu_count()}; nodes may get less "
                  "than their share", file=sys.stderr, flush=True)
    else:
        print(f"[geodiloco] note: emulate.cpu_share skipped ({listed}): {reason}; those nodes run unthrottled",
              file=sys.stderr, flush=True)
