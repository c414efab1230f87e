"""Who may join a run: one shared secret per run, proved by every peer before any state moves.

The secret comes from ``--secret-file FILE``, ``GEODILOCO_SECRET_FILE`` or ``GEODILOCO_SECRET``
(the same value at every site); it never goes into the config, so it is never printed or
logged. ``geodiloco run`` makes a fresh one for the sites it starts.

What it protects (docs/security.md):
- the rendezvous: the store keys a run uses (and torchrun's rendezvous id) are derived from the
  secret, so a process without it never meets the run's ranks;
- the world: right after the process group forms, every rank proves it holds the secret with
  an HMAC over fresh nonces from every rank (``verify_world``); a rank that cannot is named
  and nothing else is exchanged;
- hivemind: every DHT request and response carries an HMAC (``HmacAuthorizer``), so records
  from outside (a forged heartbeat) are refused, and the averager takes part only in groups
  whose peers wrote authenticated member records.
It does not encrypt: gloo and the tensors on the wire travel in the clear (tunnel them).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets as secrets_module
from pathlib import Path
from typing import Mapping, Optional

SECRET_ENV = "GEODILOCO_SECRET"
SECRET_FILE_ENV = "GEODILOCO_SECRET_FILE"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32


class AuthError(RuntimeError):
    """This process cannot join the run: a peer did not prove the run's secret, no peer with it
    answered, or this process has no usable secret."""


def new_secret() -> str:
    """A fresh random secret (URL-safe text, 256 bits)."""
    return secrets_module.token_urlsafe(32)


def load_secret(secret_file: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Optional[bytes]:
    """The run's secret from ``secret_file``, else ``GEODILOCO_SECRET_FILE``, else ``GEODILOCO_SECRET``
    (of ``environ``, default this process's); None when none is set. Surrounding whitespace is ignored."""
    environ = os.environ if environ is None else environ
    path = secret_file or environ.get(SECRET_FILE_ENV)
    if path:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise AuthError(f"cannot read the secret file {path}: {err.strerror or err}") from None
        source = f"secret file {path}"
    else:
        text = environ.get(SECRET_ENV, "")
        if not text:
            return None
        source = SECRET_ENV
    secret = text.strip().encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise AuthError(f"the {source} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES} (for example "
                        f"`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return secret


def require_secret(secret_file: Optional[str], node_count: int) -> Optional[bytes]:
    """The secret, or an ``AuthError`` saying how to set one when a run of several nodes has none.
    A one-node run has no peer to authenticate and may run without."""
    secret = load_secret(secret_file)
    if secret is None and node_count > 1:
        raise AuthError(f"no shared secret for this run: set {SECRET_ENV} (the same value at every site) or pass "
                        f"--secret-file FILE; `geodiloco run` makes one for the sites it starts (docs/security.md)")
    return secret


def derived_id(secret: Optional[bytes], purpose: str, name: str, length: int = 16) -> str:
    """A name for ``purpose`` that only holders of the secret can compute (hex; ``name`` itself
    when there is no secret)."""
    if secret is None:
        return name
    return hmac.new(secret, f"{purpose}:{name}".encode(), hashlib.sha256).hexdigest()[:length]


def rendezvous_id(secret: Optional[bytes], name: str) -> str:
    """torchrun's ``--rdzv-id`` for run ``name``: agents without the secret meet in another rendezvous."""
    return f"{name}-{derived_id(secret, 'rendezvous', name)}" if secret is not None else name


def launch_env() -> dict[str, str]:
    """What the sites a launcher starts on this machine need: the secret already set here, or a
    fresh one (in ``GEODILOCO_SECRET``; it lives only in the children's environment)."""
    if os.environ.get(SECRET_FILE_ENV) or os.environ.get(SECRET_ENV):
        return {}
    return {SECRET_ENV: new_secret()}


def proof(secret: bytes, rank: int, transcript: bytes) -> bytes:
    """Rank ``rank``'s HMAC over every rank's nonce (bound to the rank, so it cannot be replayed
    by another rank or in another world)."""
    return hmac.new(secret, b"geodiloco-world:" + rank.to_bytes(4, "big") + transcript, hashlib.sha256).digest()


def failed_ranks(secret: bytes, nonces: list[bytes], proofs: list[bytes]) -> list[int]:
    """Ranks whose proof does not match the secret."""
    transcript = b"".join(nonces)
    return [rank for rank, received in enumerate(proofs)
            if not hmac.compare_digest(proof(secret, rank, transcript), received)]


def verify_world(secret: Optional[bytes], group=None) -> None:
    """Every rank of ``group`` (default: the world) proves the secret to every other; raises
    ``AuthError`` naming the ranks that could not, after every rank has left ``group``.
    Runs before any state is exchanged."""
    if secret is None:
        return
    import torch
    import torch.distributed as dist

    world_size = dist.get_world_size(group)
    if world_size < 2:
        return
    rank = dist.get_rank(group)

    def gather(payload: bytes) -> list[bytes]:
        received = [torch.zeros(len(payload), dtype=torch.uint8) for _ in range(world_size)]
        dist.all_gather(received, torch.frombuffer(bytearray(payload), dtype=torch.uint8), group=group)
        return [bytes(item.numpy().tobytes()) for item in received]

    nonces = gather(secrets_module.token_bytes(NONCE_BYTES))
    proofs = gather(proof(secret, rank, b"".join(nonces)))
    failed = failed_ranks(secret, nonces, proofs)
    if failed:
        # every rank reaches this same verdict: leave the group together, so no rank exits while its
        # peers' gloo threads still run (that aborts them with SIGABRT instead of a clear exit)
        dist.barrier(group=group)
        dist.destroy_process_group(group)
        raise AuthError(f"rank(s) {', '.join(map(str, failed))} of this world did not prove the run's shared "
                        f"secret; nothing was exchanged with them. Every site must use the same {SECRET_ENV} "
                        "(or --secret-file); a process you did not start reached the rendezvous")


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m geodiloco.runtime.auth rendezvous-id NAME``: the torchrun ``--rdzv-id`` for run
    NAME under this secret (scripts/launch_site.sh uses it); ``new``: print a fresh secret."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m geodiloco.runtime.auth",
                                     description="Shared-secret helpers of a GeoDiLoCo run (docs/security.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    rendezvous = commands.add_parser("rendezvous-id", help="torchrun --rdzv-id derived from the run's secret")
    rendezvous.add_argument("name", help="the run id every site passes (launch_site.sh --run-id)")
    rendezvous.add_argument("--secret-file", help=f"file holding the secret (default: {SECRET_FILE_ENV} or {SECRET_ENV})")
    commands.add_parser("new", help="print a fresh random secret")
    args = parser.parse_args(argv)
    if args.command == "new":
        print(new_secret())
        return 0
    try:
        secret = require_secret(args.secret_file, node_count=2)
    except AuthError as err:
        print(f"geodiloco auth: error: {err}", file=sys.stderr)
        return 2
    print(rendezvous_id(secret, args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
