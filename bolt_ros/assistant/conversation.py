"""Conversation state: system prompt, bounded history, and a rolling scene memory built from captions.

The scene block goes into the user message of each turn (not the system prompt), and the history keeps that
message exactly as sent: the prompt prefix then never changes between turns, so an engine with prefix reuse
only prefills the new turn.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bolt_ros.assistant.config import SceneMemoryConfig
from bolt_ros.assistant.facts import FactNote
from bolt_ros.assistant.reply_text import norm


def approx_tokens(text: str) -> int:
    # ~4 characters per token for English with BPE/SPM vocabularies; the budget only needs to be roughly right
    return len(text) // 4 + 1


@dataclass
class SceneItem:
    text: str
    key: str           # normalized text: the dedup key
    first_seen: float  # monotonic seconds
    last_seen: float
    source: str = ""


class SceneMemory:
    """Recent captions, deduplicated (a repeated caption refreshes its age), bounded by age, count and tokens."""

    def __init__(self, cfg: SceneMemoryConfig, count_tokens: Callable[[str], int] = approx_tokens):
        self.cfg = cfg
        self.count_tokens = count_tokens
        self.items: list[SceneItem] = []  # oldest first

    def add(self, text: str, *, source: str = "", now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        text = " ".join(text.split())
        if not text:
            return
        key = re.sub(r"[^\w\s]", "", text.lower())
        for i, item in enumerate(self.items):
            if item.key == key:
                item.last_seen, item.text = now, text
                self.items.append(self.items.pop(i))
                break
        else:
            self.items.append(SceneItem(text, key, now, now, source))
        self._prune(now)

    def render(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        self._prune(now)
        if not self.items:
            return ""
        lines = [f"- {_age(now - it.last_seen)}: {it.text}" for it in self.items]
        return SCENE_HEADER + "\n" + "\n".join(lines)

    def tokens(self) -> int:
        return sum(self.count_tokens(it.text) + 4 for it in self.items)  # +4: the "- 3 s ago: " prefix

    def _prune(self, now: float) -> None:
        self.items = [it for it in self.items if now - it.last_seen <= self.cfg.max_age_s][-self.cfg.max_items:]
        while self.items and self.tokens() > self.cfg.max_tokens:
            self.items.pop(0)


SCENE_HEADER = "What you see (newest last):"
# The prompt's own markup in a reply: the scene block's header or a caption line's age prefix ("- just now:"), the
# memory note's header or its phrasing ('They said "..."', 'you answered "..."'). A small model at a loss reads these
# out: in a typed make run "Do it again!" was answered with the scene block, and another turn with 'They said "Look
# to your left."', a copy of the note's pattern that shares no six words with it.
PROMPT_MARKUP = re.compile(r"what you see \(newest last\)|(?:^|[\[\n])\s*-\s*(?:just now|\d+ s ago|\d+ min ago):"
                           r"|earlier in this conversation|\(?oldest first\)?:"
                           # the memory announced as a header ("The old conversation:", held out 3, 2026-12-05)
                           r"|\bconversation\s*:\s*$"
                           r"|\b(?:they said|you answered)\s*[\"\u201c]",
                           re.IGNORECASE)


def _age(seconds: float) -> str:
    s = max(0, round(seconds))
    return "just now" if s < 1 else f"{s} s ago" if s < 120 else f"{s // 60} min ago"


MEMORY_HEADER = "Earlier in this conversation (oldest first):"


@dataclass
class TurnRecord:
    """One finished turn as the robot remembers it."""
    said: str                 # the person's words
    reply: str                # what the robot said
    done: list[str]           # what its calls did ("you played your dance animation")
    moves: list[str] = field(default_factory=list)  # the names of its calls that succeeded, in order


class Conversation:
    """System prompt, the turns so far, and how they are shown to the model.

    `history="verbatim"`: the earlier turns' messages as they were (calls, tool results, replies), bounded by
    `max_messages`. `history="memory"`: no earlier messages; instead a second system message holds a short memory of
    the last `memory_turns` turns (what the person said, what the robot answered or did). Measured
    on the default 0.5B model (bench/bench_conversation.py, docs/conversation.md): shown its own earlier replies
    verbatim, it answers later requests in words, claims motions it never made and copies replies; with each turn
    shaped like a fresh conversation it keeps its single-turn behaviour, and the memory keeps follow-ups ("one more
    time", "the other way") answerable. The prompt prefix (system prompt and tools) stays the same every turn, so
    the engine's prefix reuse still prefills only the memory and the new user message.
    """

    def __init__(self, system_prompt: str, max_messages: int = 16, *, history: str = "verbatim",
                 memory_turns: int = 6, memory_replies: bool = True, keep_last_call: bool = False,
                 facts_in_prompt: bool = True):
        self.system_prompt = system_prompt
        self.max_messages = max_messages
        self.history_mode, self.memory_turns, self.memory_replies = history, memory_turns, memory_replies
        self.keep_last_call = keep_last_call
        self.history: list[dict] = []
        self.records: list[TurnRecord] = []
        self.facts = FactNote()  # what the person told about themselves (facts.py): memory mode only
        # whether the words model is shown the fact note (else the robot alone answers it back: FactNote.answer)
        self.facts_in_prompt = facts_in_prompt
        # the robot's fallback lines said in this conversation (ToolLoop's at-a-loss): the memory does not quote
        # them, since shown them the model copies them and the copy is held back again, turn after turn
        self.unquoted: set[str] = set()
        # the move the robot offered to show in its last reply ("Want me to show you?"): a yes plays it
        self.offered: str | None = None

    def user_message(self, utterance: str, scene: str = "") -> dict:
        content = f"[{scene}]\n{utterance}" if scene else utterance
        return {"role": "user", "content": content}

    def memory(self, skip_last: bool = False) -> str:
        """The last turns in a few words each (but the very last with skip_last); "" before the first."""
        lines = []
        records = self.records[:-1] if skip_last else self.records
        for r in records[-self.memory_turns:]:
            acts = " and ".join(r.done)
            if acts:
                what = acts
            elif r.reply and self.memory_replies and norm(r.reply) not in self.unquoted:
                what = f'you answered "{_clip(r.reply, 90)}"'
            else:
                what = "you answered"
            lines.append(f'- They said "{_clip(r.said, 90)}"; {what}.')
        # Tried: a header without "conversation" and lines `- "..." -> you ...` (the 0.5B model starts replies with
        # "Based on the conversation, ..."): 61/84 turns right at seed 0 against 56, but 39 against 54 at seed 1,
        # where it fell into "You can call the function ..." (bench_conversation, docs/conversation.md)
        return MEMORY_HEADER + "\n" + "\n".join(lines) if lines else ""

    def last_move(self) -> str | None:
        """The name of the robot's last successful call in this conversation ("again" repeats it)."""
        return next((r.moves[-1] for r in reversed(self.records) if r.moves), None)

    def recent_replies(self, n: int = 12) -> list[str]:
        return [r.reply for r in self.records[-n:] if r.reply]

    def messages(self, pending: list[dict] = ()) -> list[dict]:
        """The full prompt: system, then the history (verbatim mode) or the memory (a second system message: the
        0.5B model copied a memory placed in the user message into its reply), then the turn in progress."""
        if self.history_mode == "verbatim":
            earlier = self.history
        else:
            # keep_last_call: the last turn stays as it was when it acted (its call as the model wrote it): "one more
            # time" and "the other way" refer to it, and without it the model copied the memory note instead of
            # calling; but then it called a tool for whatever came next (greetings, thanks, questions), turn after
            # turn, so it is off by default (docs/conversation.md)
            last = self._last_turn() if self.keep_last_call else []
            # ... less the line it spoke after the call: shown "Looking left.", the model answered "Now the other
            # way" with "Looking right." and no call
            last = [m for m in last if m["role"] != "assistant" or m.get("tool_calls")] if any(
                m.get("tool_calls") for m in last) else []
            memory, facts = self.memory(skip_last=bool(last)), self.facts.render() if self.facts_in_prompt else ""
            earlier = [{"role": "system", "content": m} for m in (facts, memory) if m]
            earlier += last
        return [{"role": "system", "content": self.system_prompt}, *earlier, *pending]

    def _last_turn(self) -> list[dict]:
        start = max((i for i, m in enumerate(self.history) if m["role"] == "user"), default=len(self.history))
        return self.history[start:]

    def fitted(self, pending: list[dict], fits: Callable[[list[dict]], bool]) -> list[dict]:
        """messages(pending), after dropping the oldest whole turns until fits(prompt) holds (the prompt must fit
        the model's context with room for the reply). With no history left it is returned as it is: the system
        prompt and the turn in progress are never cut (an utterance too long for the context is the engine's clear
        error, not a silently shortened question)."""
        msgs = self.messages(pending)
        while self.history and self.history_mode == "verbatim" and not fits(msgs):
            self._drop_oldest_turn()
            msgs = self.messages(pending)
        return msgs

    def commit(self, turn: list[dict], record: TurnRecord | None = None) -> None:
        """Append a finished (or interrupted) turn and trim the oldest turns to the bound."""
        self.history.extend(turn)
        while len(self.history) > self.max_messages:
            self._drop_oldest_turn()
        if record is not None:
            self.records = [*self.records, record][-max(self.memory_turns, 16):]
            if not record.moves:  # a request's words tell what to do, not about the person
                self.facts.add(record.said)

    def _drop_oldest_turn(self) -> None:
        # drop whole turns: cut up to the next user message so no tool result loses its call
        nxt = next((i for i, m in enumerate(self.history[1:], 1) if m["role"] == "user"), len(self.history))
        del self.history[:nxt]


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."
