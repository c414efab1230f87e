"""One site's elastic agent: torchrun's (``torch.distributed.run``), with its failures told in one line.

torchrun ends every failure of its own with a Python traceback (often with C++ frames) and restarts a
worker that stopped on bad input as if it had crashed. Sites run this module instead, with torchrun's
own arguments (``scripts/launch_site.sh``, ``runtime/elastic_launch.py``):

- a worker that stops on bad input (a ``ConfigError``: a setting that differs from the running sites', a
  secret too short; a ``CannotStart``: a run directory that holds a checkpoint without ``--resume``) writes
  its message to ``GEODILOCO_FATAL_FILE`` and signals its agent (``GEODILOCO_AGENT_PID``), which stops this
  site at once, without restarting its workers and without closing the rendezvous, so that sites whose
  settings are the run's go on (``stop_own_agent``);
- the rendezvous errors a user meets (the run already ended, its store is gone, no world formed in
  time) and a worker group out of restarts become one line naming the endpoint, the run id and what to
  do, with exit codes: 2 bad input, 1 any other failure, 128 + N a signal N.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from geodiloco.runtime.fatal import FATAL_FILE_ENV, private_fatal_file, read_fatal, remove_fatal_file
from geodiloco.runtime.recovery import AGENT_STARTED_ENV

AGENT_PID_ENV = "GEODILOCO_AGENT_PID"
LEAVE_SIGNAL_ENV = "GEODILOCO_AGENT_LEAVE_SIGNAL"
LEAVE_SIGNAL = signal.SIGUSR2
"""What a worker that stopped on bad input sends its agent; torchrun's agent takes it as a death signal
(``--signals-to-handle``), and it tells that stop apart from a user's SIGTERM or Ctrl+C. A torchrun without
that option (torch < 2.5) handles SIGTERM only: then SIGTERM is sent, and the fatal file tells them apart."""
AGENT_DEATH_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
QUIET_ENV = {"TORCH_SHOW_CPP_STACKTRACES": "0", "TORCH_CPP_LOG_LEVEL": "ERROR", "LOGLEVEL": "WARNING"}
"""No C++ frames in torch's error messages nor its C++ warnings (a lost store logs one per call, with frames);
torchrun's own INFO lines off. A value the user set wins."""


def stop_own_agent(environ=os.environ) -> bool:
    """From a worker that stopped on bad input: stop its site's agent (this module) so the worker is not
    restarted. The agent takes ``LEAVE_SIGNAL`` as a death signal: it stops its workers and leaves the
    rendezvous open, as a site that died would, so the other sites form a world without this one. Returns whether
    an agent was signalled (False outside this module's agent, e.g. under a bare torchrun)."""
    pid, signum = environ.get(AGENT_PID_ENV, ""), environ.get(LEAVE_SIGNAL_ENV, "")
    if not (pid.isdigit() and signum.isdigit()):
        return False
    try:
        os.kill(int(pid), int(signum))
    except OSError:
        return False
    return True


class TorchrunLog(logging.Handler):
    """torchrun's log, told the user's way. Its rendezvous: one line when this site is put on the spare
    list (the run under this id already has every place taken: torchrun then waits, silently, until a
    place frees up or that run ends); the tracebacks of failures it recovers from dropped. Its workers: a
    worker killed by a signal (the kernel's OOM killer, say) named in one line; a worker that exited with
    a code has said why itself. Its other errors as they are; its warnings (a restart narrated) dropped."""

    SPARE_MARK = "added itself to the redundancy list"
    JOINED_MARK = "has joined round"
    WORKER_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
    LOGGERS = ("torch.distributed.elastic.rendezvous", "torch.distributed.elastic.agent.server.api",
               "torch.distributed.elastic.multiprocessing.api")

    def __init__(self, site: str, run: str) -> None:
        super().__init__(logging.DEBUG)
        self.site, self.run = site, run
        self.waited_as_spare = False
        self.joined = False
        """Whether this agent ever met the store and joined a world (else a store error means it never got there)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.JOINED_MARK in message:
            self.joined = True
        elif self.SPARE_MARK in message:
            if not self.waited_as_spare:
                self.waited_as_spare = True
                print(f"[geodiloco] site {self.site}: the {self.run} already has every place taken (--nnodes): this "
                      "site waits as a spare until a site of it fails or it ends; if this is another run, stop it "
                      "and give it its own --run-id", file=sys.stderr, flush=True)
        elif record.levelno >= logging.ERROR:
            exited = self.WORKER_EXIT.search(message)
            if exited is None:
                print(f"[torchrun] {message}", file=sys.stderr, flush=True)
            elif int(exited.group(1)) < 0:
                killer = signal.Signals(-int(exited.group(1)))
                who = " (the kernel's out-of-memory killer, or a kill -9)" if killer == signal.SIGKILL else ""
                print(f"[geodiloco] site {self.site}: the worker of local rank {exited.group(2)} was killed by "
                      f"{killer.name}{who}; its agent restarts it while --max-restarts allows", file=sys.stderr,
                      flush=True)

    @classmethod
    def install(cls, site: str, run: str) -> "TorchrunLog":
        handler = cls(site, run)
        for logger_name in cls.LOGGERS:
            logger = logging.getLogger(logger_name)
            logger.handlers.clear()
            logger.setLevel(logging.DEBUG if logger_name.endswith("rendezvous") else logging.ERROR)
            logger.propagate = False
            logger.addHandler(handler)
        # the spare and joined notices are its debug and info lines; they reach the handler above
        spare_log = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
        spare_log.handlers.clear()
        spare_log.setLevel(logging.DEBUG)
        return handler


UNREACHABLE_NOTICE_S = 10.0
"""How long a site tries the rendezvous endpoint before it says that nothing answers there: torchrun itself
retries for minutes (72-147 s measured) before it gives up, in silence."""


def watch_the_endpoint(args, site: str, notices: "TorchrunLog", after_s: float = UNREACHABLE_NOTICE_S,
                       poll_s: float = 1.0) -> Optional[threading.Thread]:
    """Try to connect to the rendezvous endpoint now and then until it answers or this site joins; if it has
    not answered after ``after_s``, say so once (torchrun goes on trying: a store started late is still met).
    None on the site that hosts the store (``is_host=true``: its agent starts it)."""
    if "is_host=true" in (args.rdzv_conf or "").replace(" ", "").lower() or not args.rdzv_endpoint:
        return None
    host, _, port = args.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit():
        return None

    def watch() -> None:
        started = time.monotonic()
        while not notices.joined:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=min(poll_s * 2, 5.0)).close()
                return
            except OSError as err:
                reason = err.strerror or type(err).__name__
            if time.monotonic() - started >= after_s:
                print(f"[geodiloco] site {site}: nothing answers at {args.rdzv_endpoint} after {after_s:g} s "
                      f"({reason.lower()}): check --rdzv-endpoint, and that `geodiloco rendezvous` (or the --is-host "
                      "site) runs there; torchrun keeps trying for a few minutes", file=sys.stderr, flush=True)
                return
            time.sleep(poll_s)

    thread = threading.Thread(target=watch, name="geodiloco-endpoint-watch", daemon=True)
    thread.start()
    return thread


def run_label(args) -> str:
    """The run a site's agent meets, from torchrun's parsed arguments (``--rdzv-id``, ``--rdzv-endpoint``)."""
    return f"run {args.rdzv_id} at {args.rdzv_endpoint}"


def describe_failure(err: BaseException, args, site: str, fatal: Optional[str],
                     waited_as_spare: bool = False, joined: bool = True) -> tuple[str, int]:
    """(one line, exit code) for an exception out of torchrun's ``run`` on ``site``, started with torchrun's
    parsed ``args``; re-raises any other exception."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                          RendezvousStateError, RendezvousTimeoutError)
    run = run_label(args)
    continue_with = (launcher_continue_hint(args)
                     or "start every site with its command plus --resume and a new --run-id")
    if waited_as_spare and isinstance(err, AttributeError):
        # torchrun's agent returns no result when a spare's rendezvous closes (the run it waited on ended)
        return (f"site {site} waited as a spare and the {run} has ended without it; nothing was trained here: "
                "start a new run with its own --run-id", 1)
    if isinstance(err, SignalException):
        if err.sigval == LEAVE_SIGNAL or (fatal and err.sigval == signal.SIGTERM):
            return (f"site {site} stopped on bad input or a full disk (its error is above) and was not restarted: "
                    "a restart would meet it again; fix it and start this site again", 2)
        return f"site {site} stopped by {err.sigval.name}", 128 + int(err.sigval)
    if isinstance(err, ChildFailedError):
        exit_codes = ", ".join(map(str, sorted({failure.exitcode for failure in err.failures.values()})))
        how = ("the run has fixed membership (--fixed, or comm.elastic.enabled: false), so they are not restarted"
               if args.max_restarts == 0 else "used up their restarts (--max-restarts)")
        return (f"site {site}: its workers failed (exit code {exit_codes}) and {how}; their own error is above; "
                f"to continue from the last complete checkpoint, {continue_with}", 1)
    if isinstance(err, RendezvousClosedError):
        return (f"site {site}: the {run} has ended (its rendezvous is closed), and a closed run is not joined "
                f"again: if it finished, there is nothing left to do; to continue a stopped one, {continue_with}; "
                "for a new run, give it a new --run-id", 1)
    if isinstance(err, RendezvousTimeoutError):
        return (f"site {site}: no world formed for the {run} within the join timeout (comm.elastic.join_timeout_s): "
                "fewer sites than comm.min_nodes joined, or a running run already holds every place under this run "
                "ID (give this run its own: launch_site.sh --run-id)", 1)
    store_error = isinstance(err, (RendezvousConnectionError, RendezvousStateError)) or _store_lost(err)
    if store_error and not joined:
        return (f"site {site}: cannot reach the rendezvous store at {args.rdzv_endpoint} (nothing listens there, or this site "
                "cannot reach that address): start `geodiloco rendezvous` there (or the --is-host site) first, or "
                "correct --rdzv-endpoint", 1)
    if store_error:
        return (f"site {site}: lost the rendezvous store of the {run} (the `geodiloco rendezvous` process or the "
                "--is-host site stopped, or the address is unreachable): restart it, then every site with --resume; "
                "the last committed checkpoint is kept", 1)
    raise err


def launcher_continue_hint(args) -> Optional[str]:
    """``run geodiloco run --resume --run-dir RUN_DIR`` when ``geodiloco run`` started this agent, else None (its
    workers' ``--run-dir`` is read from the training script's arguments)."""
    from geodiloco.runtime.launcher_watch import launcher_resume_command
    script_args = list(getattr(args, "training_script_args", None) or [])
    if "--run-dir" not in script_args[:-1]:
        return None
    command = launcher_resume_command(script_args[script_args.index("--run-dir") + 1])
    return f"run {command}" if command else None


def _store_lost(err: BaseException) -> bool:
    import torch.distributed as dist
    return isinstance(err, (dist.DistNetworkError, dist.DistStoreError, ConnectionError))


def prepare_environment(leave_signal: signal.Signals, environ=os.environ) -> tuple[Path, bool]:
    """Set what the workers read: this agent's pid and the signal that stops it, a fatal-error file (kept when
    ``geodiloco run`` already chose one). Returns the fatal-error file and whether this agent chose it."""
    environ[AGENT_PID_ENV] = str(os.getpid())
    environ[LEAVE_SIGNAL_ENV] = str(int(leave_signal))
    if environ.get(FATAL_FILE_ENV):
        return Path(environ[FATAL_FILE_ENV]), False
    path = private_fatal_file()  # a worker creates it (exclusively) when it stops on bad input or a full disk
    environ[FATAL_FILE_ENV] = str(path)
    return path, True


def tell_workers_the_rendezvous(args, environ=os.environ) -> None:
    """The rendezvous store's endpoint and the run id, for a worker that stops before its world forms to
    tell that world's other workers why (``runtime/stop_notice.py``); only a c10d store can hold the notice."""
    from geodiloco.runtime.stop_notice import RENDEZVOUS_ENDPOINT_ENV, RUN_ID_ENV
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        environ[RENDEZVOUS_ENDPOINT_ENV] = args.rdzv_endpoint
        environ[RUN_ID_ENV] = args.rdzv_id


def with_leave_signal(argv: list[str], parser) -> tuple[list[str], signal.Signals]:
    """torchrun's arguments with ``LEAVE_SIGNAL`` among the signals its agent handles, and the signal a worker
    sends to stop it (SIGTERM where this torchrun cannot be told more, or the user chose the signals)."""
    options = {option for action in parser._actions for option in action.option_strings}
    if "--signals-to-handle" not in options or any(arg.startswith(("--signals-to-handle", "--signals_to_handle"))
                                                   for arg in argv):
        return argv, signal.SIGTERM
    return [f"--signals-to-handle={AGENT_DEATH_SIGNALS}", *argv], LEAVE_SIGNAL


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m geodiloco.runtime.agent TORCHRUN_ARGS...\n\n" + __doc__.strip())
        return 0
    os.environ[AGENT_STARTED_ENV] = repr(time.time())  # a site that rejoins counts its wait from here
    from geodiloco.runtime.launcher_watch import LAUNCHER_PID_ENV, exit_with_launcher
    exit_with_launcher()
    for key, value in QUIET_ENV.items():  # read when torch loads
        os.environ.setdefault(key, value)
    workers_cpp_level = os.environ["TORCH_CPP_LOG_LEVEL"]
    if workers_cpp_level == QUIET_ENV["TORCH_CPP_LOG_LEVEL"]:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"  # the agent's C++ errors are its store's: told in one line here
    from torch.distributed import run as torchrun
    os.environ["TORCH_CPP_LOG_LEVEL"] = workers_cpp_level
    argv, leave_signal = with_leave_signal(argv, torchrun.get_args_parser())
    fatal_file, own_fatal_file = prepare_environment(leave_signal)
    site = os.environ.get("GEODILOCO_NODE", "?")
    args = torchrun.parse_args(argv)
    tell_workers_the_rendezvous(args)
    notices = TorchrunLog.install(site, run_label(args))
    watch_the_endpoint(args, site, notices)
    try:
        torchrun.run(args)
    except Exception as err:  # a torchrun failure: told in one line (others re-raised by describe_failure)
        line, exit_code = describe_failure(err, args, site, read_fatal(fatal_file), notices.waited_as_spare,
                                           notices.joined)
        if not (exit_code == 2 and os.environ.get(LAUNCHER_PID_ENV)):  # `geodiloco run` says it once for every site
            print(f"[geodiloco] {line}", file=sys.stderr, flush=True)
        return exit_code
    finally:
        if own_fatal_file:
            remove_fatal_file(fatal_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
