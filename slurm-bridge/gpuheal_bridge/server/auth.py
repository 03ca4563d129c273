"""Who may talk to the bridge and what each may do: bearer tokens with scopes, and plain HTTP
only from loopback.

Tokens are named, from a file and/or an environment variable. Format (file or env, newline-
or comma-separated): ``name:token:scope,scope...``, ``name:token`` or a bare ``token`` (named
``token-N``). ``#`` starts a comment in the file. The name is what the audit log records as
*who*. A token without a scope list holds :data:`DEFAULT_SCOPES` (every scope but ``admin``:
what the operator uses, so the lines written before scopes existed keep working); within a
line, the items after ``name:token:scope`` that are scope names belong to that token (a scope
name is never a token: tokens are at least 16 characters). Every configured token
is compared with ``hmac.compare_digest`` (no early exit), so the comparison time does not
depend on which token, if any, matched. :meth:`TokenAuth.replace` swaps the whole set at once
(SIGHUP reloads the file): a request is checked against the old set or the new one, never a
mix, and nothing in flight is interrupted.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from gpuheal_bridge.api.models import DrainRequest, RequeueOptions, ResumeRequest

ENV_TOKENS = "GPUHEAL_BRIDGE_TOKENS"
MIN_TOKEN_LENGTH = 16


class Scope(StrEnum):
    """What a token may do (docs/slurm-bridge.md has the table of routes and scopes)."""

    READ = "read"  # GET a node, its jobs, a job
    DRAIN = "drain"  # drain a node; hand gpuheal's drain to the reserve pool
    RESUME = "resume"  # lift gpuheal's own drain (its incident), or a reserve pool's spare
    REQUEUE = "requeue"  # requeue (or requeuehold) jobs, alone or with a drain
    SIGNAL = "signal"  # send a job the checkpoint signal (before its requeue, or alone)
    REBOOT = "reboot"  # reboot a node through Slurm
    ADMIN = "admin"  # everything, and force: resume a drain gpuheal did not set


#: A token written without scopes (``name:token``, a bare token): every scope but ``admin``.
DEFAULT_SCOPES = frozenset(Scope) - {Scope.ADMIN}


@dataclass(frozen=True)
class Token:
    secret: str
    scopes: frozenset[Scope] = DEFAULT_SCOPES


@dataclass(frozen=True)
class Caller:
    """Who presented a valid token: its name (the audit log's *who*) and its scopes."""

    name: str
    scopes: frozenset[Scope]

    def missing(self, needed: set[Scope] | frozenset[Scope]) -> list[Scope]:
        """The scopes of ``needed`` this caller lacks (``admin`` holds them all), sorted."""
        if Scope.ADMIN in self.scopes:
            return []
        return sorted(needed - self.scopes)


def parse_scopes(name: str, text: str) -> frozenset[Scope]:
    scopes: set[Scope] = set()
    for raw in (x.strip() for x in text.split(",")):
        try:
            scopes.add(Scope(raw))
        except ValueError:
            known = ", ".join(s.value for s in Scope)
            raise ValueError(f"token {name!r}: unknown scope {raw!r} (known: {known})") from None
    return frozenset(scopes)


def _items(line: str) -> list[str]:
    """The comma-separated items of one line, a scope list kept with its token:
    ``"a:tok:drain,resume,b:tok2"`` -> ``["a:tok:drain,resume", "b:tok2"]``."""
    items: list[str] = []
    scoped = False
    for raw in (x.strip() for x in line.split("#", 1)[0].split(",")):
        if not raw:
            continue
        if scoped and ":" not in raw and len(raw) < MIN_TOKEN_LENGTH:
            items[-1] += "," + raw  # a scope of the token before (no token is this short)
            continue
        items.append(raw)
        scoped = raw.count(":") >= 2
    return items


def parse_tokens(text: str) -> dict[str, Token]:
    """``"operator:abc...\\nadmin:def...:admin"`` -> ``{"operator": Token("abc..."),
    "admin": Token("def...", {admin})}``."""
    tokens: dict[str, Token] = {}
    items = [i for line in text.splitlines() for i in _items(line)]
    for i, raw in enumerate(items):
        name, sep, rest = raw.partition(":")
        if not sep:
            name, rest = f"token-{i}", raw
        token, scoped, scope_text = rest.partition(":")
        name, token = name.strip(), token.strip()
        scopes = parse_scopes(name, scope_text) if scoped else DEFAULT_SCOPES
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(f"token {name!r} is shorter than {MIN_TOKEN_LENGTH} characters")
        if token in (t.secret for t in tokens.values()):
            raise ValueError(f"token {name!r} duplicates another token")
        tokens[name] = Token(token, scopes)
    return tokens


def load_tokens(
    token_file: str | Path | None, env: dict[str, str] | None = None
) -> dict[str, Token]:
    env = dict(os.environ) if env is None else env
    tokens: dict[str, Token] = {}
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
    def __init__(self, tokens: Mapping[str, str | Token]) -> None:
        self._tokens: list[tuple[Caller, bytes]] = []
        self.replace(tokens)

    def replace(self, tokens: Mapping[str, str | Token]) -> None:
        """Accept exactly ``tokens`` from now on (one assignment: no request sees a mix). A
        plain string is a token with :data:`DEFAULT_SCOPES`."""
        if not tokens:
            raise ValueError("no bearer tokens configured (token file or $" + ENV_TOKENS + ")")
        held = {n: t if isinstance(t, Token) else Token(t) for n, t in tokens.items()}
        self._tokens = [(Caller(n, t.scopes), t.secret.encode()) for n, t in held.items()]

    @property
    def names(self) -> list[str]:
        return [caller.name for caller, _ in self._tokens]

    def caller(self, authorization: str | None) -> Caller | None:
        """Who a valid ``Authorization: Bearer ...`` header names, with its scopes, else None."""
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return None
        candidate = presented.strip().encode()
        match: Caller | None = None
        for caller, token in self._tokens:  # the list of the moment, even if replaced meanwhile
            if hmac.compare_digest(candidate, token) and match is None:
                match = caller
        return match

    def who(self, authorization: str | None) -> str | None:
        """The token's name for a valid ``Authorization: Bearer ...`` header, else None."""
        caller = self.caller(authorization)
        return caller.name if caller else None


#: The scope each /v1 route needs, by its name (the guard checks it before the route runs).
#: A /v1 route missing here needs ``admin``: a new route is closed until it is listed.
ROUTE_SCOPES: dict[str, Scope] = {
    "get_node": Scope.READ,
    "node_jobs": Scope.READ,
    "get_job": Scope.READ,
    "capabilities": Scope.READ,
    "drain_node": Scope.DRAIN,
    "reserve_node": Scope.DRAIN,
    "resume_node": Scope.RESUME,
    "reboot_node": Scope.REBOOT,
    "requeue_job": Scope.REQUEUE,
    "signal_job": Scope.SIGNAL,
}


def route_scope(op: str) -> Scope:
    return ROUTE_SCOPES.get(op, Scope.ADMIN)


def body_scopes(body: BaseModel) -> set[Scope]:
    """What a request's body asks for beyond its route's scope: a drain that requeues needs
    ``requeue``; a checkpoint signal ``signal``; ``force`` (lifting a drain gpuheal did not
    set, or another incident's) ``admin``."""
    needed: set[Scope] = set()
    opts = body.requeue if isinstance(body, DrainRequest) else body
    if isinstance(opts, RequeueOptions):
        needed.add(Scope.REQUEUE)
        if opts.checkpoint is not None:
            needed.add(Scope.SIGNAL)
    if isinstance(body, ResumeRequest) and body.force:
        needed.add(Scope.ADMIN)
    return needed


def missing_message(caller: Caller, missing: list[Scope], what: str) -> str:
    """The 403's text: which scopes ``caller`` lacks for ``what``."""
    names = ", ".join(s.value for s in missing)
    word = "scope" if len(missing) == 1 else "scopes"
    return f"token {caller.name!r} lacks the {word} {names} needed to {what}: nothing was done"
