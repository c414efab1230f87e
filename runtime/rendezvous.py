"""``geodiloco rendezvous``: host a run's rendezvous store (torchrun's c10d backend) on its own.

torchrun's elastic agents meet in one TCP store. When a training site hosts it
(``--is-host``), that site is the one whose failure stops the run; hosting it in a small
process of its own, on the most reliable machine (a coordinator box, the site least likely
to be preempted), lets every training site fail and come back. ``geodiloco run`` starts one
beside its emulated sites. The store holds no training state: if it is lost, restart it and
the sites with ``--resume``.
"""
from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Optional


def serve(host: str, port: int, ready_file: Optional[Path] = None) -> int:
    """Listen on host:port until SIGTERM/SIGINT; write ``ready_file`` once listening."""
    # torch's C++ warnings (a client whose hostname does not resolve, say) are no news to the person running it
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import torch.distributed as dist

    if not 1 <= port <= 65535:
        print(f"geodiloco rendezvous: error: --port {port} is not a TCP port (1-65535)", file=sys.stderr)
        return 2
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))  # only the address sites reach (torch's own store binds every interface)
        listener.listen(512)
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60),
                              master_listen_fd=listener.detach(), use_libuv=True)
    except Exception as err:  # port taken, address not on this machine
        hint = {errno.EADDRINUSE: "; another process holds that port: choose another --port",
                errno.EADDRNOTAVAIL: "; that is not an address of this machine: pass one of its addresses with "
                                     "--host, or leave --host out to listen on all of them"}.get(
            getattr(err, "errno", None), "")
        print(f"geodiloco rendezvous: error: cannot listen on {host}:{port}: {err}{hint}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print(f"[geodiloco] rendezvous store listening on {host}:{port} (Ctrl+C stops it)", flush=True)
    if host in ("0.0.0.0", ""):
        print("[geodiloco] warning: the store listens on every interface and has no authentication of its own; "
              "pass --host with the one address the sites reach (a VPN or tunnel address), see docs/security.md",
              file=sys.stderr, flush=True)
    if ready_file is not None:
        ready_file.write_text(f"{host}:{port}\n")
    stop.wait()
    del store
    return 0


DESCRIPTION = ("Host the TCP store in which every site's torchrun agent meets (c10d rendezvous). Run it on the "
               "machine most likely to stay up, then start every site with launch_site.sh --rdzv-endpoint HOST:PORT "
               "(no site passes --is-host), each run under its own --run-id.")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "rendezvous", help="host a run's rendezvous store for elastic training across sites", description=DESCRIPTION)
    add_arguments(parser)


def add_arguments(parser) -> None:
    parser.add_argument("--host", default="0.0.0.0", help="the one address to listen on: the one sites reach "
                                                           "(default: all interfaces)")
    parser.add_argument("--port", type=int, default=29400, help="TCP port (default: 29400)")
    parser.add_argument("--ready-file", type=Path, help="write HOST:PORT here once listening")
    parser.set_defaults(func=lambda args: serve(args.host, args.port, args.ready_file))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geodiloco.runtime.rendezvous", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from geodiloco.runtime.launcher_watch import exit_with_launcher
    exit_with_launcher()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
