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

A move is checked by a second few-shot classifier that only says whether the person asks the robot for something
(`yes` / `no`, `IntentConfig.confirm_*`), asked only when the first chose a move (a talk turn pays nothing). The two
are pooled as a product of experts with no weight or threshold to tune: the move runs when
p1(move) * p2(yes) > p1(talk) * p2(no). The first classifier maps a feeling to its animation ("I'm feeling a bit
sad" -> sad with 0.55); the second hears a statement, not a request (yes 0.08). Measured with
bench/bench_conversation.py and both held-out sets (docs/conversation.md).
"""
from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass, field, replace

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.config import IntentConfig
from bolt_ros.assistant.facts import asks_name
from bolt_ros.assistant.idioms import ability_move, idiom_move, knows_how
from bolt_ros.assistant.mention import is_mention, is_question, without_openers
from bolt_ros.engine.decode.choice import check_prefix_free, option_probabilities

TALK, REPEAT, REVERSE = "talk", "repeat", "reverse"
# issue 34: "a bit more to the right" (FURTHER: the head on from where it is, `move_head`'s relative call, named
# FURTHER_CALL by its direction), "show me!" after "do you know how to dance?" (POINT_BACK: the move the last turns
# were about) and "who is there?" (SEE: answered from the newest caption, tool_loop/scene.py)
FURTHER, POINT_BACK, SEE = "further", "that", "see"
FURTHER_CALL = "more_{direction}"  # config/assistant.yaml: move_head's expand name (offer: false)
_WORDS = {"left": "left", "right": "right", "up": "up", "higher": "up", "upwards": "up", "upward": "up",
          "ceiling": "up", "sky": "up", "down": "down", "lower": "down", "downwards": "down", "downward": "down",
          "floor": "down", "ground": "down"}
_ALL = re.compile(r"\b(all the way|as far as|fully|completely|to the max|maximum)\b", re.IGNORECASE)
_MORE = re.compile(r"\b(more|further|farther|keep|bit|little|all the way|again|extra|on)\b", re.IGNORECASE)
_BIT = re.compile(r"\b(bit|little|slightly|touch|tad|tiny|smidge|inch)\b", re.IGNORECASE)
YES, NO = "yes", "no"  # the second classifier's answers


@dataclass
class Decision:
    label: str                       # the winner: a tool's name, talk, repeat or reverse
    p: float                         # its probability over the labels
    call: ToolCallRequest | None     # the call to run (repeat / reverse resolved); None: answer in words
    probs: dict[str, float] = field(default_factory=dict)
    p_request: float | None = None   # the second classifier's p(yes) when it was asked (the first chose a move)
    vetoed: str | None = None        # the first classifier's move that the pooled evidence turned into talk
    idiom: bool = False              # the move came from an idiom the words hold (idioms.py), not the classifiers
    offer: str | None = None         # talk: an ability question's move ("Do you know how to dance?"), offered


class FewShot:
    """A classifier prompt (instructions, then examples as chat turns) over a closed set of one-word answers, in a
    KV cache of its own: the prompt is a constant prefix, so a turn runs only the person's words."""

    def __init__(self, engine, instructions: str, examples: list[tuple[str, str]], names: list[str],
                 shown: list[str]):
        self.engine, self.names = engine, names
        self.session = engine.new_session()
        self.options = [engine.tok.encode(s, add_bos=False) for s in shown]  # name i as the classifier writes it
        try:
            check_prefix_free(self.options)  # a clear error when the labels are made, not in every turn
        except ValueError as e:
            raise ValueError(f"intent labels {shown}: one is the start of another ({e}); rename one with "
                             "intent.aliases") from e
        self.prompt = [{"role": "system", "content": instructions}]
        for say, do in examples:
            self.prompt += [{"role": "user", "content": say}, {"role": "assistant", "content": do}]

    def ids_for(self, utterance: str) -> list[int]:
        fmt, tok = self.engine.chat_format, self.engine.tok
        return tok.encode_segments(fmt.render([*self.prompt, {"role": "user", "content": utterance}]),
                                   add_bos=tok.add_bos)

    def prime(self, cancel: threading.Event | None = None) -> int:
        """Run the constant prefix into the cache now (it ends where the person's words begin); tokens run."""
        a, b = self.ids_for("a"), self.ids_for("b")
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return self.engine.prime(a[:n], self.session, use_draft=False, cancel=cancel)

    def probs(self, utterance: str, cancel: threading.Event | None = None) -> dict[str, float] | None:
        """Each name's probability for this utterance; None when cancelled."""
        p = option_probabilities(self.engine, self.session, self.ids_for(utterance), self.options, cancel=cancel)
        return None if p is None else dict(zip(self.names, p))


class IntentClassifier:
    """Decides each turn's intent on `engine` (any chat GGUF), in KV caches of its own."""

    def __init__(self, engine, cfg: IntentConfig):
        self.engine, self.cfg = engine, cfg
        self._built_for: tuple[str, ...] | None = None
        self._main: FewShot | None = None
        self._confirm = FewShot(engine, cfg.confirm_instructions, [(e.say, e.do) for e in cfg.confirm_examples],
                                [YES, NO], [YES, NO]) if cfg.confirm_instructions else None
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
        """The labels these tools give: talk, every tool without arguments, then repeat / reverse, further (with head
        turns to go on from), that, and see."""
        names = [t["function"]["name"] for t in tools
                 if not (t["function"].get("parameters") or {}).get("properties")]
        moves = [REPEAT, REVERSE] + ([FURTHER] if any(n.startswith("look_") for n in names) else []) + [POINT_BACK]
        return [TALK, *names] + (moves if names else []) + [SEE]

    def _build(self, tools: list[dict]) -> FewShot:
        names = self.labels_for(tools)
        if tuple(names) != self._built_for:
            alias = self.cfg.aliases.get
            shown = [alias(n, n) for n in names]
            # an example for an animation this robot lacks is left out
            examples = [(e.say, alias(e.do, e.do)) for e in self.cfg.examples if e.do in names]
            self._main = FewShot(self.engine, self.cfg.instructions.format(labels=", ".join(shown)), examples,
                                 names, shown)
            self._built_for = tuple(names)
        return self._main

    def prime(self, tools: list[dict], cancel: threading.Event | None = None) -> int:
        """Run the constant prefixes (instructions, examples) into the classifiers' caches now; tokens run."""
        n = self._build(tools).prime(cancel)
        return n + (self._confirm.prime(cancel) if self._confirm is not None else 0)

    # ---- a turn -------------------------------------------------------------------------------------------------
    def decide(self, utterance: str, tools: list[dict], last_move: str | None = None, *,
               cancel: threading.Event | None = None) -> Decision | None:
        """The turn's intent; None when cancelled. `last_move`: the name of the robot's last successful
        parameterless call (what repeat / reverse act on); with none, repeat and reverse are answered in words.
        A POINT_BACK decision acts on the last move here; point_back() finds what the earlier words were about."""
        by_name = self._build(tools).probs(utterance, cancel)
        if by_name is None:
            return None
        label = max(by_name, key=by_name.get)
        # act or talk is the first question, which act the second: with more labels for acts (more, that_move), a
        # request's mass spreads over them ("act happy!": answer 0.34, happy 0.22, that_move 0.11)
        acts = {k: v for k, v in by_name.items() if k not in (TALK, SEE)}
        p_act, mention = sum(acts.values()), is_mention(utterance)
        if label == TALK and p_act > by_name[TALK]:
            label = max(acts, key=acts.get)
        p_request = vetoed = None
        # an idiom or indirect request ("Rise and shine!", "Time to hit the hay.", "cut a rug"): its words name
        # another move or none, so the classifiers miss it; a fixed phrase is read by a rule (idioms.py)
        idiom = None if mention or knows_how(utterance) else idiom_move(utterance, by_name)
        if idiom is not None:
            label = idiom
        elif label not in (TALK, SEE) and mention:  # "She shook her head at me.": told, not asked (mention.py)
            label, vetoed = TALK, label
        if label not in (TALK, SEE) and self._confirm is not None and idiom is None:
            # without its opening "No, ..." / "Yes, ...": the yes/no classifier read the person's "No" as its answer
            # ("No turn left.": yes 0.23 with it)
            confirm = self._confirm.probs(without_openers(utterance), cancel)
            if confirm is None:
                return None
            p_request = confirm[YES]
            # product of experts over act / talk: no weight, no threshold
            if p_act * confirm[YES] <= by_name[TALK] * confirm[NO]:
                label, vetoed = TALK, label
        label = _by_form(label, utterance, by_name, mention)
        shown = _look_like(utterance, self.cfg.looks) if label in (TALK, SEE) and not mention else None
        if shown in by_name:  # "Can you look sleepy for me?": asked to show it
            label = shown
        elif label == TALK and not mention and not is_question(utterance):
            label = _named_order(utterance, by_name) or label
        args: dict = {}
        if label == FURTHER:
            target, args = further(utterance, last_move)
        elif label == POINT_BACK:
            target = last_move
        else:
            target = resolve_target(label, utterance, last_move, self._opposite)
        call = None
        if target is not None and ((target in by_name and target not in (TALK, SEE)) or _is_further(target)):
            call = ToolCallRequest(f"intent_{next(self._ids)}", target, args)
        # "Do you know how to dance?" left to words: an offer to show it, not the words model's "Yes, I can dance."
        offer = ability_move(utterance, by_name) if call is None and label == TALK and not mention else None
        return Decision(label, by_name[label], call, by_name, p_request, vetoed, idiom is not None, offer)

    def point_back(self, decision: Decision, earlier: list[str], tools: list[dict],
                   cancel: threading.Event | None = None) -> Decision:
        """A POINT_BACK decision ("Go on, show me!") acting on the move the person's earlier words (newest first)
        were about, if they were about one; else as decided (the last move, or words)."""
        target = self._pointed_at(earlier, tools, cancel) if decision.label == POINT_BACK else None
        if target is None:
            return decision
        return replace(decision, call=ToolCallRequest(f"intent_{next(self._ids)}", target, {}))

    def _pointed_at(self, earlier: list[str], tools: list[dict], cancel) -> str | None:
        """The move the person's last words were about ("Do you know how to dance?" -> dance): the first
        classifier's likeliest move for them, when it is a real contender (p >= POINTED_P) and not a head turn."""
        moves = [n for n in self._build(tools).names if n not in (TALK, REPEAT, REVERSE, FURTHER, POINT_BACK, SEE)]
        for words in list(earlier)[:2]:  # a move named by its words ("how to dance" -> dance)
            said = re.findall(r"[a-z]+", words.lower())
            named = [m for m in moves if all(any(w.startswith(part[:4]) for w in said) for part in m.split("_"))]
            if len(named) == 1:
                return named[0]
        for words in list(earlier)[:2]:
            probs = self._build(tools).probs(words, cancel)
            if probs is None:
                return None
            moves = {k: v for k, v in probs.items() if k not in (TALK, REPEAT, REVERSE, FURTHER, POINT_BACK, SEE)}
            best = max(moves, key=moves.get, default=None)
            if best is not None and moves[best] >= POINTED_P:
                return best
        return None


POINTED_P = 0.3  # an earlier utterance's move counts as what "show me" points at from this probability on


# what may open an order or a question before its first word ("Okay, ...", "Hey Bolt, ...")
_LEAD = r"^\W*(?:(?:ok(?:ay)?|now|please|so|and|hey|hmm|wait|bolt)\W+)*"
_CENTER = re.compile(r"\b(straight ahead|ahead|center|centre|front|forward|at me|to me|on me)\b", re.IGNORECASE)
_DIRECTION = re.compile(r"\b(left|right|up|down|higher|lower)\b", re.IGNORECASE)
# an order to look: "Look ...", "Have a look ...", "Okay, take a quick look ..."
_LOOK_ORDER = re.compile(_LEAD + r"(?:(?:have|take) a (?:quick |good |little )?)?"
                         r"(?:look|peek|glance)\b", re.IGNORECASE)
# an order to move the head a way, asked or told ("Can you tilt your head up like ...?", "Turn your head left."):
# the classifier weighed the rest of the sentence ("like you're looking at the stars": talk 0.60, look_up 0.31)
_HEAD_ORDER = re.compile(_LEAD + r"(?:(?:can|could|would|will) you\s+)?(?:please\s+)?"
                         r"(turn|tilt|move|raise|lift|lower|point|swing|tip|bring)\s+your\s+head\b([^,.;!?]*)",
                         re.IGNORECASE)
# a question of who or what is there ("Is anybody at the door?", "Is there something on the shelf?", "Who else is
# here?"): the classifier left some of these to the words model, which guessed ("Yes, there are people nearby.")
_PRESENCE = re.compile(_LEAD + r"(?:(?:is|are) (?:there )?"
                       r"(?:anyone|anybody|someone|somebody|anything|something|people)\b|who(?:'s| is| else)? "
                       r"(?:else )?(?:is )?(?:there|here|around)\b)", re.IGNORECASE)
_ABOUT_US = re.compile(r"\b(?:i|me|my|we|us|our|you can do|i can)\b", re.IGNORECASE)
_HEAD_VERB_WAY = {"raise": "up", "lift": "up", "lower": "down"}
_LOOK_AROUND = re.compile(r"\b(?:look|peek|glance)(?:ing)?\s+(?:all\s+)?around\b", re.IGNORECASE)


def _by_form(label: str, utterance: str, by_name: dict[str, float], mention: bool) -> str:
    """What the words' form settles over the classifier's label: "all the way to the left" is the head to its limit,
    not a fixed look (look_left 0.51, more 0.38 for it); "look straight ahead again" is the centre, not the last
    look once more (repeat had it turn right); "have a look around the room" is a move, not a question about the
    view (see 0.37, look_around 0.35; "Look around the room." see 0.80 after other examples were added): a view
    question is a question, an order to look around is not."""
    head = label.startswith("look_") and label != "look_center"
    if (head or label == FURTHER) and _ALL.search(utterance) and _DIRECTION.search(utterance):
        return FURTHER
    if label in (REPEAT, REVERSE, POINT_BACK, FURTHER) or head:  # not an animation: "dance in front of me"
        if _CENTER.search(utterance) and not _DIRECTION.search(utterance) and "look_center" in by_name:
            return "look_center"
    if label == SEE and asks_name(utterance):
        return TALK  # "Who am I, by the way?" is about the person, never answered from a caption (facts.py)
    if label == TALK and _PRESENCE.match(utterance) and not _ABOUT_US.search(utterance):
        return SEE  # "Is anybody at the door?": who or what is there, from the newest caption
    order = _HEAD_ORDER.match(utterance) if label in (SEE, TALK) and not mention else None
    if order:  # "Can you tilt your head up like you're looking at the stars?": the way it names
        ways = {_WORDS[w] for w in re.findall(r"[a-z]+", order[2].lower()) if w in _WORDS}
        ways = ways or {_HEAD_VERB_WAY.get(order[1].lower())} - {None}  # "lower your head": down
        if len(ways) == 1 and f"look_{next(iter(ways))}" in by_name:
            return f"look_{next(iter(ways))}"
        if not ways and _CENTER.search(order[2]) and "look_center" in by_name:
            return "look_center"
    if label in (SEE, TALK) and _LOOK_ORDER.match(utterance) and not is_question(utterance) and not mention:
        if _LOOK_AROUND.search(utterance) and "look_around" in by_name:
            return "look_around"
        if _CENTER.search(utterance) and not _DIRECTION.search(utterance) and "look_center" in by_name:
            return "look_center"  # "Look at me." (see 0.41)
    return label


_LOOK_LIKE = re.compile(_LEAD + r"(?:(?:can|could|would|will) you\s+)?"
                        r"(?:please\s+)?look\s+(?:a\s+)?(?:(?:little|bit|so|really|very|extra|super)\s+)*([a-z]+)",
                        re.IGNORECASE)


_SHOW_ME = re.compile(_LEAD + r"(?:(?:can|could|would|will) you\s+)?"
                      r"(?:please\s+)?show me\b", re.IGNORECASE)


def _look_like(utterance: str, looks: dict[str, str]) -> str | None:
    """The animation an order or question to look some way asks for ("Look happy if ...", "Could you look a bit
    tired?", "Show me your sleepy face"); None for anything else ("You look happy.", "Do I look tired?")."""
    m = _LOOK_LIKE.match(utterance)
    if m:
        return looks.get(m[1].lower())
    if _SHOW_ME.match(utterance):  # "Show me how a sleepy robot looks": the first word that names a look
        return next((looks[w] for w in re.findall(r"[a-z]+", utterance.lower()) if w in looks), None)
    return None


def _named_order(utterance: str, by_name: dict[str, float]) -> str | None:
    """The move an order names by its own words, verb first ("Shake your head if I'm wrong: the sun is cold." ->
    shake_head, "Wake up, I want to ask you something." -> wake_up): the classifier took both for talk (0.63, 0.73),
    the rest of the sentence outweighing its opening order."""
    words = re.findall(r"[a-z]+", without_openers(utterance).lower())
    named = [m for m in by_name if m not in (TALK, REPEAT, REVERSE, FURTHER, POINT_BACK, SEE) and words
             and words[0] == m.split("_")[0] and all(part in words for part in m.split("_"))]
    return named[0] if len(named) == 1 else None


def _is_further(name: str) -> bool:
    return any(name == FURTHER_CALL.format(direction=d) for d in set(_WORDS.values()))


def further(utterance: str, last_move: str | None) -> tuple[str | None, dict]:
    """"A bit more to the right" / "a little higher" / "all the way" -> (more_<direction>, {"amount": ...}): the
    direction the person names, else the one of the last head move (look_right, more_right); None without either."""
    said = [_WORDS[w] for w in re.findall(r"[a-z]+", utterance.lower()) if w in _WORDS]
    tail = (last_move or "").rsplit("_", 1)[-1]
    went = tail if tail in _WORDS.values() and (last_move.startswith("look_") or _is_further(last_move)) else None
    direction = said[-1] if said else went if _MORE.search(utterance) else None
    if direction is None:  # "come back to me" is no way on
        return None, {}
    every = _ALL.search(utterance)  # all the way: to the limit from wherever the head is
    if direction != went and not every:  # "and down" after a look up, "look down" first: a look that way
        return f"look_{direction}", {}
    amount = "all" if every else "bit" if _BIT.search(utterance) else "more"
    return FURTHER_CALL.format(direction=direction), {"amount": amount}


def resolve_target(label: str, utterance: str, last_move: str | None, opposite: dict[str, str]) -> str | None:
    """The move a label asks for: repeat is the last move, reverse its opposite. But a direction the person names is
    their own: "No, turn left." spoken over the robot came back from the ASR as "No turn left.", the classifier
    scored look_right highest (0.34; look_left 0.29, reverse 0.15) and the head turned right (issue 36). So when the
    utterance names exactly one move of an opposite pair by its word (look_left: "left"), a reverse, or that move's
    opposite, is that move."""
    if label == REVERSE and last_move and _is_further(last_move):  # the other way after "a bit more right": left
        last_move = "look_" + last_move.rsplit("_", 1)[-1]
    target = {REPEAT: last_move, REVERSE: opposite.get(last_move or "")}.get(label, label)
    said = set(re.findall(r"[a-z]+", utterance.lower()))
    named = [m for m in opposite if m.rsplit("_", 1)[-1] in said]
    if len(named) == 1 and (label == REVERSE or opposite.get(label) == named[0]):
        return named[0]
    return target
