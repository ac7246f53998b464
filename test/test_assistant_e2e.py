"""End to end with real models, no scripted engine:
- the assistant node + simulated robot, embedded backend on SmolLM2-135M-Instruct (small and fast; greedy): a
  caption and an utterance -> streamed reply spoken on tts/say -> Converse result with stats; the reply is exactly
  what the engine generates for that prompt, and the next turn reuses the cached prompt prefix;
- `python -m bolt_ros.bringup --console` with the default config (what `make run` starts, on the default chat
  model): a typed line gets a spoken reply or a tool call, and one SIGINT ends it with status 0;
- the openai backend against a real llama-server serving the same model where llama.cpp is installed, and against
  a small in-test OpenAI-compatible server otherwise (the test id says which one ran).
SmolLM2 has no tool training, so no test here requires it to call a tool (test_tool_accuracy.py drives the default
model's tool calls; the scripted tests in test_assistant_node.py cover the tool path).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from action_msgs.msg import GoalStatus
from bolt_ros.action import Converse
from bolt_ros.msg import AssistantEvent
from conftest import BringupConsole, wait_for
from rclpy.action import ActionClient
from test_assistant_fixtures import Probe

from bolt_ros.assistant.backend import Finished, TextDelta, ToolCallRequest
from bolt_ros.assistant.config import AssistantConfig, from_ros_parameters, load_params_file
from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.openai_backend import OpenAIBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome, ToolRegistry
from bolt_ros.engine.decode.chat_session import ChatSession
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.graph import package_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from llamacpp_ref import LlamaServer, llama_bin_dir  # noqa: E402

MAX_TOKENS = 24
# max_sentences off: the reply is compared with the engine's own greedy output for the same prompt
GREEDY = {"backend.kind": "embedded", "backend.model_path": "smollm2", "backend.temperature": 0.0,
          "backend.seed": 0, "backend.max_tokens": MAX_TOKENS, "max_sentences": 0}


def product_config(**updates) -> AssistantConfig:
    params = load_params_file(package_file("config/assistant.yaml"), "assistant_node")
    return from_ros_parameters({**params, **updates})


def words(text: str) -> str:
    return " ".join(text.split())


# ---- the graph on the embedded engine ----------------------------------------------------------------------------

def test_default_chat_model_answers_through_the_graph(ros):
    from bolt_ros.nodes.assistant_node import AssistantNode
    from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes

    ros.add(*make_sim_robot_nodes(context=ros.context))
    # backend built from config; verbatim history: this test replays the exact prompt and checks that the second
    # turn reuses the first's cache (memory mode reuses the system prompt and tools: test_conversation_design.py).
    # The intent classifier off: on this 135M test model it took "Thank you!" for wake_up once issue 34 gave it more
    # labels, and a move's turn writes no reply whose prefill this test checks (the classifier is measured on the
    # chat model by bench_conversation and test_intent)
    assistant = ros.add(AssistantNode(product_config(**GREEDY, history="verbatim", **{"intent.enabled": False}),
                                      context=ros.context))
    probe = Probe(ros)
    probe.connected(assistant)
    probe.see("A person is in front of you, waving.")
    wait_for(lambda: assistant.scene.items, what="caption in scene memory")
    client = ActionClient(probe.node, Converse, "converse")
    assert client.wait_for_server(timeout_sec=5.0)
    question = "Hello! What is the capital of France? Tell me about it."  # asks for more than one sentence
    handle = ros.result(client.send_goal_async(Converse.Goal(utterance=question)))
    res = ros.result(handle.get_result_async(), timeout=60, what="the converse result")
    r, s = res.result, res.result.stats
    assert res.status == GoalStatus.STATUS_SUCCEEDED and r.success and r.error == "" and r.text.strip()
    assert s.ttft_ms > 0 and 0 < s.completion_tokens <= MAX_TOKENS and s.tokens_per_second > 0
    assert s.prompt_tokens > 50 and s.total_ms >= s.ttft_ms and s.acceptance_length == 1.0  # no drafter
    assert s.tool_rounds == 0 and list(r.tool_calls) == []

    # spoken sentence by sentence while generating: all of the reply, and the first sentence before the last token
    wait_for(lambda: words(" ".join(probe.spoken())) == words(r.text), what="the whole reply on tts/say")
    deltas = [t for t, m in probe.events if m.type == AssistantEvent.TEXT_DELTA]
    assert len(probe.tts) >= 2, f"expected at least two sentences in {r.text!r}"
    assert len(deltas) >= s.completion_tokens // 2
    assert probe.tts[0][0] < deltas[-1]

    # the idle worker prefills the next turn on the same engine: let it finish before this thread replays on it
    wait_for(lambda: assistant.prefilled_after >= 1, timeout=30, what="the next turn prefilled after turn 1")
    # the model saw the caption, and its reply is exactly the engine's greedy output for that prompt
    conv = assistant._conversations[""]
    user = conv.history[0]["content"]
    assert "A person is in front of you, waving." in user and user.endswith(question)
    engine, sampling = assistant.backend.engine, assistant.backend.sampling
    replay = list(ChatSession(engine).stream(conv.messages()[:-1], tools=assistant.registry.openai_tools(),
                                               sampling=sampling))[-1]
    assert replay.text.strip() == r.text and replay.completion_tokens == s.completion_tokens
    assert replay.prompt_tokens == s.prompt_tokens

    # a second turn (transcript path) only prefills what is new: system prompt and first turn stay cached, and the
    # idle worker ran the first turn's reply into the cache (prefill_between_turns), so only the new message is left
    n_spoken, n_done = len(probe.tts), assistant.turns_done
    probe.say("Thank you!")
    # turns_done counts committed turns: the state topic alone can lag the reply's first sentence on tts/say (two
    # topics, no order between them), which once let this check run mid-turn
    wait_for(lambda: assistant.turns_done > n_done and len(probe.tts) > n_spoken, timeout=60, what="the second reply")
    last = assistant.backend.session.last_stats
    assert last["prompt_tokens"] > s.prompt_tokens and last["prefill_tokens"] < last["prompt_tokens"] - s.prompt_tokens
    sent = [m for m in conv.history if m["role"] == "user"][-1]["content"]   # the scene block and "Thank you!"
    assert sent.endswith("Thank you!")
    assert last["prefill_tokens"] <= len(engine.tok.encode(sent)) + 8   # the new message and its markup only


@pytest.mark.parametrize("between", [True, False], ids=["prefilled", "negative-control"])
def test_the_idle_worker_prefills_the_next_turn_up_to_the_persons_words(ros, between):
    """Memory mode changes the memory every turn, so without a head start a turn prefills the memory and its
    message; prefilled between turns (make run's config), it runs its message alone."""
    from bolt_ros.nodes.assistant_node import AssistantNode
    from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes

    ros.add(*make_sim_robot_nodes(context=ros.context))
    # the intent classifier off: on this 135M test model it took "Thanks!" for a dance once the classifier had more
    # move labels, and a move's turn runs no reply to prefill (the classifier is measured on the chat model by
    # bench_conversation and test_intent)
    assistant = ros.add(AssistantNode(product_config(**GREEDY, history="memory", prefill_between_turns=between,
                                                     **{"intent.enabled": False}), context=ros.context))
    probe = Probe(ros)
    probe.connected(assistant)
    for n, said in enumerate(["Hello there, my name is Ada.", "How are you today?"], 1):
        probe.say(said)
        wait_for(lambda n=n: assistant.turns_done >= n, timeout=60, what=f"turn {n}")
    if between:
        wait_for(lambda: assistant.prefilled_after >= 2, timeout=30, what="the next turn prefilled after turn 2")
    probe.say("Thanks!")
    wait_for(lambda: assistant.turns_done >= 3, timeout=60, what="turn 3")
    ran = assistant.backend.session.last_prefill_tokens   # set even when the loop cut the reply short
    alone = len(assistant.backend.engine.tok.encode("Thanks!")) + 8   # the message and its markup
    assert 0 < ran and (ran <= alone) == between, ran


# ---- `make run`: bringup with the console, default config --------------------------------------------------------

def test_bringup_console_with_the_default_config_replies_and_stops_on_one_sigint():
    with BringupConsole() as console:
        console.wait_line(lambda s: "nodes running" in s, timeout=60)
        assert "backend embedded" in console.output()
        console.wait_line(lambda s: "name is one of" in s, timeout=20)  # the assistant knows the robot's animations
        console.type("Hello robot, how are you?\n")
        reply = console.wait_line(lambda s: s.startswith("Bolt: "), timeout=60)
        assert len(reply.strip()) > len("Bolt: ")
        console.stop_with_sigint(exit_within=5.0)  # most likely mid-generation: the reply is up to 200 tokens


# ---- the openai backend: real llama-server where installed, the in-test server otherwise --------------------------

SERVER_CTX = 2048  # both servers' context
REPLY = "Hello there! I am Bolt, a small robot. I can nod, look around and wiggle my antennas for you."


class _Handler(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible server: streams REPLY word by word (at most max_tokens words), then usage."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(req)
        n = sum(len(m.get("content") or "") for m in req["messages"]) // 4
        if n > SERVER_CTX:  # llama-server's answer to a prompt over its context: HTTP 400 and this body
            body = json.dumps({"error": {"code": 400, "message": f"request ({n} tokens) exceeds the available "
                                         f"context size ({SERVER_CTX} tokens), try increasing it",
                                         "type": "exceed_context_size_error", "n_prompt_tokens": n,
                                         "n_ctx": SERVER_CTX}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        pieces = [w + " " for w in REPLY.split()][:req.get("max_tokens", 256)]
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": p}, "finish_reason": None}]}
                  for p in pieces]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        chunks.append({"choices": [], "usage": {"prompt_tokens": sum(len(m["content"]) // 4 for m in
                                                                      req["messages"]),
                                                "completion_tokens": len(pieces)}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for c in chunks:
                self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
                self.wfile.flush()
                time.sleep(0.01)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


def _servers() -> list[str]:
    kinds = ["in-test-server"]
    if llama_bin_dir() is not None:
        kinds.append("llama-server")
    return kinds


@pytest.fixture(scope="module", params=_servers())
def openai_server(request):
    """(kind, /v1 base URL, the requests the server saw or None when it cannot tell)."""
    if request.param == "llama-server":
        # --jinja: SmolLM2's own chat template, which accepts a tools list (and ignores it)
        with LlamaServer(resolve_model("smollm2"), threads=2, ctx=SERVER_CTX, extra=["--jinja"]) as srv:
            print(f"openai backend against llama-server: {' '.join(srv.cmd)}")
            yield request.param, srv.url + "/v1", None
        return
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests = []
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    print(f"openai backend against the in-test server on port {srv.server_address[1]} (llama-server not installed)")
    yield request.param, f"http://127.0.0.1:{srv.server_address[1]}/v1", srv.requests
    srv.shutdown()
    srv.server_close()


def _chat_backend(base_url: str) -> OpenAIBackend:
    return OpenAIBackend(base_url, model="smollm2", max_tokens=MAX_TOKENS, temperature=0.0, seed=0)


def test_openai_backend_streams_a_turn_with_tools_offered(openai_server):
    kind, base_url, requests = openai_server
    cfg = product_config()
    tools = ToolRegistry(cfg.tools).openai_tools()
    events, calls = [], []

    def call_tool(call: ToolCallRequest, cancel) -> ToolOutcome:  # only reached if the model does call one
        calls.append(call)
        return ToolOutcome(call.id, call.name, False, error="not in this test")

    loop = ToolLoop(_chat_backend(base_url), call_tool, events.append, max_tool_rounds=1)
    conv = Conversation(cfg.system_prompt)
    res = loop.run(conv, conv.user_message("Hello! What is the capital of France?"), tools, enable_thinking=False,
                   cancel=threading.Event())
    print(f"{kind}: {res.text!r} {res.stats}")
    assert res.error == "" and not res.cancelled and res.text
    texts = [e.text for e in events if e.kind == "text"]
    assert len(texts) >= 3 and words("".join(texts)) == words(res.text)  # streamed, not one blob
    assert words(" ".join(e.text for e in events if e.kind == "sentence")) == words(res.text)
    st = res.stats
    assert st["ttft_ms"] > 0 and st["prompt_tokens"] > 0
    assert 0 < st["completion_tokens"] <= MAX_TOKENS * (1 + len(calls))  # one model call per tool round
    # a tool call, if the model makes one, arrives parsed or with an error the model is shown: never a crash
    for c in res.tool_calls:
        assert (c.arguments is not None and c.error is None) or c.error
    if kind == "llama-server":
        # llama.cpp renders the same chat template into the same tokens as our engine's ChatFormat + Tokenizer
        assert st["prompt_tokens"] == _our_prompt_tokens(conv.messages(res.messages[:1]), tools)
    else:
        body = requests[-1]
        assert body["stream"] is True and body["tools"] == tools and body["max_tokens"] == MAX_TOKENS
        assert body["temperature"] == 0.0 and body["seed"] == 0 and body["messages"][0]["role"] == "system"


def test_openai_backend_words_longer_than_the_servers_context_are_answered(openai_server):
    """A prompt over the server's context: llama-server answers HTTP 400 `exceed_context_size_error` (the in-test
    server the same body), the backend raises the engine's own PromptTooLong, and the loop says its line rather than
    failing the turn; a turn that fits goes on as usual."""
    from bolt_ros.engine.errors import PromptTooLong
    kind, base_url, _ = openai_server
    page = "tell me about the weather and the sea and the mountains " * 400  # ~4400 tokens
    backend = _chat_backend(base_url)
    with pytest.raises(PromptTooLong) as e:
        list(backend.stream_chat([{"role": "user", "content": page}], [], enable_thinking=False,
                                 cancel=threading.Event()))
    assert e.value.n_tokens > e.value.n_ctx > 0, (kind, e.value)
    events = []
    loop = ToolLoop(backend, lambda c, _e: None, events.append, max_tool_rounds=0)
    conv = Conversation("You are Bolt, a small robot.")
    res = loop.run(conv, conv.user_message(page), [], enable_thinking=False, cancel=threading.Event())
    assert res.error == "" and res.text == ToolLoop.too_long[0], (kind, res.error)
    assert not [ev for ev in events if ev.kind == "error"]
    res = loop.run(conv, conv.user_message("Hello!"), [], enable_thinking=False, cancel=threading.Event())
    assert res.error == "" and res.text and res.text != ToolLoop.too_long[0], (kind, res.error)


def test_openai_backend_cancel_mid_stream(openai_server):
    kind, base_url, _ = openai_server
    cancel, got = threading.Event(), []
    t_cancel = None
    for ev in _chat_backend(base_url).stream_chat([{"role": "user", "content": "Tell me a long story."}], [],
                                                  enable_thinking=False, cancel=cancel):
        got.append(ev)
        if isinstance(ev, TextDelta) and t_cancel is None:
            t_cancel = time.perf_counter()
            cancel.set()
    assert t_cancel is not None, f"{kind} streamed no text"
    # event-driven: nothing but the delta already in flight follows the cancel, and the turn never finishes
    assert not any(isinstance(e, Finished) for e in got) and len(got) <= 3


def _our_prompt_tokens(messages: list[dict], tools: list[dict]) -> int:
    from bolt_ros.engine.gguf.reader import GGUFFile
    from bolt_ros.engine.text.formats import chat_format_for
    from bolt_ros.engine.text.tokenizer import Tokenizer

    with GGUFFile(resolve_model("smollm2")) as gf:
        tok = Tokenizer.from_gguf(gf)
        segments = chat_format_for(gf, tok).render(messages, tools=tools)
        return len(tok.encode_segments(segments, add_bos=tok.add_bos))
