"""State values from a served model: prompt log-probs from an OpenAI-compatible ``/v1/completions``.

vLLM and SGLang answer ``{"prompt": P, "echo": true, "logprobs": 0, "max_tokens": 0}`` with the
log-probability of every prompt token (``choices[0].logprobs.tokens / token_logprobs /
text_offset``, the first log-prob ``null`` because nothing predicts the first token). That is
what eq. 2 needs: the prompt is ``start_text + query + "\\n" + text`` (the layout
:class:`~tcrag_langgraph.monitor.scoring.LocalLMScorer` scores) and the text's tokens are picked by their
character offsets.

* cppl (eq. 2) is exact: the mean log-prob of the text's tokens given the query.
* uct (eq. 3) as this package defines it (see :mod:`tcrag_langgraph.monitor.scoring`) sums
  ``-P(w_i) log P(w_i)`` over the tokens actually written, so it needs only their log-probs, not
  the full next-token distribution: it is computed exactly too (prompt ``start_text + text``,
  or with the query when ``uct_given_query=True``). The full-distribution entropy is NOT
  available remotely (servers return top-k only) and is not attempted.

Trust: a server's prompt log-probs are only as right as its implementation. llama-cpp-python
0.3.36 returns wrong ones (docs/models.md), which is why :func:`~tcrag_langgraph.monitor.own_model.scorer_for_model`
never picks this scorer by itself: pass it as ``scorer=`` after checking your server against a
direct computation (tests/test_remote_scorer.py shows how).

Start token: eq. 2 scores every text token, so something must precede the first one. With a query
the query does; for uct without the query the prompt is ``start_text + text``. Servers that add a
BOS token themselves (Llama, Mistral, Gemma tokenizers) need nothing; for models without one
(Qwen, SmolLM2) set ``start_text`` to a special token the server parses, e.g. ``"<|endoftext|>"``
(match what :class:`LocalLMScorer` uses: the tokenizer's BOS, else EOS). A missing log-prob for a
text token is an error that says so.

Example:
    >>> scorer = CompletionsLogprobScorer("http://127.0.0.1:8000/v1", model="Qwen/Qwen2.5-0.5B-Instruct")  # doctest: +SKIP
    >>> scorer.score("What treats scurvy?", "Vitamin C treats scurvy.", metric="cppl")  # doctest: +SKIP
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional

import httpx

from .state_values import LogprobScorer

__all__ = ["CompletionsLogprobScorer", "RemoteScorerError"]


class RemoteScorerError(RuntimeError):
    """The completions endpoint could not give the log-probs a state value needs (with why)."""


class CompletionsLogprobScorer(LogprobScorer):
    """cppl / uct from an OpenAI-compatible completions endpoint that echoes prompt log-probs.

    Args:
        base_url: the API root, as for the OpenAI client, e.g. ``"http://127.0.0.1:8000/v1"``
            (``/completions`` is appended).
        model: the served model name (the request's ``model`` field).
        api_key: sent as ``Authorization: Bearer``; never appears in errors or logs.
        start_text: text put before the scored prompt (see the module docstring); ``""`` default.
        uct_given_query: condition uct on the query too (the paper does not).
        timeout_s: connect/read timeout of one request.
        max_tokens: the request's ``max_tokens``; 0 (default) as vLLM allows with ``echo``. Only
            prompt tokens are ever scored, so a server that insists on >= 1 can take 1.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: Optional[str] = None,
        start_text: str = "",
        uct_given_query: bool = False,
        timeout_s: float = 30.0,
        max_tokens: int = 0,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, not {base_url!r}")
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model must name the served model")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 600):
            raise ValueError("timeout_s must be in (0, 600]")
        if not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError("max_tokens must be an integer >= 0")
        if not isinstance(start_text, str):
            raise ValueError("start_text must be a string")
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.start_text = start_text
        self.uct_given_query = uct_given_query
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: Optional[httpx.Client] = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:  # no api_key here
        return f"CompletionsLogprobScorer({self.url!r}, model={self.model!r})"

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def token_logprobs(self, context: str, text: str) -> list[float]:
        """log P of each token of ``text`` given ``start_text + context + "\\n"`` (or ``start_text``
        alone when ``context`` is empty), as the server computes them."""
        if not text:
            raise ValueError("nothing to score: the text is empty")
        prompt = self.start_text + (context + "\n" if context else "") + text
        body = self._post({
            "model": self.model, "prompt": prompt, "echo": True, "logprobs": 0,
            "max_tokens": self.max_tokens, "temperature": 0.0,
        })
        tokens, logprobs, offsets = _parse_logprobs(body)
        return _text_logprobs(prompt, text, tokens, logprobs, offsets)

    def _http(self) -> httpx.Client:
        with self._client_lock:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), headers=self._headers)
            return self._client

    def _post(self, payload: dict[str, Any]) -> Any:
        try:
            response = self._http().post(self.url, json=payload)
        except httpx.TimeoutException as exc:
            raise RemoteScorerError(f"{self.url} did not answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise RemoteScorerError(f"cannot reach {self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            detail = response.text[:300].replace("\n", " ")
            raise RemoteScorerError(f"{self.url} answered HTTP {response.status_code}: {detail}")
        try:
            return response.json()
        except ValueError:
            raise RemoteScorerError(f"{self.url} did not answer JSON: {response.text[:200]!r}") from None


def _parse_logprobs(body: Any) -> tuple[list[str], list[Optional[float]], list[int]]:
    """``tokens``, ``token_logprobs`` and ``text_offset`` of ``choices[0].logprobs``, checked."""
    try:
        logprobs = body["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        raise RemoteScorerError(
            "the completions response has no choices[0].logprobs: the server does not return prompt "
            "log-probs with echo (vLLM and SGLang do)"
        ) from None
    if not isinstance(logprobs, dict):
        raise RemoteScorerError("choices[0].logprobs is null: the server ignored logprobs/echo")
    tokens, values, offsets = (logprobs.get(k) for k in ("tokens", "token_logprobs", "text_offset"))
    if not all(isinstance(x, list) for x in (tokens, values, offsets)):
        raise RemoteScorerError(
            "choices[0].logprobs needs the lists tokens, token_logprobs and text_offset "
            "(the OpenAI completions log-probs schema)"
        )
    if not (len(tokens) == len(values) == len(offsets)) or not tokens:
        raise RemoteScorerError(
            f"choices[0].logprobs lists differ in length or are empty "
            f"(tokens {len(tokens)}, token_logprobs {len(values)}, text_offset {len(offsets)})"
        )
    if not all(isinstance(t, str) for t in tokens) or not all(
        isinstance(o, int) and not isinstance(o, bool) for o in offsets
    ):
        raise RemoteScorerError("choices[0].logprobs: tokens must be strings and text_offset integers")
    for v in values:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v > 1e-6):
            raise RemoteScorerError(f"choices[0].logprobs.token_logprobs holds {v!r}, not a log-probability")
    return tokens, values, offsets


def _text_logprobs(prompt: str, text: str, tokens: list[str], values: list[Optional[float]],
                   offsets: list[int]) -> list[float]:
    """The log-probs of the tokens that make up ``text`` at the end of ``prompt``.

    The echoed tokens may start with special tokens the server added (a BOS), so the prompt is
    found in the tokens' concatenation; ``text_offset`` must be the running length of the token
    strings (as vLLM reports it). The text must start exactly at a token boundary: a token spanning
    query and text would make the value a different quantity than eq. 2, so that is an error.
    """
    echoed = "".join(tokens)
    shift = echoed.find(prompt)
    if shift < 0:
        raise RemoteScorerError(
            "the echoed tokens do not spell the prompt (lossy detokenisation, e.g. of non-ASCII "
            "characters, or no echo): cannot tell which tokens belong to the text"
        )
    running = offsets[0]
    for token, offset in zip(tokens, offsets):
        if offset != running:
            raise RemoteScorerError("text_offset is not the running length of the token strings; cannot locate the text")
        running += len(token)
    base = offsets[0]
    text_start = base + shift + len(prompt) - len(text)
    text_end = base + shift + len(prompt)
    picked: list[Optional[float]] = []
    starts_on_boundary = False
    for token, offset, value in zip(tokens, offsets, values):
        end = offset + len(token)
        if offset < text_start < end:
            raise RemoteScorerError(
                f"the server's token {token!r} spans the end of the query and the start of the text; "
                "the text's log-probs cannot be separated"
            )
        if offset == text_start and token:
            starts_on_boundary = True
        if text_start <= offset < text_end and token:
            picked.append(value)
    if not starts_on_boundary or not picked:
        raise RemoteScorerError("no echoed token starts where the text starts; cannot score the text")
    if any(v is None for v in picked):
        raise RemoteScorerError(
            "the server returned no log-prob for the first token of the text (nothing precedes it): "
            "set start_text to the model's BOS/EOS token text, e.g. start_text='<|endoftext|>'"
        )
    return [float(v) for v in picked]  # type: ignore[arg-type]
