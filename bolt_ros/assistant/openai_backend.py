"""Backend for any OpenAI-compatible chat server (llama-server, vLLM, ...): streamed SSE, tool calls, reasoning.

Plain http.client, no SDK: one POST /chat/completions with stream=true per model call. Cancel closes the socket
from a watcher thread, so a barge-in stops a long stream without waiting for the next chunk.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

from bolt_ros.assistant.backend import (
    BackendError,
    BackendEvent,
    Finished,
    TextDelta,
    ThoughtDelta,
    ToolCallRequest,
)
from bolt_ros.engine.errors import PromptTooLong


class OpenAIBackend:
    def __init__(self, base_url: str, *, model: str = "", api_key: str = "", timeout_s: float = 30.0,
                 max_tokens: int = 256, temperature: float = 0.7, top_p: float = 0.95, seed: int = -1):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"backend.base_url must be an http(s) URL, got {base_url!r}")
        self.url, self.base_url = url, base_url.rstrip("/")
        self.model, self.api_key, self.timeout_s = model, api_key, timeout_s
        self.sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
        if seed >= 0:
            self.sampling["seed"] = seed

    @classmethod
    def from_config(cls, cfg) -> OpenAIBackend:
        return cls(cfg.base_url, model=cfg.model, api_key=cfg.api_key, timeout_s=cfg.request_timeout_s,
                   max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)

    def request_body(self, messages: list[dict], tools: list[dict], enable_thinking: bool,
                     words_only: bool = False) -> dict:
        body = {"model": self.model or "default", "messages": [_wire_message(m) for m in messages], "stream": True,
                "stream_options": {"include_usage": True}, **self.sampling,
                # llama-server and vLLM pass this to the chat template (Gemma 4, Qwen 3 thinking switch)
                "chat_template_kwargs": {"enable_thinking": enable_thinking}}
        if tools:
            body["tools"] = tools
            if words_only:
                body["tool_choice"] = "none"
        return body

    def stream_chat(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool,
                    cancel: threading.Event, words_only: bool = False, attempt: int = 0,
                    temperature: float | None = None) -> Iterator[BackendEvent]:
        t0 = time.perf_counter()
        conn = self._connect()
        done = threading.Event()
        threading.Thread(target=_close_on_cancel, args=(conn, cancel, done), daemon=True).start()
        try:
            body = self.request_body(messages, tools, enable_thinking, words_only)
            if attempt and "seed" in body:  # a redraw: the server's fixed seed would write the same reply again
                body["seed"] += 7919 * attempt
            if temperature is not None:
                body["temperature"] = temperature
            resp = self._post(conn, body)
            yield from self._events(resp, cancel, t0)
        except (OSError, http.client.HTTPException) as e:
            if not cancel.is_set():
                raise BackendError(f"{self.base_url}: connection failed: {e}") from e
        finally:
            done.set()
            conn.close()

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.url.scheme == "https" else http.client.HTTPConnection
        return cls(self.url.hostname, self.url.port, timeout=self.timeout_s)

    def _post(self, conn, body: dict) -> http.client.HTTPResponse:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn.request("POST", self.url.path.rstrip("/") + "/chat/completions", json.dumps(body).encode(), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            body = resp.read(2000).decode(errors="replace")
            if (too_long := context_overflow(resp.status, body)) is not None:
                raise too_long
            raise BackendError(f"{self.base_url}/chat/completions: HTTP {resp.status}: {body[:500]}")
        return resp

    def _events(self, resp, cancel: threading.Event, t0: float) -> Iterator[BackendEvent]:
        calls: dict[int, dict] = {}  # index -> {"id", "name", "arguments"} accumulated over deltas
        usage: dict = {}
        timings: dict = {}
        ttft = None
        for raw in resp:
            if cancel.is_set():
                return
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError as e:
                raise BackendError(f"bad SSE chunk from server: {data[:200]!r}") from e
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                    ttft = (time.perf_counter() - t0) * 1e3
                if delta.get("reasoning_content") or delta.get("reasoning"):
                    yield ThoughtDelta(delta.get("reasoning_content") or delta.get("reasoning"))
                if delta.get("content"):
                    yield TextDelta(delta["content"])
                for tc in delta.get("tool_calls") or []:
                    acc = calls.setdefault(tc.get("index", len(calls)), {"id": "", "name": "", "arguments": ""})
                    acc["id"] = tc.get("id") or acc["id"]
                    fn = tc.get("function") or {}
                    acc["name"] += fn.get("name") or ""
                    acc["arguments"] += fn.get("arguments") or ""
        for i, acc in sorted(calls.items()):
            yield _tool_call(acc, i)
        yield Finished(_stats(usage, timings, ttft, t0))


def _tool_call(acc: dict, index: int) -> ToolCallRequest:
    call_id, raw = acc["id"] or f"call_{index}", acc["arguments"]
    if not acc["name"]:
        return ToolCallRequest(call_id, "", None, raw=raw, error="tool call without a function name")
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as e:
        return ToolCallRequest(call_id, acc["name"], None, raw=raw, error=f"arguments are not valid JSON ({e})")
    if not isinstance(args, dict):
        return ToolCallRequest(call_id, acc["name"], None, raw=raw, error="arguments must be a JSON object")
    return ToolCallRequest(call_id, acc["name"], args, raw=raw)


def _stats(usage: dict, timings: dict, ttft: float | None, t0: float) -> dict:
    stats: dict = {"prompt_tokens": usage.get("prompt_tokens", 0),
                   "completion_tokens": usage.get("completion_tokens", 0)}
    if ttft is not None:
        stats["ttft_ms"] = ttft
    if timings.get("predicted_per_second"):  # llama-server reports its own decode rate
        stats["tokens_per_second"] = timings["predicted_per_second"]
    elif stats["completion_tokens"]:
        stats["tokens_per_second"] = stats["completion_tokens"] / max(time.perf_counter() - t0, 1e-6)
    if timings.get("draft_n") and timings.get("predicted_n"):
        # each target pass commits 1 token + the drafts it accepted: passes = predicted - accepted
        n, acc = timings["predicted_n"], timings.get("draft_n_accepted", 0)
        stats["acceptance_length"] = n / max(n - acc, 1)
    return stats


def _wire_message(m: dict) -> dict:
    """Our messages keep tool-call arguments as dicts (chat templates want that); the wire wants JSON text."""
    if m.get("role") == "assistant" and m.get("tool_calls"):
        m = {**m, "tool_calls": [{**tc, "function": {**tc["function"], "arguments": json.dumps(
            tc["function"].get("arguments") or {})}} for tc in m["tool_calls"]]}
    return m


def _close_on_cancel(conn: http.client.HTTPConnection, cancel: threading.Event, done: threading.Event) -> None:
    while not done.is_set():
        if cancel.wait(0.02):
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # unblocks the reader at once
                except OSError:
                    pass
            return


def context_overflow(status: int, body: str) -> PromptTooLong | None:
    """A server's answer to a prompt longer than its context, as the engine's own error: llama-server's HTTP 400
    of type `exceed_context_size_error` (with `n_prompt_tokens` and `n_ctx`), OpenAI's code
    `context_length_exceeded`; None for any other answer."""
    if status != 400:
        return None
    try:
        err = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        return None
    kinds = (err.get("type"), err.get("code")) if isinstance(err, dict) else ()
    if "exceed_context_size_error" not in kinds and "context_length_exceeded" not in kinds:
        return None
    return PromptTooLong(int(err.get("n_prompt_tokens") or 0), int(err.get("n_ctx") or 0))
