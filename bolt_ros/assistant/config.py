"""Typed configuration of the assistant node, and its one-to-one mapping onto ROS parameters.

Nested models become dotted ROS parameter names (`backend.kind`, `scene_memory.max_tokens`). The tool list has
no ROS parameter type (a list of mappings), so it travels as one string parameter `tools` holding YAML.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from bolt_ros.assistant.tools import ToolSpec

DEFAULT_SYSTEM_PROMPT = (
    "You are Bolt, a small friendly robot with a head that can turn and tilt, two antennas and a rotating body. "
    "Answer in one or two short spoken sentences. Use your tools to move when it helps."
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class BackendConfig(_Strict):
    kind: Literal["embedded", "openai", "scripted"] = "embedded"
    model_path: str = "default-chat"     # embedded: a GGUF path or a name from bolt_ros.engine.default_models
    draft_path: str = "auto"             # embedded: DFlash drafter GGUF; auto = the one shipped for the model
    # embedded: the replies in words from another GGUF of the same tokenizer (a name or path; same = model_path):
    # "qwen2.5-coder-1.5b" for better words on larger machines, the small model still deciding moves (intent)
    words_model_path: str = "same"
    n_ctx: int = Field(4096, ge=256, le=131072)  # embedded: context length (KV cache); prompts are fitted to it
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")  # embedded: auto = CUDA when present
    compile: bool = False                # embedded, CPU: decode/verify steps through torch.compile (start-up +1-2 min)
    base_url: str = "http://127.0.0.1:8080/v1"   # openai: the server's /v1 root
    model: str = ""                      # openai: model name sent with each request
    api_key: str = ""                    # openai: bearer token, if the server wants one
    request_timeout_s: float = Field(30.0, gt=0)
    max_tokens: int = Field(256, gt=0)
    # sampling: the defaults are Qwen2.5-Coder-Instruct's recommended ones (its generation_config.json; the GGUF
    # carries no general.sampling.* keys)
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)         # 0 = off
    min_p: float = Field(0.0, ge=0, lt=1)
    repetition_penalty: float = Field(1.05, gt=0)  # 1 = off; llama.cpp's repeat_penalty over the last 64 tokens
    tool_choice: Literal["auto", "required", "none"] = "auto"  # embedded: grammar-constrained calls (llguidance)
    # embedded, auto: a reply is calls if the model's first token opens a call with at least this probability,
    # else words (ChatSession.stream); 0 = the sampled first token decides
    call_threshold: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = -1                       # -1 = random
    script: str = ""                     # scripted: YAML rules (see bolt_ros/assistant/scripted.py)
    token_delay_s: float = Field(0.0, ge=0)  # scripted: delay per streamed word, to look like a model


class SceneMemoryConfig(_Strict):
    max_tokens: int = Field(120, gt=0)   # budget of the scene block in the prompt (approximate tokens)
    max_age_s: float = Field(60.0, gt=0)  # captions older than this are forgotten
    max_items: int = Field(8, gt=0)


class TopicsConfig(_Strict):
    transcript: str = "speech/transcript"
    caption: str = "perception/caption"
    events: str = "assistant/events"
    tts: str = "tts/say"
    converse: str = "converse"


class IntentExample(_Strict):
    say: str                  # what a person says
    do: str                   # a parameterless tool's name (`dance`, `look_left`), or talk / repeat / reverse


class IntentConfig(_Strict):
    """Whether a turn acts or talks, decided before any words (bolt_ros/assistant/intent.py): a classifier prompt
    with examples, scored over the robot's parameterless tools and `talk`, `repeat` (the last move once more),
    `reverse` (its opposite). The words then come from a model call that cannot call tools."""
    enabled: bool = False
    model_path: str = "same"  # same = the backend's engine (embedded); or a GGUF path / default_models name
    instructions: str = ("You decide what a small robot does when a person speaks to it. Answer with one word "
                         "from this list: {labels}.")
    examples: list[IntentExample] = Field(default_factory=list)
    # the names the classifier sees for tools ("look_left=head_left, ..."): "look" in a question ("what do you
    # see", "look curious") pulled the head tools' shared first token (docs/conversation.md)
    aliases: dict[str, str] = Field(default_factory=dict)
    opposites: dict[str, str] = Field(default_factory=dict)  # for `reverse`; each pair works both ways
    # "look <word>" asked of the robot plays the animation that shows it ("Can you look sleepy?" -> sleep)
    looks: dict[str, str] = Field(default_factory=dict)
    # the words model's temperature for an answer to a question (None: the backend's own); its redraws keep theirs
    question_temperature: float | None = Field(None, ge=0.0)
    # the robot's answer to a question about a move it can do ("Do you know how to dance?"), when the classifier
    # leaves the turn to words: lines between " | " ("" = the words model answers); a yes then plays the move
    offer: str = ""
    # a second classifier, asked only when the first chose a move: does the person ask the robot for something?
    # ("" = off). Its yes/no is pooled with the first's probabilities (intent.py)
    confirm_instructions: str = ""
    confirm_examples: list[IntentExample] = Field(default_factory=list)  # do: yes | no

    @field_validator("examples", "confirm_examples", mode="before")
    @classmethod
    def _examples_from_yaml(cls, v: Any) -> Any:
        return _yaml_list(v, "intent.examples and intent.confirm_examples must be YAML lists of {say, do}")

    @field_validator("confirm_examples")
    @classmethod
    def _yes_or_no(cls, v: list[IntentExample]) -> list[IntentExample]:
        bad = [e.do for e in v if e.do not in ("yes", "no")]
        if bad:
            raise ValueError(f"intent.confirm_examples answer yes or no, not {bad}")
        return v

    @field_validator("aliases", "opposites", "looks", mode="before")
    @classmethod
    def _pairs_from_text(cls, v: Any) -> Any:
        if isinstance(v, str):  # "a=b, c=d": ROS parameters have no map type
            pairs = [p.split("=") for p in v.split(",") if p.strip()]
            if any(len(p) != 2 or not p[0].strip() or not p[1].strip() for p in pairs):
                raise ValueError(f"expected 'name=other, ...', got {v!r}")
            v = {a.strip(): b.strip() for a, b in pairs}
        return v

    @field_serializer("examples", "confirm_examples")
    def _examples_to_yaml(self, examples: list[IntentExample]) -> str:
        return yaml.safe_dump([e.model_dump() for e in examples], sort_keys=False, width=1000) if examples else ""

    @field_serializer("aliases", "opposites", "looks")
    def _pairs_to_text(self, pairs: dict[str, str]) -> str:
        return ", ".join(f"{a}={b}" for a, b in pairs.items())


class AssistantConfig(_Strict):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    backend: BackendConfig = BackendConfig()
    scene_memory: SceneMemoryConfig = SceneMemoryConfig()
    topics: TopicsConfig = TopicsConfig()
    intent: IntentConfig = IntentConfig()
    max_history_messages: int = Field(16, gt=0)
    # how earlier turns reach the model (bolt_ros/assistant/conversation.py): verbatim messages, or a short memory
    # at the top of each user message; memory_turns: turns it covers; memory_replies: it quotes the robot's replies
    history: Literal["verbatim", "memory"] = "verbatim"
    memory_turns: int = Field(6, gt=0)
    memory_replies: bool = True
    memory_keeps_last_call: bool = False       # memory mode: the last turn's call shown as the model wrote it
    prefill_between_turns: bool = True         # idle: prefill the next turn's prompt up to the person's words
    # on speech/speculative (the ASR at the person's pause, before the turn ends): decide the intent and prefill
    # their message now, kept when the final transcript is the same words (issue 33, assistant/priming.py)
    speculative_start: bool = True
    # a reply's first unit to TTS: a clause of this many words ending at a comma, else ~8 words (0: whole sentences)
    first_clause_words: int = Field(4, ge=0)
    max_tool_rounds: int = Field(3, ge=0)      # model calls that may request tools; the next one gets no tools
    max_sentences: int = Field(3, ge=0)        # a turn stops after this many spoken sentences (0 = no limit)
    # a motion's own line (ToolSpec.say) is said as the robot starts moving, not after the motion (issue 33)
    say_move_at_start: bool = True
    at_a_loss: str = ""   # lines (" | " between them) for a turn that would end with nothing said or done
    at_a_loss_told: str = ""  # the same for a turn that told something rather than asked ("" = at_a_loss)
    too_long: str = ""  # lines for words longer than the model's context ("" = the loop's own, ToolLoop.too_long)
    # the note of what the person told (assistant/facts.py) shown to the words model; false: the robot alone says it
    # back when asked (FactNote.answer), and the model cannot weave it into unrelated small talk
    facts_in_prompt: bool = True
    robot_name: str = "Bolt"  # the name the system prompt gives the robot: a reply never addresses the person by it
    enable_thinking: bool = False              # default when a transcript arrives (a goal says its own)
    barge_in: bool = True                      # a new utterance cancels the reply in progress
    max_queued_turns: int = Field(4, gt=0)     # without barge-in: turns waiting; more are refused
    barge_in_stops_motion: bool = True         # ... and the robot's running motions
    tools: list[ToolSpec] = Field(default_factory=list)

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_from_yaml(cls, v: Any) -> Any:
        return _yaml_list(v, "tools must be a YAML list of tool declarations")

    @field_serializer("tools")
    def _tools_to_yaml(self, tools: list[ToolSpec]) -> str:
        return yaml.safe_dump([t.model_dump(exclude_defaults=True) for t in tools], sort_keys=False) if tools else ""

    def lines(self, name: str) -> list[str]:
        """A parameter of spoken lines ("a | b") as a list."""
        return [x.strip() for x in getattr(self, name).split("|") if x.strip()]


def _yaml_list(v: Any, error: str) -> Any:
    """A list parameter that travels as one YAML string (ROS parameters have no list of maps): parsed here."""
    if isinstance(v, str):
        v = yaml.safe_load(v) if v.strip() else []
        if not isinstance(v, list):
            raise ValueError(error)
    return v


def to_ros_parameters(cfg: AssistantConfig) -> dict[str, Any]:
    """Config -> flat {dotted name: value} with only ROS parameter types (bool, int, float, str)."""
    return _flatten(cfg.model_dump())


def from_ros_parameters(params: dict[str, Any]) -> AssistantConfig:
    """Flat {dotted name: value} (any subset) -> validated config; unknown names are an error."""
    return AssistantConfig.model_validate(unflatten(params))


def load_params_file(path: str | Path, node_name: str) -> dict[str, Any]:
    """The flat parameters a ROS params file gives `node_name` (its `/**` section, then its own section)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a ROS parameters file (top level must be a mapping of node names)")
    out: dict[str, Any] = {}
    for key in ("/**", node_name, "/" + node_name):
        section = data.get(key)
        if section is not None:
            if not isinstance(section, dict) or "ros__parameters" not in section:
                raise ValueError(f"{path}: section {key!r} needs a ros__parameters mapping")
            out.update(_flatten(section["ros__parameters"] or {}))
    return out


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: dict[str, Any]) -> dict:
    """{'a.b': 1} -> {'a': {'b': 1}}: dotted ROS parameter names back to the nested config shape."""
    out: dict = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out
