"""Peer addresses (multiaddrs) of the hivemind backend, checked where they are given: in the config before any
node starts, and from the environment when a node starts."""
from __future__ import annotations

from geodiloco.common.schema import ConfigError


def checked_multiaddrs(addrs: list[str], where: str, names_peer: bool) -> list[str]:
    """``addrs`` when each parses as a multiaddr (and, with ``names_peer``, ends in the peer's /p2p/ID, which a
    bootstrap address needs); else ConfigError naming ``where`` (a config field or environment variable).
    p2pd would refuse them only after the start wait, blaming the peers or the secret."""
    from hivemind.utils.multiaddr import Multiaddr
    from hivemind.utils.multiaddr.exceptions import Error as MultiaddrError
    shape = "/ip4/ADDRESS/tcp/PORT" + ("/p2p/PEER_ID" if names_peer else "")
    for index, addr in enumerate(addrs):
        try:
            protocols = [protocol.name for protocol in Multiaddr(addr).protocols()]
        except (MultiaddrError, ValueError) as err:
            raise ConfigError(f"{where}[{index}]: {addr!r} is not a multiaddr ({err}); write it as {shape}") from None
        if names_peer and "p2p" not in protocols:
            raise ConfigError(f"{where}[{index}]: {addr!r} names no peer; write a running peer's whole address "
                              f"({shape}: geodiloco run writes them to RUN_DIR/hivemind_peers.txt)")
    return addrs
