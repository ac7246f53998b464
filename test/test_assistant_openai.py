"""The openai backend against a small in-test OpenAI-compatible server streaming SSE (content, reasoning,
tool calls split over chunks, usage), plus HTTP errors, an unreachable server and a cancel mid-stream."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bolt_ros.assistant.backend import BackendError, Finished, TextDelta, ThoughtDelta, ToolCallRequest
from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.openai_backend import OpenAIBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome

_PARAMS = {"type": "object", "properties": {"name": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "play_animation", "description": "animate", "parameters": _PARAMS}}]


def _chunk(delta: dict | None = None, finish=None, usage=None) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "choices": [] if delta is None else
            [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _script(req: dict) -> tuple[list[bytes], float]:
    """Chunks to stream for a request, and the delay between them."""
    last = req["messages"][-1]
    if last["role"] == "tool":
        return [_chunk({"role": "assistant", "content": "Done "}), _chunk({"content": "waving."}, "stop"),
                _chunk(usage={"prompt_tokens": 40, "completion_tokens": 3})], 0.0
    if "slow" in last["content"]:
        return [_chunk({"content": f"w{i} "}) for i in range(200)], 0.02
    if "badargs" in last["content"]:
        return [_chunk({"tool_calls": [{"index": 0, "id": "c9", "type": "function",
                                        "function": {"name": "play_animation", "arguments": "{name: nod"}}]},
                       "tool_calls")], 0.0
    return [_chunk({"role": "assistant", "reasoning_content": "they want a wave"}),
            _chunk({"content": "Sure! "}),
            _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "play_", "arguments": ""}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"name": "animation", "arguments": '{"name": '}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"happy"}'}}]}, "tool_calls"),
            _chunk(usage={"prompt_tokens": 30, "completion_tokens": 12})], 0.0


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": req})
        if self.server.fail:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "model not loaded"}')
            return
        chunks, delay = _script(req)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for c in [*chunks, b"data: [DONE]\n\n"]:
                self.wfile.write(c)
                self.wfile.flush()
                time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            self.server.client_hung_up.set()


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests, srv.fail, srv.client_hung_up = [], False, threading.Event()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _backend(srv, **kw) -> OpenAIBackend:
    return OpenAIBackend(f"http://127.0.0.1:{srv.server_address[1]}/v1", model="bolt-e4b", api_key="k", **kw)


def test_stream_with_reasoning_text_and_a_tool_call_split_over_chunks(server):
    events = list(_backend(server).stream_chat([{"role": "user", "content": "wave"}], TOOLS, enable_thinking=True,
                                               cancel=threading.Event()))
    assert events[0] == ThoughtDelta("they want a wave") and events[1] == TextDelta("Sure! ")
    assert events[2] == ToolCallRequest("call_1", "play_animation", {"name": "happy"}, raw='{"name": "happy"}')
    assert isinstance(events[3], Finished) and events[3].stats["completion_tokens"] == 12
    assert events[3].stats["prompt_tokens"] == 30 and events[3].stats["ttft_ms"] > 0
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k"
    body = req["body"]
    assert body["stream"] is True and body["tools"] == TOOLS and body["model"] == "bolt-e4b"
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


def test_full_tool_loop_over_http_sends_the_call_and_result_back(server):
    events, calls = [], []

    def call_tool(call, cancel):
        calls.append(call)
        return ToolOutcome(call.id, call.name, True, json.dumps({"status": "succeeded"}))
    loop = ToolLoop(_backend(server), call_tool, events.append)
    conv = Conversation("You are a robot.")
    res = loop.run(conv, conv.user_message("wave"), TOOLS, enable_thinking=False, cancel=threading.Event())
    assert res.text == "Sure! Done waving." and [c.name for c in calls] == ["play_animation"]
    assert [e.text for e in events if e.kind == "sentence"] == ["Sure!", "Done waving."]
    second = server.requests[1]["body"]["messages"]
    # on the wire, arguments are JSON text (OpenAI format); the tool result follows with its call id
    assert second[-2]["tool_calls"][0]["function"] == {"name": "play_animation", "arguments": '{"name": "happy"}'}
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "name": "play_animation",
                          "content": '{"status": "succeeded"}'}
    assert res.stats["prompt_tokens"] == 70 and res.stats["completion_tokens"] == 15


def test_malformed_tool_arguments_become_a_call_with_an_error(server):
    events = list(_backend(server).stream_chat([{"role": "user", "content": "badargs"}], TOOLS,
                                               enable_thinking=False, cancel=threading.Event()))
    call = events[0]
    assert call.name == "play_animation" and call.arguments is None and "not valid JSON" in call.error


def test_cancel_mid_stream_stops_within_a_chunk_and_hangs_up(server):
    """Event-driven: cancel when the 5th delta arrives; the backend must yield at most the chunk already in flight
    (the server streams one every 20 ms, 200 in all), never a Finished, and hang up (the server sees the close)."""
    cancel = threading.Event()
    got = []
    for ev in _backend(server).stream_chat([{"role": "user", "content": "slow"}], [], enable_thinking=False,
                                           cancel=cancel):
        got.append(ev)
        if len(got) == 5:
            cancel.set()
    assert 5 <= len(got) <= 6, len(got)  # stopped within a chunk of the cancel, not at the end of the 200
    assert not any(isinstance(e, Finished) for e in got)
    assert server.client_hung_up.wait(5.0)  # the server saw the connection close


def test_http_error_and_unreachable_server_are_backend_errors(server):
    server.fail = True
    with pytest.raises(BackendError, match=r"HTTP 500.*model not loaded"):
        list(_backend(server).stream_chat([{"role": "user", "content": "x"}], [], enable_thinking=False,
                                          cancel=threading.Event()))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match="connection failed"):
        list(OpenAIBackend(f"http://127.0.0.1:{port}/v1").stream_chat([], [], enable_thinking=False,
                                                                      cancel=threading.Event()))
    with pytest.raises(ValueError, match="http"):
        OpenAIBackend("localhost:8080")
