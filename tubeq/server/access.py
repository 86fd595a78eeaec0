"""Who may use which namespace: the access file (``--auth FILE``), read once at start.

Owns the file's format and its checks. The file is TOML::

    # A token maps to a namespace; `auth <token>` enters it. Namespaces isolate tubes: two
    # teams can each have a tube called "emails".
    [tokens]
    "4f1c0b1e9d3a4c55b8a1" = "billing"
    "9a7e52d6c1f04b2e8d33" = "emails"

    # Listeners bound to a namespace, for clients that cannot send `auth` (every existing
    # beanstalkd library): no auth on them. `port` (TCP, on the -l address) or `unix` (a path).
    [[listeners]]
    port = 11301
    namespace = "billing"

    # With --tls-client-ca: a client certificate's subject common name enters a namespace.
    [certificates]
    "worker-1.billing" = "billing"

    # Tokens that may read /metrics and nothing else (a Prometheus scraper's bearer token),
    # named for the operator: such a token enters no namespace.
    [scrapers]
    "7d0c4e2a9b1f4c6d8e3a" = "prometheus"

Rules: a namespace name is 1-64 of ``A-Za-z0-9_-``; ``default`` is the namespace of
``--prefix`` itself (so a deployment that turns auth on keeps its tubes reachable), any other
namespace ``N`` keeps its keys under ``<prefix>:N``. Tokens are at least 16 characters. Every
mistake in the file is one :class:`AccessFileError` naming the file and what is wrong; tubeq
prints it and exits.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

DEFAULT_NAMESPACE: Final = "default"
MIN_TOKEN_LENGTH: Final = 16
_NAMESPACE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


class AccessFileError(Exception):
    """The access file cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class BoundListener:
    """A listener whose connections are in ``namespace`` without ``auth``."""

    namespace: str
    port: int | None = None
    unix: Path | None = None


@dataclass(frozen=True, slots=True)
class AccessConfig:
    tokens: Mapping[str, str]  # token -> namespace
    listeners: tuple[BoundListener, ...] = ()
    certificates: Mapping[str, str] = field(default_factory=dict)  # CN -> namespace
    scrapers: Mapping[str, str] = field(default_factory=dict)  # token -> name (/metrics only)

    @property
    def namespaces(self) -> frozenset[str]:
        """Every namespace the file names."""
        return frozenset((*self.tokens.values(), *(b.namespace for b in self.listeners),
                          *self.certificates.values()))

    def namespace_of_token(self, token: str) -> str | None:
        """The namespace ``token`` enters, or None. Compares every token in constant time."""
        found = None
        given = token.encode()
        for known, namespace in self.tokens.items():
            if hmac.compare_digest(known.encode(), given):
                found = namespace
        return found

    def is_scraper(self, token: str) -> bool:
        """Whether ``token`` is a scraper's (/metrics only). Constant time, as tokens are."""
        given = token.encode()
        found = False
        for known in self.scrapers:
            found |= hmac.compare_digest(known.encode(), given)
        return found

    def namespace_of_certificate(self, common_name: str) -> str | None:
        return self.certificates.get(common_name)


def namespace_prefix(prefix: str, namespace: str) -> str:
    """The key prefix of ``namespace`` in a deployment whose ``--prefix`` is ``prefix``."""
    return prefix if namespace == DEFAULT_NAMESPACE else f"{prefix}:{namespace}"


def load(path: Path) -> AccessConfig:
    """Read and check the access file at ``path``."""
    import tomllib  # here: only --auth needs it, and every start would pay its import

    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise AccessFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AccessFileError(f"{path} is not valid TOML: {exc}") from exc
    return _parse(data, path)


def _parse(data: dict[str, Any], path: Path) -> AccessConfig:
    def fail(what: str) -> AccessFileError:
        return AccessFileError(f"{path}: {what}")

    unknown = set(data) - {"tokens", "listeners", "certificates", "scrapers"}
    if unknown:
        raise fail(f"unknown section(s) {', '.join(sorted(unknown))}")
    tokens = _names(data.get("tokens", {}), "tokens", fail)
    scrapers = _names(data.get("scrapers", {}), "scrapers", fail)
    for token in (*tokens, *scrapers):
        if len(token) < MIN_TOKEN_LENGTH:
            raise fail(f"a token must be at least {MIN_TOKEN_LENGTH} characters")
    if set(tokens) & set(scrapers):
        raise fail("a token is both in [tokens] and in [scrapers]")
    certificates = _names(data.get("certificates", {}), "certificates", fail)
    listeners = []
    raw_listeners = data.get("listeners", [])
    if not isinstance(raw_listeners, list):
        raise fail("[[listeners]] must be an array of tables")
    for entry in raw_listeners:
        if not isinstance(entry, dict) or set(entry) - {"port", "unix", "namespace"}:
            raise fail("a listener takes namespace and one of port or unix")
        namespace = _namespace(entry.get("namespace"), fail)
        port, unix = entry.get("port"), entry.get("unix")
        if (port is None) == (unix is None):
            raise fail(f"the listener of {namespace!r} needs one of port or unix")
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise fail(f"the listener of {namespace!r} has a bad port {port!r}")
        if unix is not None and not (isinstance(unix, str) and unix):
            raise fail(f"the listener of {namespace!r} has a bad unix path")
        listeners.append(BoundListener(namespace, port, Path(unix) if unix else None))
    if not tokens and not listeners and not certificates:
        raise fail("no tokens, listeners or certificates: nobody could connect")
    return AccessConfig(tokens, tuple(listeners), certificates, scrapers)


def _names(table: Any, section: str, fail: Any) -> dict[str, str]:
    if not isinstance(table, dict):
        raise fail(f"[{section}] must be a table")
    return {str(key): _namespace(value, fail) for key, value in table.items()}


def _namespace(value: Any, fail: Any) -> str:
    if not isinstance(value, str) or _NAMESPACE.fullmatch(value) is None:
        raise fail(f"bad namespace {value!r} (1-64 of A-Za-z0-9_-)")
    return value
