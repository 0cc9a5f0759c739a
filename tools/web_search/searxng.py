"""WEB_SEARCH over a SearxNG-compatible JSON search API (``httpx``), with an optional API key."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import httpx

from ..layer import ToolFailure
from ..secrets import guarded_httpx_async_client, guarded_httpx_client
from .provider import Result

__all__ = ["SearxngProvider"]


class SearxngProvider:
    """A SearxNG-compatible JSON search API (``GET {base_url}/search?q=...&format=json``).

    Failures raise :class:`ToolFailure`: connection refused / 5xx / 429 are retryable
    (``unavailable``), client timeouts are ``timeout``, other 4xx are not retried, and a body that
    is not the expected JSON is ``bad_response``. The API key travels in a header only, to
    ``base_url``'s origin only (a redirect elsewhere is followed without it, see
    :func:`~tcrag_langgraph.tools.secrets.guarded_httpx_client`), and is kept out of ``repr`` and
    every message; :attr:`secrets` hands it to the tool layer's scrubber.

    Example:
        >>> p = SearxngProvider("http://127.0.0.1:8888", api_key="secret")
        >>> "secret" in repr(p)
        False
    """

    name = "searxng"
    #: A metasearch server forwards every query to outside search engines: record text must not reach
    #: it unless the operator allows (the tool layer's egress rule, ``ToolOptions.allow_record_egress``).
    sends_off_machine = True

    def __init__(
        self,
        base_url: str,
        *,
        api_key: Optional[str] = None,
        api_key_header: str = "Authorization",
        api_key_prefix: str = "Bearer ",
        timeout_s: float = 10.0,
        extra_params: Optional[dict[str, str]] = None,
    ) -> None:
        if not re.match(r"^https?://", base_url or ""):
            raise ValueError("base_url must start with http:// or https://")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key or None
        self._headers = {"Accept": "application/json"}
        self._api_key_header = api_key_header
        if self._api_key:
            self._headers[api_key_header] = f"{api_key_prefix}{self._api_key}"
        self.timeout_s = timeout_s
        self.extra_params = dict(extra_params or {})

    def __repr__(self) -> str:
        return f"SearxngProvider(base_url={self.base_url!r}, api_key={'***' if self._api_key else None})"

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,) if self._api_key else ()

    def _client_options(self) -> dict[str, Any]:
        # redirects are followed, but the key header only ever goes to base_url's origin
        return {"timeout": self.timeout_s, "follow_redirects": True, "max_redirects": 5}

    def _request(self, query: str) -> dict[str, Any]:
        return {
            "url": f"{self.base_url}/search",
            "params": {"q": query, "format": "json", **self.extra_params},
            "headers": self._headers,
        }

    def _parse(self, response: httpx.Response, k: int) -> list[Result]:
        status = response.status_code
        if status >= 500 or status == 429:
            raise ToolFailure("unavailable", f"search server answered HTTP {status}", retryable=True)
        if status in (401, 403):
            raise ToolFailure("unavailable", f"search server refused the request (HTTP {status}); check the API key")
        if status >= 400:
            raise ToolFailure("unavailable", f"search server answered HTTP {status}")
        try:
            payload = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ToolFailure("bad_response", "search server did not return JSON") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("results"), list):
            raise ToolFailure("bad_response", "search server JSON has no 'results' list")
        results = []
        for item in payload["results"]:
            if not isinstance(item, dict):
                continue
            title, url = item.get("title"), item.get("url")
            snippet = item.get("content") or item.get("snippet") or ""
            if not isinstance(title, str) or not isinstance(url, str) or not isinstance(snippet, str):
                continue
            if title.strip() or snippet.strip():
                results.append(Result(title=title.strip(), url=url.strip(), snippet=snippet.strip()))
            if len(results) >= k:
                break
        return results

    @staticmethod
    def _transport_failure(exc: httpx.HTTPError) -> ToolFailure:
        if isinstance(exc, httpx.TimeoutException):
            return ToolFailure("timeout", "search server did not answer in time", retryable=True)
        if isinstance(exc, httpx.ConnectError):
            return ToolFailure("unavailable", "cannot connect to the search server", retryable=True)
        return ToolFailure("unavailable", f"search request failed ({type(exc).__name__})", retryable=True)

    def search(self, query: str, k: int) -> list[Result]:
        try:
            with guarded_httpx_client(self.base_url, extra_headers=(self._api_key_header,), **self._client_options()) as client:
                response = client.get(**self._request(query))
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from None
        return self._parse(response, k)

    async def asearch(self, query: str, k: int) -> list[Result]:
        try:
            async with guarded_httpx_async_client(
                self.base_url, extra_headers=(self._api_key_header,), **self._client_options()
            ) as client:
                response = await client.get(**self._request(query))
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from None
        return self._parse(response, k)
