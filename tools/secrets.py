"""The one secrets scrubber of the tools, and an httpx guard that keeps credentials on their origin.

Every tool's secrets (``ToolOptions.secrets``: API keys, passwords, user names paired with them) go
through :func:`scrub_secrets` before any observation, error message or log line leaves the tool
layer. A secret can leak in more shapes than its plain text, so each one is removed as:

* plain text;
* URL-encoded (``quote`` and ``quote_plus``, as in a query string);
* base64, alone and as ``a:b`` for every ordered pair of secrets (an ``Authorization: Basic``
  header carries ``base64(user:password)``).

Independently of the list, these are always masked, because they are credentials by position:

* URL userinfo: ``https://user:pass@host`` -> ``https://***@host``;
* the value of an ``Authorization``/``Proxy-Authorization`` header (the scheme word is kept);
* a ``Bearer <token>``.

For tools that talk HTTP with httpx, :func:`guarded_httpx_client` (or the request hook
:class:`CredentialGuard`) makes sure credential headers are sent only to the origin they were
configured for: httpx itself drops only ``Authorization`` on a cross-origin redirect, not custom
key headers such as ``X-API-Key`` or cookies.

Example:
    >>> scrub_secrets("GET https://bob:hunter22@db.local/q?key=a%2Fb%3D", ["hunter22", "a/b="])
    'GET https://***@db.local/q?key=***'
    >>> scrub_secrets("Authorization: Basic Ym9iOmh1bnRlcjIy", [])
    'Authorization: Basic ***'
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from functools import lru_cache
from itertools import permutations
from typing import TYPE_CHECKING, Any, Iterable, Optional
from urllib.parse import quote, quote_plus

if TYPE_CHECKING:  # httpx is imported only by the functions that build clients
    import httpx

__all__ = [
    "REDACTED",
    "CREDENTIAL_HEADERS",
    "scrub_secrets",
    "secret_variants",
    "protect_logs",
    "SCRUBBED_LOGGERS",
    "CredentialGuard",
    "guarded_httpx_client",
    "guarded_httpx_async_client",
]

REDACTED = "***"

#: Header names that carry credentials and never go to another origin (lower case).
CREDENTIAL_HEADERS: tuple[str, ...] = ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key")

# scheme://userinfo@ — userinfo has no "/", "@" or whitespace.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s?#]+@")
# "Authorization: <scheme> <value>" in headers, reprs and JSON alike; the scheme word stays readable.
_AUTH_HEADER = re.compile(
    r"(?P<name>(?:proxy-)?authorization)(?P<sep>['\"]?\s*[:=]\s*['\"]?)(?:(?P<scheme>[A-Za-z]+)\s+)?[^\s'\",;]+",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\b(?P<scheme>Bearer)\s+[A-Za-z0-9\-._~+/]+=*")


def _b64(text: str) -> tuple[str, ...]:
    raw = text.encode("utf-8")
    standard = base64.b64encode(raw).decode("ascii")
    return standard, standard.rstrip("="), base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


@lru_cache(maxsize=256)
def _variants(secrets: tuple[str, ...]) -> tuple[str, ...]:
    found: set[str] = set()
    for secret in secrets:
        found.update((secret, quote(secret, safe=""), quote_plus(secret)))
        found.update(_b64(secret))
    for user, password in permutations(secrets, 2):
        found.update(_b64(f"{user}:{password}"))
    found.discard("")
    # Longest first, so a secret inside a longer variant does not leave the rest of it behind.
    return tuple(sorted(found, key=len, reverse=True))


def secret_variants(secrets: Iterable[str]) -> tuple[str, ...]:
    """Every encoded form of ``secrets`` that :func:`scrub_secrets` removes, longest first."""
    return _variants(tuple(dict.fromkeys(s for s in secrets if s)))


def scrub_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every form of every secret replaced by ``***``, and credentials by position masked.

    Args:
        text: an observation, error message or log line.
        secrets: the plain secrets (keys, passwords, and the user names paired with them).
    """
    if not text:
        return text
    for variant in secret_variants(secrets):
        text = text.replace(variant, REDACTED)
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    text = _AUTH_HEADER.sub(
        lambda m: f"{m['name']}{m['sep']}{m['scheme'] + ' ' if m['scheme'] else ''}{REDACTED}", text
    )
    return _BEARER.sub(lambda m: f"{m['scheme']} {REDACTED}", text)


# --------------------------------------------------------------------------- logs

#: Loggers of the HTTP/search clients the tools use that write URLs, query strings or headers.
SCRUBBED_LOGGERS: tuple[str, ...] = (
    "tcrag_langgraph.tools.layer",
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "elastic_transport.transport",
    "urllib3.connectionpool",
)


class _ScrubFilter(logging.Filter):
    """Rewrites each record of the logger it sits on with the registered secrets removed."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            self.secrets = self.secrets | {s for s in secrets if s}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub_secrets(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_LOG_FILTER = _ScrubFilter()
_installed: set[str] = set()
_install_lock = threading.Lock()


def protect_logs(secrets: Iterable[str], loggers: Iterable[str] = SCRUBBED_LOGGERS) -> None:
    """Scrub ``secrets`` (in every encoding) from what ``loggers`` write, for the rest of the process.

    A logger's filters see only records logged on that logger itself, so each named logger gets the
    filter (httpx, for one, logs every request URL with its userinfo and query string at INFO).
    :func:`~tcrag_langgraph.tools.layer.make_tool` calls this with each tool's secrets.
    """
    _LOG_FILTER.add(secrets)
    with _install_lock:
        for name in loggers:
            if name not in _installed:
                logging.getLogger(name).addFilter(_LOG_FILTER)
                _installed.add(name)


# --------------------------------------------------------------------------- httpx


def _origin(url: "httpx.URL") -> tuple[str, str, Optional[int]]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port or default


class CredentialGuard:
    """An httpx request hook that strips credential headers from requests to any other origin.

    httpx calls request hooks for every request it sends, redirects included, after it has copied
    the headers onto the redirected request; the guard removes :data:`CREDENTIAL_HEADERS` plus
    ``extra_headers`` there unless the request goes to one of ``origins`` (scheme, host and port).

    Use it as ``httpx.Client(event_hooks={"request": [guard]})``, or ``guard.async_hook`` for an
    ``AsyncClient``; :func:`guarded_httpx_client` does both for you.
    """

    def __init__(self, *origins: str, extra_headers: Iterable[str] = ()) -> None:
        import httpx

        if not origins:
            raise ValueError("CredentialGuard needs at least one origin the credentials belong to")
        self.origins = frozenset(_origin(httpx.URL(o)) for o in origins)
        self.headers = tuple(dict.fromkeys([*CREDENTIAL_HEADERS, *(h.lower() for h in extra_headers)]))

    def __call__(self, request: "httpx.Request") -> None:
        if _origin(request.url) in self.origins:
            return
        for name in self.headers:
            if name in request.headers:
                del request.headers[name]

    async def async_hook(self, request: "httpx.Request") -> None:
        self(request)


def _hooks(guard: Any, kwargs: dict[str, Any]) -> dict[str, list[Any]]:
    hooks = {k: list(v) for k, v in (kwargs.pop("event_hooks", None) or {}).items()}
    hooks["request"] = [guard, *hooks.get("request", [])]
    return hooks


def guarded_httpx_client(origin: str, *, extra_headers: Iterable[str] = (), **client_kwargs: Any) -> "httpx.Client":
    """An ``httpx.Client`` whose credential headers only ever reach ``origin``.

    ``client_kwargs`` go to ``httpx.Client`` (``headers=``, ``auth=``, ``timeout=``,
    ``follow_redirects=`` ...). ``extra_headers`` names further headers that carry secrets.

    Example:
        >>> with guarded_httpx_client("https://search.example", headers={"X-API-Key": "k"}) as client:
        ...     client.headers["x-api-key"]
        'k'
    """
    import httpx

    guard = CredentialGuard(origin, extra_headers=extra_headers)
    return httpx.Client(event_hooks=_hooks(guard, client_kwargs), **client_kwargs)


def guarded_httpx_async_client(
    origin: str, *, extra_headers: Iterable[str] = (), **client_kwargs: Any
) -> "httpx.AsyncClient":
    """The ``httpx.AsyncClient`` twin of :func:`guarded_httpx_client`."""
    import httpx

    guard = CredentialGuard(origin, extra_headers=extra_headers)
    return httpx.AsyncClient(event_hooks=_hooks(guard.async_hook, client_kwargs), **client_kwargs)
