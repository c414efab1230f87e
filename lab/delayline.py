"""One-way latency for an emulated site link: a userspace delay line over two TAP devices.

This kernel has no ``netem``, so ``tc`` cannot delay packets. Instead, a site's
link is a pair of TAP devices, one in the site's namespace and one in the
bridge namespace, and this process forwards every Ethernet frame from one to
the other after holding it for ``delay_ms`` milliseconds (both directions).
The delay is constant, so a FIFO per direction keeps frames in due order.

Started and stopped by :func:`lab.sites.netns_sites`; run by hand as
``python -m geodiloco.lab.delayline --a NS:IFNAME --b NS:IFNAME --delay-ms D``.
It creates both TAP devices (they vanish when it exits), prints ``ready`` on
stdout, and exits when its devices are deleted (the namespace went away), on
SIGTERM/SIGINT, or, with ``--until-stdin-eof``, when its parent closes stdin.
A pure-Python forwarder moves a few hundred Mbit/s at MTU 1500; larger MTUs
carry proportionally more.
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import select
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME_BYTES = 65536
FRAMES_PER_WAKEUP = 256
NETNS_DIR = "/run/netns"
WATCH_INTERVAL_S = 0.5
DROPPED_WRITE_ERRNOS = (errno.EAGAIN, errno.EIO, errno.ENOBUFS, errno.ENOMEM)
DEVICE_GONE_ERRNOS = (errno.EBADFD, errno.ENODEV)


@dataclass
class Direction:
    """Frames read from ``src_fd``, each due for writing to ``dst_fd`` at a monotonic time (s)."""

    src_fd: int
    dst_fd: int
    pending: deque = field(default_factory=deque)


def enter_netns(namespace: str) -> None:
    """Move this process's network context into the named namespace (``ip netns`` layout)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ns_fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    try:
        if libc.setns(ns_fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {namespace!r}: {os.strerror(err)}")
    finally:
        os.close(ns_fd)


def open_tap(ifname: str) -> int:
    """Create a TAP device named ``ifname`` in the current namespace; return its non-blocking fd."""
    tap_fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    request = struct.pack("16sH22x", ifname.encode(), IFF_TAP | IFF_NO_PI)
    fcntl.ioctl(tap_fd, TUNSETIFF, request)
    return tap_fd


def open_tap_in(namespace: str, ifname: str) -> int:
    enter_netns(namespace)
    return open_tap(ifname)


def read_frames(direction: Direction, due_s: float) -> None:
    """Queue every frame waiting on the source, each due at ``due_s``."""
    for _ in range(FRAMES_PER_WAKEUP):
        try:
            frame = os.read(direction.src_fd, MAX_FRAME_BYTES)
        except BlockingIOError:
            return
        direction.pending.append((due_s, frame))


def write_due_frames(direction: Direction, now_s: float) -> None:
    """Write the frames whose time has come.

    A full TAP queue, or a destination that is still down (EIO: the other end is
    brought up after this end, and IPv6 starts talking at once), drops the frame
    like a real link would; only a vanished device ends the line.
    """
    pending = direction.pending
    while pending and pending[0][0] <= now_s:
        _, frame = pending.popleft()
        try:
            os.write(direction.dst_fd, frame)
        except OSError as err:
            if err.errno not in DROPPED_WRITE_ERRNOS:
                raise


def next_wakeup_s(directions: list[Direction], now_s: float, longest_s: float) -> float:
    """Seconds until the earliest pending frame is due, at most ``longest_s``."""
    due = [d.pending[0][0] for d in directions if d.pending]
    if not due:
        return longest_s
    return min(longest_s, max(0.0, min(due) - now_s))


def namespaces_exist(namespaces: tuple[str, ...]) -> bool:
    """An open TAP fd keeps its namespace alive after ``ip netns del``, so watch the names instead."""
    return all(os.path.exists(os.path.join(NETNS_DIR, name)) for name in namespaces)


def forward(fd_a: int, fd_b: int, delay_s: float, stop_fd: int | None = None,
            namespaces: tuple[str, ...] = ()) -> None:
    """Forward frames both ways between two TAP fds with a constant delay until told to stop.

    Stops when ``stop_fd`` becomes readable (EOF), a TAP device is removed, or one of
    ``namespaces`` is deleted (checked every ``WATCH_INTERVAL_S``).
    """
    directions = [Direction(fd_a, fd_b), Direction(fd_b, fd_a)]
    by_fd = {d.src_fd: d for d in directions}
    watched = list(by_fd) + ([stop_fd] if stop_fd is not None else [])
    next_watch_s = time.monotonic() + WATCH_INTERVAL_S
    while True:
        readable, _, broken = select.select(
            watched, [], watched, next_wakeup_s(directions, time.monotonic(), WATCH_INTERVAL_S))
        now_s = time.monotonic()
        if broken or (stop_fd is not None and stop_fd in readable):
            return
        for ready_fd in readable:
            read_frames(by_fd[ready_fd], now_s + delay_s)
        for direction in directions:
            write_due_frames(direction, now_s)
        if now_s >= next_watch_s:
            if not namespaces_exist(namespaces):
                return
            next_watch_s = now_s + WATCH_INTERVAL_S


def parse_endpoint(text: str) -> tuple[str, str]:
    namespace, sep, ifname = text.partition(":")
    if not sep or not namespace or not ifname or len(ifname) > 15:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE:IFNAME (ifname at most 15 chars), got {text!r}")
    return namespace, ifname


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geodiloco.lab.delayline", description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=parse_endpoint, required=True, help="NAMESPACE:IFNAME of one TAP end")
    parser.add_argument("--b", type=parse_endpoint, required=True, help="NAMESPACE:IFNAME of the other TAP end")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction (ms)")
    parser.add_argument("--until-stdin-eof", action="store_true", help="exit when stdin closes (parent gone)")
    return parser


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.delay_ms < 0:
        print("delayline: --delay-ms must be >= 0", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    try:
        fd_a = open_tap_in(*args.a)
        fd_b = open_tap_in(*args.b)
    except OSError as err:
        print(f"delayline: cannot create TAP devices: {err}", file=sys.stderr)
        return 1
    print("ready", flush=True)
    stop_fd = sys.stdin.fileno() if args.until_stdin_eof else None
    try:
        forward(fd_a, fd_b, args.delay_ms / 1000.0, stop_fd, (args.a[0], args.b[0]))
    except OSError as err:
        if err.errno not in DEVICE_GONE_ERRNOS:
            raise
        print(f"delayline: TAP device gone ({err}); exiting", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
