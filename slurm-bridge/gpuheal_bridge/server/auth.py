"""Who may talk to the bridge: bearer tokens, and plain HTTP only from loopback.

Tokens are named, from a file and/or an environment variable. Format (file or env, newline-
or comma-separated): ``name:token`` or a bare ``token`` (named ``token-N``). ``#`` starts a
comment in the file. The name is what the audit log records as *who*. Every configured token
is compared with ``hmac.compare_digest`` (no early exit), so the comparison time does not
depend on which token, if any, matched. :meth:`TokenAuth.replace` swaps the whole set at once
(SIGHUP reloads the file): a request is checked against the old set or the new one, never a
mix, and nothing in flight is interrupted.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path

ENV_TOKENS = "GPUHEAL_BRIDGE_TOKENS"
MIN_TOKEN_LENGTH = 16


def parse_tokens(text: str) -> dict[str, str]:
    """``"operator:abc...\\nadmin:def..."`` -> ``{"operator": "abc...", "admin": "def..."}``."""
    tokens: dict[str, str] = {}
    items = [i for line in text.splitlines() for i in line.split("#", 1)[0].split(",")]
    for i, raw in enumerate(x.strip() for x in items):
        if not raw:
            continue
        name, sep, token = raw.partition(":")
        if not sep:
            name, token = f"token-{i}", raw
        name, token = name.strip(), token.strip()
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"token {name!r} is shorter than {MIN_TOKEN_LENGTH} characters")
        if token in tokens.values():
            raise ValueError(f"token {name!r} duplicates another token")
        tokens[name] = token
    return tokens


def load_tokens(token_file: str | Path | None, env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) if env is None else env
    tokens: dict[str, str] = {}
    if token_file:
        tokens.update(parse_tokens(Path(token_file).read_text()))
    if env.get(ENV_TOKENS):
        tokens.update(parse_tokens(env[ENV_TOKENS]))
    return tokens


def is_loopback(host: str | None) -> bool:
    """A loopback address (``127.0.0.0/8``, ``::1``, IPv4-mapped) or ``localhost``; a name, a
    wildcard (``0.0.0.0``) or nothing is not."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


class TokenAuth:
    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens: list[tuple[str, bytes]] = []
        self.replace(tokens)

    def replace(self, tokens: dict[str, str]) -> None:
        """Accept exactly ``tokens`` from now on (one assignment: no request sees a mix)."""
        if not tokens:
            raise ValueError("no bearer tokens configured (token file or $" + ENV_TOKENS + ")")
        self._tokens = [(name, tok.encode()) for name, tok in tokens.items()]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._tokens]

    def who(self, authorization: str | None) -> str | None:
        """The token's name for a valid ``Authorization: Bearer ...`` header, else None."""
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None
        candidate = presented.strip().encode()
        match: str | None = None
        for name, token in self._tokens:  # the list of the moment, even if replaced meanwhile
            if hmac.compare_digest(candidate, token) and match is None:
                match = name
        return match
