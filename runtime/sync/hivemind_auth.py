"""The run's shared secret on the hivemind backend (runtime/auth.py says what it protects).

``HmacAuthorizer`` plugs into hivemind's own authorization hook (``DHT(authorizer=...)``): every
DHT request carries an HMAC over its content, a fresh nonce and the sender's DHT time, and every
response an HMAC bound to that nonce. A peer without the secret cannot store a record (a forged
heartbeat), read one, or answer as a DHT node; its requests are dropped. Averaging and state
downloads are not DHT calls, so the averager (runtime/sync/hivemind_backend.py) takes part only
in groups whose peers wrote a member record, which only secret holders can.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

MAX_CLOCK_SKEW_S = 60.0
"""Requests older (or newer) than this, by the DHT clock, are refused; nonces are remembered as long."""


def make_authorizer(secret: bytes):
    """An ``AuthorizerBase`` for ``hivemind.DHT(authorizer=...)`` (hivemind imported here only)."""
    from hivemind.utils.auth import AuthorizerBase
    from hivemind.utils.timed_storage import TimedStorage, get_dht_time

    def digest(message) -> bytes:
        return hmac.new(secret, message.SerializeToString(deterministic=True), hashlib.sha256).digest()

    def signed(message, auth) -> bytes:
        auth.signature = b""
        return digest(message)

    class HmacAuthorizer(AuthorizerBase):
        def __init__(self) -> None:
            self._seen_nonces = None

        def _remember(self, nonce: bytes, now: float) -> bool:
            """False if ``nonce`` was seen already (a replayed request)."""
            if self._seen_nonces is None:
                self._seen_nonces = TimedStorage()
            if nonce in self._seen_nonces:
                return False
            self._seen_nonces.store(nonce, None, now + 2 * MAX_CLOCK_SKEW_S)
            return True

        async def sign_request(self, request, service_public_key) -> None:
            auth = request.auth
            auth.time = get_dht_time()
            auth.nonce = secrets.token_bytes(16)
            auth.signature = signed(request, auth)

        async def validate_request(self, request) -> bool:
            auth = request.auth
            received, now = auth.signature, get_dht_time()
            valid = hmac.compare_digest(signed(request, auth), received)
            auth.signature = received
            return valid and abs(now - auth.time) <= MAX_CLOCK_SKEW_S and self._remember(auth.nonce, now)

        async def sign_response(self, response, request) -> None:
            auth = response.auth
            auth.nonce = request.auth.nonce
            auth.signature = signed(response, auth)

        async def validate_response(self, response, request) -> bool:
            auth = response.auth
            received = auth.signature
            valid = hmac.compare_digest(signed(response, auth), received)
            auth.signature = received
            return valid and auth.nonce == request.auth.nonce

    return HmacAuthorizer()
