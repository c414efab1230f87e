"""CPU threads of trainers that share one host.

Why it matters: with ``comm.outer_device: cpu`` each node takes its outer step on the CPU (the
pseudo-gradient, the outer Nesterov step, the finite check), and every node of a run reaches that
step at the same moment, right after the all-reduce. Two trainers on one host that each keep
torch's default of one intra-op thread per core then run twice as many spinning threads as there
are cores, and the step slows by one to two orders of magnitude. Measured on an H200 host with 16
cores, two hivemind nodes sharing the GPU: the outer step took 0.5-1.0 s and the finite check
0.5-1.1 s per round; with 8 threads each, 3-40 ms and 4-7 ms (experiments/results/gpu/h200-d/).
torchrun splits the threads (``OMP_NUM_THREADS=1``) only among the ranks it starts itself, and
``geodiloco run`` does it for its emulated sites; sites started by hand on one host are not.

This module finds the other trainers on the host (``/proc``, Linux) and says what to set.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator, Optional

TRAINER_MODULE = "geodiloco.runtime.train"


def _argv(proc_dir: Path) -> list[str]:
    try:
        raw = (proc_dir / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent_pid(proc_dir: Path) -> Optional[int]:
    """The PPID field of ``/proc/PID/stat`` (after the parenthesised command name, which may hold spaces)."""
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def runs_module(argv: list[str], module: str) -> bool:
    """Whether ``argv`` is an interpreter running ``module`` (``python [-flags] -m module ...``).
    A launcher that passes the module on (``torchrun ... -m module``) does not count: the words
    before its ``-m`` are not all interpreter flags."""
    if "-m" not in argv[1:]:
        return False
    flag = argv.index("-m", 1)
    return flag + 1 < len(argv) and argv[flag + 1] == module and all(word.startswith("-") for word in argv[1:flag])


def other_trainers_on_host(proc_root: Path = Path("/proc"), own_pid: Optional[int] = None,
                           module: str = TRAINER_MODULE) -> list[int]:
    """PIDs of the other trainers on this host, one per trainer: a trainer's own child processes
    (hivemind's DHT and averager are forked from it and show the same command line) are not
    counted, nor is this process. Empty where ``/proc`` cannot be read."""
    own_pid = os.getpid() if own_pid is None else own_pid
    parents: dict[int, Optional[int]] = {}
    for entry in proc_root.iterdir() if proc_root.is_dir() else []:
        if entry.name.isdigit() and runs_module(_argv(entry), module):
            parents[int(entry.name)] = _parent_pid(entry)
    roots = [pid for pid, parent in parents.items() if parent not in parents]
    return sorted(pid for pid in roots if pid != own_pid)


def oversubscription_notice(node: str, other_trainers: int, threads: int, cpu_count: int,
                            omp_set: bool, on_cuda: bool) -> Optional[str]:
    """One line saying how to split the cores, or None: no other trainer here, the threads fit the
    cores, or ``OMP_NUM_THREADS`` is set (the user chose). ``threads``: this trainer's intra-op threads."""
    trainers = other_trainers + 1
    if other_trainers == 0 or omp_set or threads * trainers <= cpu_count:
        return None
    share = max(1, cpu_count // trainers)
    gpu_way = " or comm.outer_device: cuda (the outer state on the GPU)," if on_cuda else ""
    return (f"node {node}: {other_trainers} other trainer(s) run on this host and each uses {threads} CPU threads "
            f"on {cpu_count} cores; their outer steps run at the same moment and slow each other down many times. "
            f"Set OMP_NUM_THREADS={share} (cores / trainers) for each,{gpu_way} see docs/runtime.md "
            "\"Several nodes on one host\"")


def warn_if_oversubscribed(node: str, on_cuda: bool, outer_on_cuda: bool) -> Optional[str]:
    """Print (and return) ``oversubscription_notice`` for this process; nothing when the outer step
    runs on the GPU (``outer_on_cuda`` while training there), which needs no CPU threads."""
    if on_cuda and outer_on_cuda:
        return None
    import torch
    notice = oversubscription_notice(node, len(other_trainers_on_host()), torch.get_num_threads(),
                                     os.cpu_count() or 1, "OMP_NUM_THREADS" in os.environ, on_cuda)
    if notice is not None:
        print(f"[geodiloco] {notice}", flush=True)
    return notice


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def leader_sync_threads(local_ranks: int, own_threads: int, cores: int, trainers_on_host: int,
                        on_cuda: bool) -> int:
    """Intra-op threads for a node leader's share of the outer sync while the node's other ranks wait
    for it (``comm.sync_threads`` unset).

    torchrun gives each of a node's ranks one thread (``OMP_NUM_THREADS=1``), so the leader's outer step,
    codec and moving of the model would run on one core while the others idle. It takes its ranks'
    threads (``local_ranks`` x ``own_threads``), at most the node's share of the host's cores (its ranks
    among ``trainers_on_host``), less one core per other rank on a GPU node, whose waiting ranks may spin
    in CUDA synchronization. Never fewer than its own."""
    if local_ranks <= 1:
        return own_threads
    share = cores * local_ranks // max(trainers_on_host, local_ranks)
    spinning = local_ranks - 1 if on_cuda else 0
    return max(own_threads, min(local_ranks * own_threads, share - spinning))


def choose_leader_threads(node: str, local_ranks: int, setting: Optional[int], on_cuda: bool) -> int:
    """A node leader's threads for sync work while its ranks wait: ``comm.sync_threads`` when set, else
    ``leader_sync_threads`` for this host (reading ``/proc`` only for a multi-rank node); said once when it
    differs from the leader's own count."""
    import torch
    own = torch.get_num_threads()
    if setting is None and local_ranks == 1:
        return own
    chosen = setting
    if chosen is None:
        chosen = leader_sync_threads(local_ranks, own, usable_cores(), len(other_trainers_on_host()) + 1, on_cuda)
    if chosen != own:
        print(f"[geodiloco] node {node}: its leader takes the outer sync's host work on {chosen} CPU threads while "
              f"the node's {local_ranks} rank(s) wait for it (comm.sync_threads)", flush=True)
    return chosen


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads in this thread, then go back to the count before.
    A no-op when ``count`` is what the thread has."""
    import torch
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_creators_threads(target: Callable[..., None]) -> Callable[..., None]:
    """``target`` for a background thread, run with the intra-op thread count of the thread that creates it.
    torch gives a new thread the process-wide count at its first parallel op; this pins it at creation, so a
    thread that first computes while a node leader runs ``intra_op_threads`` with more does not keep them."""
    import torch
    count = torch.get_num_threads()

    def run(*args, **kwargs) -> None:
        torch.set_num_threads(count)
        target(*args, **kwargs)
    return run
