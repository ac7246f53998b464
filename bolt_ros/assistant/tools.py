"""Tool declarations from config, argument validation, and the argument -> goal/request mapping (ROS-free).

A tool is an OpenAI-style function the model may call, bound to a ROS action or service. Its parameters are a
JSON-schema subset (object of string/number/integer/boolean/array properties with enum, minimum/maximum, default);
validation builds a pydantic model from that schema, so errors the model sees read like
"speed: Input should be less than or equal to 2". Enums may be filled at runtime (animation names from the robot).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.relative import AT_LIMIT_CUE, RelativeMove

_JSON_TYPES: dict[str, Any] = {"string": str, "number": float, "integer": int, "boolean": bool}
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")


class ArgRef(BaseModel):
    """A goal/request field taken from a tool argument: value = arg * scale + offset (e.g. degrees -> radians), or
    for a string argument `map[arg]` (a word a small model gets right, "left", -> the number the robot needs)."""
    model_config = ConfigDict(extra="forbid")
    arg: str
    scale: float = 1.0
    offset: float = 0.0
    map: dict[str, float | int | str | bool] | None = None
    default: Any = None  # used when the model omits an optional argument; None leaves the message default


class EnumSource(BaseModel):
    """Fill a string parameter's enum from a service at startup (the robot's animation library)."""
    model_config = ConfigDict(extra="forbid")
    parameter: str
    service: str = "list_animations"
    type: str = "bolt_ros/srv/ListAnimations"
    names_field: str = "names"
    descriptions_field: str = "descriptions"  # "" = none; else appended to the tool description for the model


class Expand(BaseModel):
    """Offer the model one parameterless tool per value of a string enum parameter instead of the tool with the
    enum: `{value}` -> `dance`, `nod`; `look_{value}` -> `look_left`. Small models pick a tool by its name far more
    reliably than an argument (measured: test/test_tool_accuracy.py). The expanded names resolve back to this tool
    with that value; clients that call the tool itself still can."""
    model_config = ConfigDict(extra="forbid")
    parameter: str
    name: str = "{value}"
    description: str = ""  # "{value}" template; "" = the value's description from enum_from, else "<tool>: <value>"
    offer: bool = True  # False: the names resolve (the intent classifier's calls) but the model sees the tool itself


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=_TOOL_NAME.pattern)
    description: str
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: Literal["action", "service"]
    target: str                       # action or service name, relative so a namespace applies
    type: str                         # "bolt_ros/action/PlayAnimation", "bolt_ros/srv/ListAnimations"
    timeout_s: float = Field(10.0, gt=0)         # whole call: goal sent -> result
    server_timeout_s: float = Field(1.0, gt=0)   # how long to wait for the server to appear
    wait: Literal["result", "accepted"] = "result"  # "accepted": return once the goal runs (robot talks while moving)
    goal: dict[str, ArgRef | bool | int | float | str | list] = Field(default_factory=dict)  # field path -> value
    clamp: bool = False               # numbers out of [minimum, maximum] are clamped instead of refused
    enum_from: EnumSource | None = None
    expand: Expand | None = None
    relative: RelativeMove | None = None  # a direction argument moves on from the current pose (relative.py)
    cancel_on_barge_in: bool = True   # barge-in cancels this tool's running goals
    # What a successful call means to the conversation ({argument} placeholders, underscores read as spaces):
    # `done` goes into the robot's memory of the turn ("you played your {name} animation"); `say` lines are spoken
    # after it instead of asking the model for words (a motion is its own answer, and a small model asked to talk
    # about a JSON result narrates it: "The tool is successfully executed"); they may name the result's fields too
    # ("I know these moves: {names}."); none = the model reads the result (`result_text`, a template over the
    # result's fields, or its JSON) and replies.
    done: str = ""
    say: list[str] = Field(default_factory=list)
    result_text: str = ""

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict) -> dict:
        if v.get("type", "object") != "object" or not isinstance(v.get("properties", {}), dict):
            raise ValueError("parameters must be a JSON schema of type object with a properties mapping")
        for pname, prop in v.get("properties", {}).items():
            t = prop.get("type")
            if t not in (*_JSON_TYPES, "array"):
                raise ValueError(f"parameter {pname!r}: unsupported type {t!r} (use {', '.join(_JSON_TYPES)}, array)")
            if t == "array" and prop.get("items", {}).get("type") not in _JSON_TYPES:
                raise ValueError(f"parameter {pname!r}: array items must be one of {', '.join(_JSON_TYPES)}")
        return v

    @model_validator(mode="after")
    def _refs_exist(self) -> ToolSpec:
        props = self.parameters.get("properties", {})
        for path, value in self.goal.items():
            if isinstance(value, ArgRef) and value.arg not in props:
                raise ValueError(f"tool {self.name}: goal field {path!r} refers to unknown argument {value.arg!r}")
            if isinstance(value, ArgRef) and value.map is not None:
                enum = props[value.arg].get("enum")
                if props[value.arg].get("type") != "string" or not enum or set(enum) - set(value.map):
                    raise ValueError(f"tool {self.name}: goal field {path!r} maps argument {value.arg!r}: it must be "
                                     f"a string enum whose every value the map covers")
        if self.enum_from and props.get(self.enum_from.parameter, {}).get("type") != "string":
            raise ValueError(f"tool {self.name}: enum_from.parameter must name a string parameter")
        if self.expand:
            p = self.expand.parameter
            dynamic = self.enum_from is not None and self.enum_from.parameter == p
            if props.get(p, {}).get("type") != "string" or not (dynamic or props[p].get("enum")):
                raise ValueError(f"tool {self.name}: expand.parameter must name a string enum parameter")
            if "{value}" not in self.expand.name:
                raise ValueError(f"tool {self.name}: expand.name must contain {{value}}")
        rel = self.relative
        if rel and not set(props.get(rel.parameter, {}).get("enum") or [None]) <= set(rel.joints):
            raise ValueError(f"tool {self.name}: relative.parameter must be a string enum of the joints' directions")
        if ("/action/" if self.kind == "action" else "/srv/") not in self.type:
            raise ValueError(f"tool {self.name}: type {self.type!r} does not match kind {self.kind!r}")
        return self


class ToolError(Exception):
    """A call the router refuses before touching ROS (unknown tool, unparsable call, bad arguments)."""


# A motion the robot could not do is answered with one of these plain sentences, never with a model's words over
# the error (they named addresses, ports and retries: issue 35). The robot's servers begin their reasons with these
# cues (bolt_ros/robot/reachy_mini/bridge.py: UNAVAILABLE, OUT_OF_REACH; robot/trajectory.py: "target refused";
# the router: "server ... is not available").
NOT_CONNECTED = "I can't move right now: my body isn't connected."
TOO_FAR = "I can't turn that far."
AT_LIMIT = "I can't go any further that way."  # a relative move already at the limit (relative.py)
DID_NOT_WORK = "That move didn't work, sorry."  # any other failure of a goal the robot was sent (a timeout, ...)


def failure_line(error: str) -> str:
    """The sentence for a motion whose goal failed with `error`."""
    if AT_LIMIT_CUE in error:
        return AT_LIMIT
    if "is not available" in error:
        return NOT_CONNECTED
    if "out of reach" in error or "did not reach the target" in error or ("target refused" in error
                                                                           and "outside" in error):
        return TOO_FAR
    return DID_NOT_WORK


SORRY = "Sorry, I couldn't do that."


def correction_line(failure: str) -> str:
    """What the robot says when a move it already announced ("Looking left.", said as the robot started moving)
    then fails: the failure's plain reason as a correction ("Sorry, I can't turn that far."), or just that it
    could not."""
    return SORRY if failure == DID_NOT_WORK else f"Sorry, {failure}"


@dataclass
class ToolOutcome:
    id: str
    name: str
    ok: bool
    content: str = "{}"      # JSON text: the result (and last feedback) on success
    error: str = ""
    elapsed_ms: float = 0.0
    text: str = ""           # the result as the model reads it, when the tool words it (ToolSpec.result_text)
    done: str = ""           # what the call did, for the robot's memory ("you looked left")
    say: list[str] = field(default_factory=list)  # lines to speak instead of a words round (ToolSpec.say)

    def for_model(self) -> str:
        """What the model reads as the tool message (a failure with a plain sentence: that sentence, so no later
        reply repeats the error's addresses and ports)."""
        if not self.ok:
            return json.dumps({"error": self.say[0] if self.say else self.error})
        return self.text or self.content


class Tool:
    """One ToolSpec plus its runtime state: enum values learned from the robot and the pydantic validator."""

    def __init__(self, spec: ToolSpec):
        self.spec = spec
        self.enum_values: list[str] | None = None
        self.enum_descriptions: list[str] = []
        self.version = 0  # bumped when the schema changes (enum filled)
        self._model = self._build_model()

    def set_enum(self, values: list[str], descriptions: list[str] | None = None) -> None:
        self.enum_values = list(values)
        self.enum_descriptions = list(descriptions or [])
        self._model = self._build_model()
        self.version += 1

    def schema(self) -> dict:
        schema = json.loads(json.dumps(self.spec.parameters))
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        if self.spec.enum_from and self.enum_values is not None:
            schema["properties"][self.spec.enum_from.parameter]["enum"] = self.enum_values
        return schema

    def expanded(self) -> dict[str, str]:
        """Expanded tool name -> enum value (empty unless `expand` is set and the values are known)."""
        ex = self.spec.expand
        if ex is None:
            return {}
        values = self.schema()["properties"][ex.parameter].get("enum") or []
        names = {ex.name.format(value=v): v for v in values}
        return {n: v for n, v in names.items() if _TOOL_NAME.fullmatch(n)}

    def openai_tools(self, taken: set[str]) -> list[dict]:
        """This tool as the model sees it: itself, or one parameterless tool per enum value (`expand`); names that
        collide with another tool's stay reachable through the tool itself."""
        names = {n: v for n, v in self.expanded().items() if n not in taken}
        if not names or not self.spec.expand.offer:
            return [self.openai()]
        described = dict(zip(self.enum_values or [], self.enum_descriptions))
        template = self.spec.expand.description
        out = []
        for name, value in names.items():
            what = template.format(value=value) if template else described.get(value) or f"{self.spec.name}: {value}"
            out.append({"type": "function", "function": {"name": name, "description": what.rstrip(".") + ".",
                                                         "parameters": {"type": "object", "properties": {}}}})
        return out

    def openai(self) -> dict:
        desc = self.spec.description
        if self.enum_values and self.enum_descriptions:
            listing = "; ".join(f"{n}: {d}" for n, d in zip(self.enum_values, self.enum_descriptions) if d)
            desc = f"{desc} Available: {listing}." if listing else desc
        return {"type": "function", "function": {"name": self.spec.name, "description": desc,
                                                 "parameters": self.schema()}}

    def validate(self, arguments: dict) -> dict:
        """Arguments from the model -> a complete, checked argument dict (defaults filled); ToolError otherwise."""
        if self.spec.clamp:
            arguments = self._clamped(arguments)
        try:
            out = self._model.model_validate(arguments).model_dump(exclude_none=True)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                                 for err in e.errors())
            raise ToolError(f"invalid arguments for {self.spec.name}: {problems}") from None
        rel = self.spec.relative  # without a direction, the absolute arguments are required
        missing = [k for k in (rel.otherwise_required if rel and not rel.applies(out) else []) if k not in out]
        if missing:
            raise ToolError(f"invalid arguments for {self.spec.name}: {missing[0]}: Field required (or give "
                            f"{rel.parameter})")
        return out

    def done_text(self, args: dict) -> str:
        return fill_words(self.spec.done, args) if self.spec.done else f"you used {self.spec.name}"

    def say_lines(self, args: dict, result: dict | None = None) -> list[str]:
        """The lines to speak, filled from the arguments and the result's fields (a list read as "a, b and c")."""
        spoken = {k: _spoken_list(v) for k, v in (result or {}).items() if isinstance(v, list | str | int | float)}
        return [fill_words(t, {**spoken, **args}) for t in self.spec.say]

    def result_for_model(self, result: dict) -> str:
        """A successful result in the tool's words ("" = the model reads the JSON)."""
        if not self.spec.result_text:
            return ""
        flat = {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in result.items()}
        if isinstance(flat.get("names"), str) and isinstance(result.get("descriptions"), list):  # name: what, ...
            flat["listing"] = "; ".join(f"{n.replace('_', ' ')} ({d.rstrip('.')})" if d else n.replace("_", " ")
                                        for n, d in zip(result["names"], result["descriptions"]))
        return fill_words(self.spec.result_text, flat)

    def request_fields(self, args: dict) -> dict[str, Any]:
        """Validated arguments -> {goal/request field path: value}; paths like "target.head_yaw"."""
        fields: dict[str, Any] = {}
        for path, value in self.spec.goal.items():
            if isinstance(value, ArgRef):
                raw = args.get(value.arg, value.default)
                if raw is None:
                    continue
                if value.map is not None:  # validated: raw is one of the enum values, every one of them mapped
                    raw = value.map[raw]
                if isinstance(raw, int | float) and not isinstance(raw, bool):
                    raw = raw * value.scale + value.offset
                fields[path] = raw
            else:
                fields[path] = value
        return fields

    def _clamped(self, arguments: dict) -> dict:
        out = dict(arguments)
        for pname, prop in self.spec.parameters.get("properties", {}).items():
            v = out.get(pname)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                lo, hi = prop.get("minimum", -math.inf), prop.get("maximum", math.inf)
                out[pname] = min(max(v, lo), hi)
        return out

    def _build_model(self) -> type[BaseModel]:
        schema = self.schema()
        required = set(schema.get("required", []))
        fields = {}
        for pname, prop in schema["properties"].items():
            ann = _annotation(prop)
            constraints = {k: prop[j] for j, k in (("minimum", "ge"), ("maximum", "le"), ("minLength", "min_length"),
                                                  ("maxLength", "max_length")) if j in prop}
            default = ... if pname in required else prop.get("default")
            fields[pname] = (ann if pname in required else ann | None, Field(default, **constraints))
        cfg = ConfigDict(extra="forbid", allow_inf_nan=False)
        return create_model(f"{self.spec.name}_args", __config__=cfg, **fields)


def _spoken_list(v: Any) -> Any:
    """A list as a person says it ("nod, shake_head and dance"); anything else as it is."""
    if not isinstance(v, list):
        return v
    items = [str(x) for x in v]
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"


def fill_words(template: str, values: dict) -> str:
    """`template` with {name} replaced by the value as words (underscores read as spaces); unknown names stay."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m[1]]).replace("_", " ") if m[1] in values else m[0],
                  template)


def _annotation(prop: dict) -> Any:
    if prop.get("enum"):
        return Literal[tuple(prop["enum"])]
    if prop["type"] == "array":
        item_type = _JSON_TYPES[prop["items"]["type"]]
        return list[item_type]
    return _JSON_TYPES[prop["type"]]


class ToolRegistry:
    """The tools the model may call, by name."""

    def __init__(self, specs: list[ToolSpec]):
        self.tools: dict[str, Tool] = {}
        self._cache: list[dict] = []
        self._cache_key: tuple = ()
        for spec in specs:
            if spec.name in self.tools:
                raise ValueError(f"tool {spec.name!r} is declared twice")
            self.tools[spec.name] = Tool(spec)

    def openai_tools(self) -> list[dict]:
        """The tool list for the model (rebuilt only after an enum changed: it is on every turn's hot path)."""
        key = tuple(t.version for t in self.tools.values())
        if key != self._cache_key:
            taken = set(self.tools)
            self._cache, self._cache_key = [d for t in self.tools.values() for d in t.openai_tools(taken)], key
        return self._cache

    def resolve(self, call: ToolCallRequest) -> tuple[Tool, dict]:
        """A parsed call -> (tool, validated arguments); ToolError with a message meant for the model otherwise."""
        if call.error:
            raise ToolError(f"could not parse the tool call: {call.error}")
        tool = self.tools.get(call.name)
        arguments = call.arguments
        if tool is None:
            tool, arguments = self._by_enum_value(call.name, arguments)
        if tool is None:
            raise ToolError(f"unknown tool {call.name!r}; available tools: {', '.join(self.tools) or 'none'}")
        if arguments is None or not isinstance(arguments, dict):
            raise ToolError(f"arguments for {call.name} must be a JSON object")
        return tool, tool.validate(arguments)

    def resolution(self, name: str, arguments) -> tuple[str, dict] | None:
        """(tool name, validated arguments) that a call `name(arguments)` runs as, or None when it is refused (how
        benches and tests read the calls a model made)."""
        try:
            tool, args = self.resolve(ToolCallRequest("check", name, arguments))
        except ToolError:
            return None
        return tool.spec.name, args

    def _by_enum_value(self, name: str, arguments) -> tuple[Tool | None, dict | None]:
        """An expanded name (`dance`, `look_left`) means its tool with that value; a bare value of exactly one
        tool's enum_from parameter too (small models call animations by their names even when not offered so).
        The other arguments (an object, if any) still go through the tool's schema."""
        hits = [(t, t.spec.expand.parameter, v) for t in self.tools.values() for n, v in t.expanded().items()
                if n == name]
        if not hits:
            hits = [(t, t.spec.enum_from.parameter, name) for t in self.tools.values()
                    if t.spec.enum_from and t.enum_values and name in t.enum_values]
        if len(hits) != 1:
            return None, arguments
        tool, param, value = hits[0]
        rest = arguments if isinstance(arguments, dict) else {}
        return tool, {**rest, param: value}
