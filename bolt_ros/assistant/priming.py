"""The assistant's work between turns, ROS-free: priming, readiness, and the speculative start (issue 33).

- **Priming**: the conversation's next prompt up to the person's words goes into the engine's cache while nobody
  talks (the intent classifiers' examples too), so a turn prefills only its own message.
- **Ready means ready**: `ready` turns true when the first priming is done (or at once for a backend that has
  none to do); the node says so on `assistant/events` (a STATE event, state `ready`) and the console prints it.
  A turn that comes while priming runs cancels it (`interrupt`): the turn runs first, priming resumes after it.
- **The speculative start**: the speech recognizer publishes its speculative transcript when the ASR it started at
  the person's pause is done and the turn has not ended yet. On it, the intent decision and the prefill of the
  person's message run now; when the final transcript is the same words, the turn takes the decision as made and
  finds its message in the cache. When it differs the work is dropped (the decision is never used; the cache
  keeps only the common prefix). Nothing is said or moved here: that waits for the turn.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bolt_ros.assistant.reply_text import norm

PRIMING, READY = "priming", "ready"   # AssistantEvent STATE values beside idle / thinking / speaking / acting
# The speculative words and the final transcript come on two topics within milliseconds of each other (the words
# that end the turn are the speculative ones), in either order. Words that arrive after their own turn came are
# stale: worked on, they cost the next priming ~0.5 s of a busy worker and the cache its primed prompt.
STALE_S = 3.0


def _key(utterance: str, tools: list[dict], last_move: str | None) -> tuple:
    return norm(utterance), tuple(t["function"]["name"] for t in tools), last_move


class SpeculativeIntent:
    """An IntentClassifier whose decide() answers with the decision made on the speculative transcript, when the
    words, the tools and the last move are the same; otherwise it decides as the classifier does."""

    def __init__(self, intent):
        self.intent = intent
        self._kept: tuple[tuple, object] | None = None
        self.reused = 0

    def __getattr__(self, name):   # prime, labels_for, cfg ...: the classifier's own
        return getattr(self.intent, name)

    def speculate(self, utterance: str, tools: list[dict], last_move: str | None,
                  cancel: threading.Event | None = None):
        decision = self.intent.decide(utterance, tools, last_move, cancel=cancel)
        self._kept = None if decision is None else (_key(utterance, tools, last_move), decision)
        return decision

    def decide(self, utterance: str, tools: list[dict], last_move: str | None = None, *,
               cancel: threading.Event | None = None):
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == _key(utterance, tools, last_move):
            self.reused += 1
            return kept[1]
        return self.intent.decide(utterance, tools, last_move, cancel=cancel)


class Primer:
    """Runs on the assistant's worker while it has no turn (see the module doc). `backend`: the chat backend (its
    `prime`, if it has one); `intent`: the IntentClassifier or None; `log(level, text)`."""

    def __init__(self, backend, intent, *, prefill: bool, log: Callable[[str, str], None]):
        self.backend, self.prefill, self.log = backend, prefill, log
        self.intent = SpeculativeIntent(intent) if intent is not None else None
        self._prime = getattr(backend, "prime", None) if prefill else None
        self.ready = threading.Event()
        self._cancel = threading.Event()        # the work in progress: set by interrupt()
        self._lock = threading.Lock()
        self._speculating: str | None = None    # the speculative words being worked on
        self._spec_done: str | None = None      # ... and the last ones whose work is done
        self._last_turn: tuple[str, float] | None = None   # the newest turn's words, and when it came
        self.counts = {"speculative": 0, "hits": 0, "misses": 0, "primed": 0, "prime_interrupted": 0, "stale": 0}

    # ---- the executor's side: quick ----------------------------------------------------------------------------
    def interrupt(self, utterance: str | None) -> None:
        """A turn comes (its words; None for a stop): priming gives way; speculative work on other words too."""
        with self._lock:
            spec = self._speculating
            if spec is None or utterance is None or norm(spec) != norm(utterance):
                self._cancel.set()
            if utterance is not None:
                self._last_turn = (norm(utterance), time.monotonic())

    def claim(self, utterance: str) -> None:
        """The worker starts a turn: the speculation before it (finished: the same thread ran it) was a hit when it
        was on the same words, else a miss; counted once."""
        with self._lock:
            spec, self._spec_done = self._spec_done, None
        if spec is not None:
            self.counts["hits" if norm(spec) == norm(utterance) else "misses"] += 1

    # ---- the worker's side ---------------------------------------------------------------------------------------
    def _begin(self, closing: threading.Event) -> threading.Event:
        with self._lock:
            self._cancel = threading.Event()
            if closing.is_set():
                self._cancel.set()
            return self._cancel

    def prime(self, messages: list[dict], tools: list[dict], closing: threading.Event) -> bool:
        """The next prompt up to the person's words into the caches (the intent classifiers' examples first);
        True unless a turn interrupted it (done, nothing to do, or failed: the turn prefills what is missing)."""
        cancel = self._begin(closing)
        t0 = time.perf_counter()
        try:
            n = self.intent.prime(tools, cancel=cancel) if self.intent is not None and self.prefill else 0
            if self._prime is not None and not cancel.is_set():
                n += self._prime(messages, [] if self.intent else tools, cancel=cancel)
        except Exception as e:  # only a head start: the turn itself runs whatever was not prefilled
            self.log("warning", f"prefilling the next turn failed: {type(e).__name__}: {e}")
            return True   # nothing more to do here: the robot is as ready as it gets
        if cancel.is_set():
            self.counts["prime_interrupted"] += 1
            self.log("info", "priming gave way to a turn")
            return False
        self.counts["primed"] += 1
        self.log("debug", f"next turn prefilled: {n} tokens in {(time.perf_counter() - t0) * 1e3:.0f} ms")
        return True

    def mark_ready(self) -> bool:
        """True the first time: the caller says so."""
        if self.ready.is_set():
            return False
        self.ready.set()
        return True

    def speculate(self, utterance: str, messages: Callable[[str], list[dict]], tools: list[dict],
                  last_move: str | None, closing: threading.Event) -> None:
        """The speculative transcript's work: the intent decision, then (talk) the prefill of the person's message.
        messages(utterance): the prompt as the turn would send it, the person's message last. Words whose turn
        already came are left alone (STALE_S)."""
        with self._lock:
            last = self._last_turn
        if last is not None and last[0] == norm(utterance) and time.monotonic() - last[1] < STALE_S:
            self.counts["stale"] += 1
            return
        cancel = self._begin(closing)
        with self._lock:
            self._speculating, self._spec_done = utterance, None
        self.counts["speculative"] += 1
        t0 = time.perf_counter()
        what = "prefill"
        try:
            decision = None
            if self.intent is not None:
                decision = self.intent.speculate(utterance, tools, last_move, cancel=cancel)
                what = f"intent {decision.label if decision else '-'}"
            if (decision is None or decision.call is None) and self._prime is not None and not cancel.is_set():
                self._prime(messages(utterance), [] if self.intent else tools, cancel=cancel)
        except Exception as e:  # a head start only
            self.log("warning", f"speculative start failed: {type(e).__name__}: {e}")
        finally:
            with self._lock:   # the next turn claims it (a cancelled one was for other words: a miss)
                self._speculating, self._spec_done = None, utterance
        self.log("debug", f"speculative start on {utterance!r}: {what} in {(time.perf_counter() - t0) * 1e3:.0f} ms"
                 + (" (dropped)" if cancel.is_set() else ""))
