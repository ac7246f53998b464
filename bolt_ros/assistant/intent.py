"""Act or talk, decided before any words: a few-shot classifier over the robot's moves.

Measured on the default 0.5B model (bench/bench_conversation.py, docs/conversation.md): asked to reply to a person
with tools on offer, it chose wrongly in about a quarter of the turns of a long conversation - statements of
feeling played the matching animation, requests were answered in words that claimed the move, follow-ups ("now the
other way") had no referent, and it talked about "the function ...". As a classifier over a closed list of labels,
shown two dozen examples, the same model picks the right one far more often, and it costs one short prefill: the
examples are a constant prefix kept in the classifier's own KV cache, so a turn runs only the person's words.

The labels are the robot's parameterless tools (one per animation and head direction, `ToolSpec.expand`), plus
`talk` (the turn is answered in words), `repeat` (the last move once more) and `reverse` (its opposite, from
`IntentConfig.opposites`): the robot resolves "again" and "the other way" from what it did, not the model.
Each label's probability is exact over the closed set (engine.decode.choice), and the likeliest wins.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.config import IntentConfig
from bolt_ros.engine.decode.choice import check_prefix_free, option_probabilities

TALK, REPEAT, REVERSE = "talk", "repeat", "reverse"


@dataclass
class Decision:
    label: str                       # the winner: a tool's name, talk, repeat or reverse
    p: float                         # its probability over the labels
    call: ToolCallRequest | None     # the call to run (repeat / reverse resolved); None: answer in words
    probs: dict[str, float] = field(default_factory=dict)


class IntentClassifier:
    """Decides each turn's intent on `engine` (any chat GGUF), in a KV cache of its own."""

    def __init__(self, engine, cfg: IntentConfig):
        self.engine, self.cfg = engine, cfg
        self.session = engine.new_session()
        self._built_for: tuple[str, ...] | None = None
        self._names: list[str] = []         # label i's real name (tool name or talk/repeat/reverse)
        self._options: list[list[int]] = []  # label i's tokens, as the classifier writes it (its alias)
        self._prompt: list[dict] = []
        self._ids = itertools.count(1)
        self._opposite = {**cfg.opposites, **{b: a for a, b in cfg.opposites.items()}}

    @classmethod
    def create(cls, cfg: IntentConfig, backend) -> IntentClassifier | None:
        """The configured classifier, or None when it is off. model_path `same` shares the embedded backend's
        engine (weights and all); with a backend that has none (a server, a script) the model decides, as with
        the classifier off. Another model_path is loaded beside the backend."""
        if not cfg.enabled:
            return None
        if cfg.model_path == "same":
            engine = getattr(backend, "engine", None)
            if engine is None:
                return None
        else:
            from bolt_ros.engine.decode.generate import Engine
            from bolt_ros.engine.default_models import resolve_model
            engine = Engine.load(resolve_model(cfg.model_path), n_ctx=2048)
        return cls(engine, cfg)

    # ---- the prompt ---------------------------------------------------------------------------------------------
    def labels_for(self, tools: list[dict]) -> list[str]:
        """The labels these tools give: talk, every tool without required arguments, then repeat / reverse."""
        names = [t["function"]["name"] for t in tools
                 if not (t["function"].get("parameters") or {}).get("required")]
        return [TALK, *names] + ([REPEAT, REVERSE] if names else [])

    def _build(self, tools: list[dict]) -> None:
        names = self.labels_for(tools)
        if tuple(names) == self._built_for:
            return
        alias = self.cfg.aliases.get
        tok = self.engine.tok
        shown = [alias(n, n) for n in names]
        options = [tok.encode(s, add_bos=False) for s in shown]
        try:
            check_prefix_free(options)  # a clear error when the tools change, not in every turn
        except ValueError as e:
            raise ValueError(f"intent labels {shown}: one is the start of another ({e}); rename one with "
                             "intent.aliases") from e
        prompt = [{"role": "system", "content": self.cfg.instructions.format(labels=", ".join(shown))}]
        for ex in self.cfg.examples:
            if ex.do in names:  # an example for an animation this robot lacks is left out
                prompt += [{"role": "user", "content": ex.say}, {"role": "assistant", "content": alias(ex.do, ex.do)}]
        self._names, self._options, self._prompt, self._built_for = names, options, prompt, tuple(names)

    def _ids_for(self, utterance: str) -> list[int]:
        fmt, tok = self.engine.chat_format, self.engine.tok
        return tok.encode_segments(fmt.render([*self._prompt, {"role": "user", "content": utterance}]),
                                   add_bos=tok.add_bos)

    def prime(self, tools: list[dict], cancel: threading.Event | None = None) -> int:
        """Run the constant prefix (instructions, examples) into the classifier's cache now; returns tokens run."""
        self._build(tools)
        a, b = self._ids_for("a"), self._ids_for("b")
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return self.engine.prime(a[:n], self.session, use_draft=False, cancel=cancel)

    # ---- a turn -------------------------------------------------------------------------------------------------
    def decide(self, utterance: str, tools: list[dict], last_move: str | None = None, *,
               cancel: threading.Event | None = None) -> Decision | None:
        """The turn's intent; None when cancelled. `last_move`: the name of the robot's last successful
        parameterless call (what repeat / reverse act on); with none, repeat and reverse are answered in words."""
        self._build(tools)
        probs = option_probabilities(self.engine, self.session, self._ids_for(utterance), self._options,
                                     cancel=cancel)
        if probs is None:
            return None
        by_name = dict(zip(self._names, probs))
        label = max(by_name, key=by_name.get)
        target = label
        if label == REPEAT:
            target = last_move
        elif label == REVERSE:
            target = self._opposite.get(last_move or "")
        if target is None or target == TALK or target not in by_name:
            return Decision(label, by_name[label], None, by_name)
        return Decision(label, by_name[label], ToolCallRequest(f"intent_{next(self._ids)}", target, {}), by_name)
