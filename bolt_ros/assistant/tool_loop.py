"""One assistant turn: model call -> tool calls -> results back to the model -> ... -> final reply.

Bounded: at most `max_tool_rounds` model calls may use tools; the call after that may only be words (the backend's
`words_only`: OpenAI's tool_choice "none", a grammar in the embedded engine). A call that repeats one already done
in the turn (same name and arguments: small models do that after reading the result) never runs again: the model is
asked once more for words only, so the turn ends in speech rather than in silence (unless it has spoken already),
and a call written as text (a reply that opens with `{` or a call tag) is never spoken. Spoken replies end: after
`max_sentences` complete sentences in a turn, or at the first sentence that repeats one already spoken in it (small
models loop: "I can see it. I can see it. ..."), the model call is stopped (its stream closed) and the rest is never
spoken. Cancellation (barge-in) is checked between streamed events and between tool calls.
Everything the outside world needs (text, sentences for TTS, tool calls and results, state changes, errors) is
reported through `emit` as it happens.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from difflib import SequenceMatcher

from bolt_ros.assistant import turn_parts as parts
from bolt_ros.assistant.backend import ChatBackend, Finished, TextDelta, ThoughtDelta, ToolCallRequest
from bolt_ros.assistant.conversation import PROMPT_MARKUP, Conversation
from bolt_ros.assistant.facts import FACTS_HEADER, person_names, takes_their_name
from bolt_ros.assistant.idioms import is_yes
from bolt_ros.assistant.intent import POINT_BACK, SEE
from bolt_ros.assistant.mention import is_question
from bolt_ros.assistant.reply_text import (
    CALL_AS_TEXT,
    DRAFTED,
    REFUSAL,
    ngrams,
    norm,
    read_out,
    said_before,
    unaddress,
    unframe,
)
from bolt_ros.assistant.scene import follows_view, newest_caption, see_options
from bolt_ros.assistant.sentences import SentenceSplitter, sentence_count
from bolt_ros.assistant.tools import ToolOutcome, correction_line
from bolt_ros.assistant.turn_parts import LoopEvent, TurnResult
from bolt_ros.engine.errors import PromptTooLong

IDLE, THINKING, SPEAKING, ACTING = "idle", "thinking", "speaking", "acting"
ToolCaller = Callable[[ToolCallRequest, threading.Event], ToolOutcome]


class ToolLoop:
    too_long = ("That's more than I can take in at once. Could you say it in fewer words?",)  # config: too_long

    def __init__(self, backend: ChatBackend, call_tool: ToolCaller, emit: Callable[[LoopEvent], None], *,
                 max_tool_rounds: int = 3, max_sentences: int = 0, at_a_loss: list[str] = (), intent=None,
                 own_name: str = "", at_a_loss_told: list[str] = ()):
        self.backend = backend
        self.own_name = own_name  # the robot's name: never said to address the person (reply_text.unaddress)
        self.intent = intent  # an IntentClassifier: act or talk is decided before the model's words (intent.py)
        self.at_a_loss = list(at_a_loss)  # lines for a turn that would end in silence: nothing spoken, nothing done
        # ... when the person told something rather than asked ("See you tomorrow." got "Sorry, I'm not sure what
        # you mean."): a line that takes it in; none: at_a_loss for every turn
        self.at_a_loss_told = list(at_a_loss_told)
        self.call_tool = call_tool
        self.emit = emit
        self.max_tool_rounds = max_tool_rounds
        self.max_sentences = max_sentences  # 0 = no limit
        self._state = IDLE
        self._reworded = False  # a sentence of this model call was spoken without its framing (unframe)
        self._held: str | None = None  # a short opening waiting for the next sentence (_speak)
        self._utterance, self._said_before = "", set()  # what a model's sentence must not parrot (_parrots)
        self._names: set[str] = set()  # the person's names (facts.person_names): never the robot's own
        self._turn: tuple[Conversation, TurnResult, threading.Event] | None = None  # the running turn (acknowledge)
        self._acked: str | None = None  # a motion's line said as the robot started moving (acknowledge)

    def run(self, conv: Conversation, user_msg: dict, tools: list[dict], *, enable_thinking: bool,
            cancel: threading.Event, t0: float | None = None, utterance: str | None = None) -> TurnResult:
        """One turn. utterance: the person's own words (without the scene block), for the intent classifier."""
        t0 = time.perf_counter() if t0 is None else t0
        res = TurnResult(messages=[user_msg])
        self._turn, self._acked = (conv, res, cancel), None
        self._utterance, self._asked = norm(utterance or ""), utterance or ""
        self._names = person_names(utterance or "", conv.facts.names)  # never said as the robot's own name
        self._said_before = said_before(conv.recent_replies(PARROT_TURNS))
        self._replied_before = {norm(r) for r in conv.recent_replies(PARROT_TURNS)}  # whole replies
        try:
            if self.intent is not None and utterance is not None:
                self._decided_turn(conv, utterance, res, tools, enable_thinking, cancel, t0)
            else:
                self._model_turn(conv, res, tools, enable_thinking, cancel, t0)
        except PromptTooLong as e:  # words longer than the context: the person is told, not a failed turn
            res.stats["too_long_tokens"] = e.n_tokens
            self._say_line(parts.fresh_line(conv, self.too_long), res)
        except Exception as e:  # a failing engine ends the turn with an error event; the node keeps running
            res.error = f"{type(e).__name__}: {e}"
            self.emit(LoopEvent("error", res.error))
        return self._finish(conv, res, t0)

    def _decided_turn(self, conv, utterance, res, tools, enable_thinking, cancel, t0) -> None:
        """The intent classifier decides: its call runs (then the tool's own line, or words over a result the
        model must read) or the model answers in words, with no tools shown (so no call, and no talk of them)."""
        self._set_state(THINKING)
        res.t_request = time.perf_counter()
        offered, conv.offered = conv.offered, None
        decision = self.intent.decide(utterance, tools, conv.last_move(), cancel=cancel)
        if decision is not None and decision.call is None and offered and is_yes(utterance):
            # "Want me to show you?" - "Yes, please!": the offered move
            call = ToolCallRequest(f"offer_{offered}", offered, {})
            decision = replace(decision, label=offered, call=call, offer=None)
        if decision is not None and decision.label == POINT_BACK:  # "show me!": what the last turns were about
            decision = self.intent.point_back(decision, [r.said for r in reversed(conv.records[-2:])], tools, cancel)
        if decision is None or cancel.is_set():
            res.cancelled = True
            return
        res.stats.update(intent=decision.label, intent_p=round(decision.p, 3),
                         intent_ms=(time.perf_counter() - res.t_request) * 1e3)
        told = conv.facts.answer(utterance) if decision.call is None else ""
        if told:  # "what's my name?", "when is my party?": what they told (facts.py), never a caption
            return self._say_line(told, res)
        view = decision.label == SEE or (decision.call is None and follows_view(utterance, conv.recent_replies(1)))
        caption = newest_caption(res.messages[0].get("content") or "") if view else ""
        if caption:  # "who is there?": what the camera saw last, in the caption's words (scene.py)
            return self._say_line(parts.fresh_line(conv, see_options(caption)), res)
        offers = [x.strip() for x in getattr(self.intent.cfg, "offer", "").split("|") if x.strip()]
        if decision.offer and offers:  # "Do you know how to dance?": "Yes! Want me to show you?" (idioms.py)
            conv.offered = decision.offer
            return self._say_line(parts.fresh_line(conv, offers), res)
        if decision.call is not None:
            call = decision.call
            res.stats.setdefault("ttft_ms", (time.perf_counter() - t0) * 1e3)
            self.emit(LoopEvent("tool_call", call=call))
            res.messages.append(parts.assistant_message("", [call]))
            self._run_tools([call], res, cancel, allowed=True)
            if res.cancelled or self._say_instead(conv, res.tool_results, res):
                return
        # a question's answer is drawn cooler (IntentConfig.question_temperature): at 0.7 the 0.5B model said "14
        # days in a week" and "we live on Mars"; a redraw goes back to the backend's own warmth
        cool = getattr(self.intent.cfg, "question_temperature", None) if is_question(utterance) else None
        for attempt in range(1 + (RESAMPLES if getattr(self.backend, "samples", True) else 0)):
            self._model_call(conv, res, tools, enable_thinking, cancel, t0, words_only=True, attempt=attempt,
                             temperature=None if attempt else cool)
            if res.stopped not in (PARROTED, REFUSED) or res.spoken or res.cancelled:
                break
            res.stopped = ""  # it opened by parroting or refusing: a new sample (the sampler has moved on)

    def _model_turn(self, conv, res, tools, enable_thinking, cancel, t0) -> None:
        """The model decides: its calls run and their results go back to it, for up to max_tool_rounds rounds."""
        for rnd in range(self.max_tool_rounds + 1):
            calls = self._model_call(conv, res, tools, enable_thinking, cancel, t0,
                                     words_only=rnd == self.max_tool_rounds)
            if res.stopped == "repeated tool call" and not res.spoken and not res.cancelled:
                # the model asked for what it already did: the action is done, so it gets one more call that
                # may only be words, to say so (small models otherwise end most acting turns in silence)
                res.stopped = ""
                self._model_call(conv, res, tools, enable_thinking, cancel, t0, words_only=True)
                break
            if res.cancelled or res.stopped or not calls:
                break
            n_done = len(res.tool_results)
            self._run_tools(calls, res, cancel, allowed=rnd < self.max_tool_rounds)
            if res.cancelled or self._say_instead(conv, res.tool_results[n_done:], res):
                break

    def _finish(self, conv, res, t0) -> TurnResult:
        if self.at_a_loss and not (res.spoken or res.tool_calls or res.cancelled or res.error):
            # every sentence was held back (the memory note read out, a call written as text): a person asked and
            # deserves an answer, not silence
            res.stats["at_a_loss"] = res.stopped or "no words"
            told = self.at_a_loss_told and self._utterance and not is_question(self._asked)
            line = parts.fresh_line(conv, self.at_a_loss_told if told else self.at_a_loss)
            conv.unquoted.add(norm(line))
            res.messages.append({"role": "assistant", "content": line})
            res.stopped, res.text = "", line
            self._set_state(SPEAKING)
            res.spoken.append(line)   # not through _speak: the memory may quote this very line
            self.emit(LoopEvent("sentence", line))
        if res.stopped:
            res.stats["stopped"] = res.stopped
        res.stats["tool_rounds"] = sum(1 for m in res.messages if m["role"] == "assistant" and m.get("tool_calls"))
        res.stats["total_ms"] = (time.perf_counter() - t0) * 1e3
        self._turn = None
        self._set_state(IDLE)
        return res

    def _model_call(self, conv, res, tools, enable_thinking, cancel, t0, *,
                    words_only: bool = False, attempt: int = 0,
                    temperature: float | None = None) -> list[ToolCallRequest]:
        self._set_state(THINKING)
        splitter, text, calls = SentenceSplitter(first_clause=getattr(self, "first_clause", 0)), [], []
        n_spoken, self._reworded, self._held = len(res.spoken), False, None
        if not res.t_request:
            res.t_request = time.perf_counter()
        budget = getattr(self.backend, "context_budget", None)  # tokens the prompt may take (None: unknown)
        if budget is None:
            messages = conv.messages(res.messages)
        else:  # oldest turns go first; exact counting only when a cheap upper bound says it may not fit
            messages = conv.fitted(res.messages, lambda m: parts.utf8_bound(m, tools) <= budget
                                   or self.backend.prompt_tokens(m, tools) <= budget)
        # the memory (system messages after the first; not the fact note, answered back: facts.py) is never spoken
        self._memory = ngrams(" ".join(m["content"] for m in messages[1:] if m["role"] == "system"
                                       and not m["content"].startswith(FACTS_HEADER)))
        # a redraw says so (attempt): with a fixed seed the same prompt drew the same refusal three times over
        stream = self.backend.stream_chat(messages, tools, enable_thinking=enable_thinking, cancel=cancel,
                                          words_only=words_only, **({"attempt": attempt} if attempt else {}),
                                          **({"temperature": temperature} if temperature is not None else {}))
        try:
            for ev in stream:
                if cancel.is_set():
                    res.cancelled = True
                    break
                if isinstance(ev, TextDelta) and ev.text:
                    res.stats.setdefault("ttft_ms", (time.perf_counter() - t0) * 1e3)
                    self._set_state(SPEAKING)
                    text.append(ev.text)
                    self.emit(LoopEvent("text", ev.text))
                    if not all(self._speak(s, res) for s in splitter.push(ev.text)):
                        break
                elif isinstance(ev, ThoughtDelta) and ev.text:
                    self.emit(LoopEvent("thought", ev.text))
                elif isinstance(ev, ToolCallRequest):
                    res.stats.setdefault("ttft_ms", (time.perf_counter() - t0) * 1e3)
                    if parts.already_done(ev, res):  # small models repeat a call after its result: the turn is done
                        res.stopped = "repeated tool call"
                        break
                    calls.append(ev)
                    self.emit(LoopEvent("tool_call", call=ev))
                elif isinstance(ev, Finished):
                    parts.merge_stats(res.stats, ev.stats)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:  # a cut-off model call stops generating now (the engine frees its session)
                close()
        res.cancelled = res.cancelled or cancel.is_set()
        if not res.cancelled and not res.stopped:  # an interrupted reply's last fragment is not spoken
            for s in splitter.flush():
                self._speak(s, res)
        self._release_held(res, acting=bool(calls))
        if res.stopped or res.cancelled or self._reworded:
            # the history keeps what was said, not the loop that was cut off nor the fragment a barge-in
            # interrupted (a small model shown its own unfinished reply tends to repeat it in the next turn), nor a
            # framing taken off (shown it, the model frames the next replies alike)
            text = [" ".join(s for s in res.spoken[n_spoken:])]
        reply = "".join(text)
        res.text += ("" if not res.text or not reply else " ") + reply.strip()
        if reply or calls:
            res.messages.append(parts.assistant_message(reply, calls))
        return calls

    def _speak(self, sentence: str, res: TurnResult, *, model: bool = True) -> bool:
        """Emit a sentence for speech unless it must not be said; False when the reply must stop here.
        model: the model's words, held to _parrots (a tool's own line is not); a short opening that also opened a
        recent reply ("Goodbye!") waits for the next sentence, since the two together may be that reply copied."""
        if res.stopped:
            return False
        if model:
            # small talk is never refused ("I can't assist with that."), and no reply is a draft for someone else
            # to say ("Sure, here's how you might respond: ...")
            if REFUSAL.search(sentence) or DRAFTED.search(sentence) or takes_their_name(sentence, self._names):
                res.stopped, self._held = REFUSED, None
                return False
            opening = [*res.spoken, *([self._held] if self._held else []), sentence]
            if self._parrots(sentence, opening, res):
                res.stopped, self._held = PARROTED, None
                return False
            short = norm(sentence)
            if self._held is None and not res.spoken and len(short.split()) < PARROT_WORDS and any(
                    x.startswith(short + " ") or x == short for x in self._said_before):
                self._held = sentence  # it opens a recent reply: what follows decides
                return True
            if self._held is not None:
                held, self._held = self._held, None
                if not self._say(held, res):
                    return False
        return self._say(sentence, res)

    def _release_held(self, res: TurnResult, acting: bool = False) -> None:
        """The reply ended after its short opening: that opening is said now (unless the turn was cut off).
        acting: the reply went on with a tool call, so the opening ("Okay.") is not a recent reply copied whole:
        held back as one, it took the call with it (the soak's model-decides turns lost 1 move in 5)."""
        held, self._held = self._held, None
        if held is None or res.stopped or res.cancelled:
            return
        if not res.spoken and not acting and norm(held) in self._replied_before:
            # the whole reply is a recent one again ("Sure thing!", "Goodbye!" to a statement): drawn anew
            res.stopped = PARROTED
            return
        self._say(held, res)

    def _say(self, sentence: str, res: TurnResult) -> bool:
        if res.stopped:
            return False
        plain = unaddress(unframe(sentence), self.own_name)
        if plain != sentence:
            self._reworded, sentence = True, plain
            if not sentence:
                return True
        if CALL_AS_TEXT.search(sentence):  # a call written as text (any backend's model): not speech
            res.stopped = "tool call as text"
            return False
        if norm(sentence) in {norm(s) for s in res.spoken}:
            res.stopped = "repetition"
            return False
        if read_out(sentence, getattr(self, "_memory", set()), self.own_name) or PROMPT_MARKUP.search(sentence):
            res.stopped = "prompt read out"  # a small model at a loss copies its memory note or scene block
            return False
        res.spoken.append(sentence)
        self.emit(LoopEvent("sentence", sentence))
        if self.max_sentences and sentence_count(res.spoken) >= self.max_sentences:  # a first clause: no sentence
            res.stopped = "max_sentences"
            return False
        return True

    def acknowledge(self, lines: list[str]) -> None:
        """A motion's goal runs (the router calls this from call_tool at the robot's first feedback): one of its lines,
        the first not said in recent turns, is said now, not after the motion (a dance takes 3 s); once per round; the
        state stays `acting` (the sway keeps still). _say_instead then records it, or corrects it if the move fails."""
        if self._turn is None or self._acked is not None or not lines:
            return
        conv, res, cancel = self._turn
        if res.cancelled or res.stopped or cancel.is_set():
            return
        line, n = parts.fresh_line(conv, lines), len(res.spoken)
        self._speak(line, res, model=False)
        if len(res.spoken) > n:
            self._acked = line

    def _say_instead(self, conv: Conversation, outcomes: list[ToolOutcome], res: TurnResult) -> bool:
        """Calls that all succeeded with lines of their own to say (ToolSpec.say: motions) end the turn with one of
        those lines, the first not said in recent turns, instead of a words round over their results; a call that
        failed with a plain reason (ToolOutcome.say of a failure: "I can't turn that far.") ends it with that."""
        failed = [o for o in outcomes if not o.ok]
        if self._acked is not None:
            return self._after_acknowledged(outcomes, failed, res)
        if not outcomes or not all(o.say for o in failed or outcomes):
            return False
        return self._say_line(failed[0].say[0] if failed else parts.fresh_line(conv, outcomes[-1].say), res)

    def _say_line(self, line: str, res: TurnResult) -> bool:
        """The turn ends with the robot's own line (not the model's words)."""
        res.messages.append({"role": "assistant", "content": line})
        self._set_state(SPEAKING)
        self._speak(line, res, model=False)
        res.text += ("" if not res.text else " ") + line
        return True

    def _after_acknowledged(self, outcomes: list[ToolOutcome], failed: list[ToolOutcome], res: TurnResult) -> bool:
        """The motion's line was said as it started (acknowledge): the history gets it, then a correction if a move
        failed with a plain reason ("Sorry, I couldn't do that."); an interrupted move (no plain reason) or a call with
        no line of its own goes on as without it, to the interruption or a words round."""
        line, self._acked = self._acked, None
        if failed and failed[0].say:
            fix = correction_line(failed[0].say[0])
            self._set_state(SPEAKING)
            n = len(res.spoken)
            self._speak(fix, res, model=False)
            if len(res.spoken) > n:
                line = f"{line} {fix}"
        res.messages.append({"role": "assistant", "content": line})
        res.text += ("" if not res.text else " ") + line
        return bool(failed[0].say) if failed else all(o.say for o in outcomes)

    def _parrots(self, sentence: str, opening: list[str], res: TurnResult) -> bool:
        """The person's words given back in the reply's first two sentences ("Let's play a game!" -> "Sure! Let's
        play a game!": "Sure!" stays the reply), or a sentence or an opening of at least PARROT_WORDS words that a
        recent reply already said: a small model copies its memory note's quoted replies ("Goodbye! How about
        you?" to three turns)."""
        s, joined = norm(sentence), norm(" ".join(opening))
        # the opening too: a first clause goes out early ("The bird flew away," then "that's a shame." for "It flew
        # away, that's a shame."), so the sentence alone is never the whole echo
        # a later sentence that opens with the person's words takes them as the robot's own ("Oh, that's exciting!
        # I'm turning thirty, which is a big step forward in my life.")
        if len(res.spoken) < 2 and len(self._utterance.split()) >= 3 and (any(
                x.startswith(self._utterance) for x in (s, joined)) or any(
                SequenceMatcher(None, x, self._utterance).ratio() >= 0.8 for x in (s, joined))):
            return True
        return any(len(x.split()) >= PARROT_WORDS and x in self._said_before for x in (s, joined))

    def _run_tools(self, calls, res, cancel, *, allowed: bool) -> None:
        self._set_state(ACTING)
        for call in calls:
            if cancel.is_set():
                res.cancelled = True
                outcome = ToolOutcome(call.id, call.name, False, error="cancelled: the user interrupted")
            elif not allowed:
                outcome = ToolOutcome(call.id, call.name, False, error="no more tool calls allowed in this turn")
            else:
                outcome = self.call_tool(call, cancel)
            res.tool_calls.append(call)
            res.tool_results.append(outcome)
            self.emit(LoopEvent("tool_result", call=call, result=outcome))
            res.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                 "content": outcome.for_model()})

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.emit(LoopEvent("state", state))


# why a reply was cut: it parrots (ToolLoop._parrots) or refuses small talk (reply_text.REFUSAL); opening so: redrawn
PARROTED, REFUSED, RESAMPLES, PARROT_TURNS, PARROT_WORDS = "parroted", "refused", 2, 6, 4
