"""What a drafter is trained on: the target's own replies to the requests a robot assistant gets, rendered exactly as
the assistant renders them, so the drafter learns the text the deployed graph decodes.

Two kinds of turn:
- **tool turns** (`assistant_prompt_ids`): the system prompt and the tool surface with the robot's animations, the
  reply words or a call (the model's turn with the intent classifier off);
- **words turns** (`words_prompt_ids`): what the chat model sees when the intent classifier (on by default) chose to
  talk: the system prompt, no tools (tool_loop's `words_only`), the conversation's memory note of earlier turns as a
  second system message (assistant/conversation.py, `history: memory`) and a scene block in brackets when captions
  arrived. Their utterances: general small talk from templates (`talk_utterances`) and the talk turns (no move
  expected) of the conversation bench's scripts, each with the memory of its conversation's earlier turns
  (`script_talk_turns`).

Training utterances are generated from templates with a seed; `HELD_OUT` (tool turns) and `HELD_OUT_CHAT` (words
turns; both used by bench/bench_dflash.py) share no utterance with them.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

_VERBS = ["wave", "nod", "dance", "look left", "look right", "look up", "look down", "look at me", "shake your head",
          "say hello", "turn your head left", "celebrate", "look around", "look center"]
_ASKS = ["what do you see?", "tell me a joke", "how are you today?", "what is your name?", "who is in front of you?",
         "what can you do?", "describe the room", "do you like music?", "what time is it?", "tell me something fun",
         "are you a robot?", "what's the weather like?", "can you help me?", "introduce yourself",
         "say something nice", "what did you just do?", "count to five", "what colour is the sky?"]
_PREFIX = ["", "please ", "hey robot, ", "could you ", "can you ", "now ", "ok, ", "robot, "]
_SUFFIX = ["", " please", " for me", " now", " again", "!", " and tell me why"]

HELD_OUT = ["Please wave at my friend and say hi.", "Can you look to the left and tell me what is there?",
            "Nod if you understand me.", "What are you looking at right now?", "Do a little dance for us!",
            "Tell me a short story about a robot.", "Look up at the ceiling.", "How do you feel about people?"]


# --- words turns ----------------------------------------------------------------------------------------------------
_GREET = ["hello", "hi", "hey there", "good morning", "good afternoon", "good evening", "hi Bolt", "hello robot",
          "nice to meet you", "hey buddy", "morning", "hello again", "hi, it's me again", "yo"]
_ABOUT = ["how are you?", "what's your name?", "how old are you?", "where do you come from?", "do you have feelings?",
          "what do you like to do?", "can you hear me?", "do you ever get tired?", "what makes you happy?",
          "are you smart?", "do you dream at night?", "what is your favourite food?", "do you have friends?",
          "what are your antennas for?", "do you like people?", "are you alive?", "who built you?",
          "do you get lonely?", "what do you do all day?", "are you a boy or a girl?", "do you like your job?",
          "what's your favourite song?", "can you sing?", "do you sleep?", "are you happy today?",
          "what do you think about humans?", "do you like the rain?", "what scares you?"]
_FEEL = ["I'm tired today", "I feel great", "I had a long day at work", "I'm a bit nervous about my exam",
         "I'm bored", "I'm so excited about the weekend", "I feel a little lonely", "I'm really stressed",
         "I'm in a great mood", "I'm hungry", "I'm cold", "I feel sick today", "I'm proud of myself",
         "I'm worried about my mum", "I can't sleep", "I'm happy to see you", "I'm angry at my brother",
         "I'm a bit grumpy this morning"]
_MISHAP = ["I spilled my tea", "I lost my phone", "I missed the bus this morning", "my laptop crashed",
           "I burned the toast", "I stubbed my toe", "I forgot my keys at work", "my bike got a flat tyre",
           "I broke a glass", "it rained on my way home", "I locked myself out", "my cake didn't rise",
           "I dropped my sandwich", "my plant died", "I overslept", "the printer jammed again"]
_TELL = ["my name is Sam", "I have a dog called Max", "my sister is visiting this week", "I like pizza",
         "I play the guitar", "I work as a nurse", "I'm learning Spanish", "my birthday is in May",
         "we're having pasta tonight", "I just got back from a run", "I'm reading a book about space",
         "my son started school today", "I planted tomatoes in the garden", "I got a new job",
         "I'm going to the beach tomorrow", "my cat knocked over a vase", "I'm baking cookies"]
_FACTS = ["what is the capital of Italy?", "how many days are in a week?", "why is the sky blue?",
          "what do bees make?", "how far away is the moon?", "what is the biggest animal?",
          "how many legs does a spider have?", "what is water made of?", "why do leaves change colour?",
          "what is the tallest mountain?", "how hot is the sun?", "what is three times four?",
          "who invented the light bulb?", "what do cows drink?", "how many continents are there?",
          "what's the opposite of cold?", "which planet is the red one?", "why do we need sleep?",
          "what is ten minus seven?", "how many hours are in a day?", "what do pandas eat?",
          "where do penguins live?", "is a tomato a fruit?", "what language do they speak in Brazil?"]
_FUN = ["tell me a joke", "say something funny", "do you know any riddles?", "make me laugh",
        "tell me a fun fact", "tell me a short story", "give me a compliment", "say something silly",
        "tell me something interesting", "what should I cook tonight?", "any ideas for the weekend?",
        "can you recommend a movie?", "what's a good name for a goldfish?", "rhyme something with cat"]
_THANKS = ["thank you", "thanks a lot", "thanks for your help", "you're the best", "that was nice",
           "you're very kind", "good job", "well done", "I appreciate it", "you're awesome"]
_BYE = ["goodbye", "see you later", "good night", "I have to go now", "bye bye", "talk to you tomorrow",
        "see you soon", "I'm off to bed", "catch you later", "have a good evening"]
_TALK_KINDS = [_GREET, _ABOUT, _FEEL, _MISHAP, _TELL, _FACTS, _FUN, _THANKS, _BYE]
_TALK_PREFIX = ["", "", "", "hey Bolt, ", "so, ", "oh, ", "well, ", "Bolt, ", "you know what? ", "hmm, ", "okay, "]
_TALK_SUFFIX = [".", ".", "!", ", Bolt.", " today.", "..."]

# earlier turns for the memory note: (what the person said, what the robot did or "" = it answered in words)
_EARLIER = [("Hello!", ""), ("Can you dance for me?", "you played your dance animation"),
            ("Look to the left.", "you looked left"), ("What's your name?", ""), ("I'm a bit tired.", ""),
            ("Nod if you hear me.", "you played your nod animation"), ("Tell me a joke.", ""),
            ("Look up.", "you looked up"), ("Show me a happy face.", "you played your happy animation"),
            ("How are you?", ""), ("What tricks do you know?", "you checked your list of animations"),
            ("Thanks!", ""), ("I had pizza for lunch.", ""), ("Look at me again.", "you looked center")]
# what the robot answered to an earlier talk turn (a stand-in for its own reply, in its style)
_REPLIES = {"Hello!": "Hello! It's nice to see you.", "What's your name?": "I'm Bolt, a small robot. Nice to meet you!",
            "How are you?": "I'm doing great, thanks for asking!",
            "Tell me a joke.": "Why did the robot cross the road? To charge on the other side!",
            "I'm a bit tired.": "Oh no, I hope you get some rest soon.", "Thanks!": "You're welcome!",
            "I had pizza for lunch.": "Pizza is a great choice!", "Good evening.": "Good evening! How was your day?"}
_ANY_REPLY = ["That sounds lovely!", "I'm always happy to chat with you.", "Oh, I see. Tell me more!"]


@dataclass(frozen=True)
class WordsTurn:
    """A turn the chat model answers in words: the utterance, the conversation's earlier turns (said, done: what the
    robot did, or "" when it answered in words) and a caption seen a few turns before (scene block)."""

    say: str
    earlier: tuple[tuple[str, str], ...] = ()
    caption: str = ""
    caption_age_s: int = 0


HELD_OUT_CHAT = [WordsTurn("Hi Bolt, did you have a good day?"),
                 WordsTurn("What's the best thing about being a robot?"),
                 WordsTurn("My grandma turns ninety on Sunday.", (("Hello!", ""),)),
                 WordsTurn("Why do zebras have stripes?"),
                 WordsTurn("I finally finished painting the fence.", (("Good evening.", ""),
                                                                        ("Look up.", "you looked up"))),
                 WordsTurn("Can you tell me a bedtime story?"),
                 WordsTurn("Oops, I just dropped my coffee mug."),
                 WordsTurn("See you next week, little robot!", (("Tell me a joke.", ""), ("Thanks!", "")))]


def talk_utterances(n: int, seed: int = 0) -> list[str]:
    """n distinct small-talk utterances (greetings, questions about the robot, feelings, mishaps, what people tell,
    facts, jokes, thanks, goodbyes), none of them held out."""
    rng = random.Random(seed)
    held = {h.say.lower() for h in HELD_OUT_CHAT}
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n and len(seen) < 20 * n:
        core = rng.choice(rng.choice(_TALK_KINDS))
        end = "" if core.endswith("?") else rng.choice(_TALK_SUFFIX)
        u = (rng.choice(_TALK_PREFIX) + core + end).strip()
        u = u[0].upper() + u[1:]
        if u.lower() not in seen and u.lower() not in held:
            out.append(u)
        seen.add(u.lower())
    return out


def talk_turns(n: int, seed: int = 0, memory_share: float = 0.5) -> list[WordsTurn]:
    """`talk_utterances`, about `memory_share` of them after 1-4 earlier turns (the memory note)."""
    rng = random.Random(seed + 1)
    return [WordsTurn(u, tuple(rng.sample(_EARLIER, rng.randint(1, 4))) if rng.random() < memory_share else ())
            for u in talk_utterances(n, seed)]


def chat_turns(n: int, seed: int = 0, memory_share: float = 0.3) -> list[WordsTurn]:
    """n general-chat utterances (train/chat_prompts.py: topic frames), about `memory_share` of them after 1-4
    earlier turns; none of them held out."""
    from bolt_ros.train.chat_prompts import chat_utterances

    rng = random.Random(seed + 2)
    return [WordsTurn(u, tuple(rng.sample(_EARLIER, rng.randint(1, 4))) if rng.random() < memory_share else ())
            for u in chat_utterances(n, seed, {h.say for h in HELD_OUT_CHAT})]


_DONE = {"play_animation": "you played your {name} animation", "look": "you looked {direction}",
         "list_animations": "you checked your list of animations"}


def script_talk_turns(paths: list[Path] | None = None) -> list[WordsTurn]:
    """The talk turns (no move expected) of the conversation bench's scripts (bench/conversation_scripts*.yaml), each
    with its conversation's earlier turns (a request as the move it expects) and the last caption before it."""
    import yaml

    if paths is None:
        paths = sorted((Path(__file__).resolve().parents[2] / "bench").glob("conversation_scripts*.yaml"))
    out: list[WordsTurn] = []
    for path in paths:
        for conv in yaml.safe_load(path.read_text())["conversations"]:
            earlier: list[tuple[str, str]] = []
            caption, since = "", 0
            for turn in conv["turns"]:
                if "caption" in turn:
                    caption, since = turn["caption"], 0
                    continue
                expect = turn.get("expect")
                if expect in (None, "none") or (isinstance(expect, list) and "none" in expect):  # words are right
                    out.append(WordsTurn(turn["say"], tuple(earlier[-6:]), caption, 8 * since))
                    done = ""
                else:
                    call = expect[0] if isinstance(expect, list) else expect
                    try:
                        done = _DONE[call["tool"]].format(**(call.get("args") or {}))
                    except KeyError:  # move_head, or a call without the argument its line names
                        done = "you turned your head"
                earlier.append((turn["say"], done))
                since += 1
    return out


def words_messages(turn: WordsTurn | str, reply_for=None) -> list[dict]:
    """The messages the assistant sends for a words turn (config/assistant.yaml's system prompt and memory settings;
    no tools). reply_for(said) -> the robot's words to an earlier talk turn (default: a stand-in from _REPLIES)."""
    from bolt_ros.assistant.conversation import SCENE_HEADER, Conversation, TurnRecord

    if isinstance(turn, str):
        turn = WordsTurn(turn)
    cfg = _assistant_config()
    conv = Conversation(cfg.system_prompt, cfg.max_history_messages, history=cfg.history,
                        memory_turns=cfg.memory_turns, memory_replies=cfg.memory_replies,
                        keep_last_call=cfg.memory_keeps_last_call, facts_in_prompt=cfg.facts_in_prompt)
    for said, done in turn.earlier:
        reply = "" if done else (reply_for(said) if reply_for else None) or _REPLIES.get(said) or \
            _ANY_REPLY[sum(map(ord, said)) % len(_ANY_REPLY)]
        conv.commit([], TurnRecord(said, reply, [done] if done else [], [said] if done else []))
    scene = ""
    if turn.caption:
        age = "just now" if turn.caption_age_s < 1 else f"{turn.caption_age_s} s ago"
        scene = f"{SCENE_HEADER}\n- {age}: {turn.caption}"
    return conv.messages([conv.user_message(turn.say, scene)])


def words_prompt_ids(engine, turn: WordsTurn | str, reply_for=None) -> list[int]:
    """The token ids the embedded backend feeds `engine` for a words turn (no tools shown)."""
    return engine.tok.encode_segments(engine.chat_format.render(words_messages(turn, reply_for), tools=None),
                                      add_bos=engine.tok.add_bos)


def words_grammar(engine) -> str | None:
    """The grammar a words turn decodes under (chat_session.stream with tools and tool_choice "none": no call
    syntax), or None where the format has none."""
    return engine.chat_format.tool_grammar(assistant_messages("hi")[1], "none")


def training_utterances(n: int, seed: int = 0) -> list[str]:
    """n distinct utterances (commands and questions), none of them in HELD_OUT."""
    rng = random.Random(seed)
    held = {h.lower() for h in HELD_OUT}
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        core = rng.choice(_VERBS) if rng.random() < 0.55 else rng.choice(_ASKS)
        u = (rng.choice(_PREFIX) + core + (rng.choice(_SUFFIX) if not core.endswith("?") else "")).strip()
        u = u[0].upper() + u[1:]
        if u.lower() not in seen and u.lower() not in held:
            seen.add(u.lower())
            out.append(u)
        if len(seen) > 10 * n:  # the template space is exhausted
            break
    return out


def assistant_prompt_ids(engine, utterance: str) -> list[int]:
    """The token ids the assistant's embedded backend feeds `engine` for `utterance` (its messages, its tools)."""
    messages, tools = assistant_messages(utterance)
    return engine.tok.encode_segments(engine.chat_format.render(messages, tools=tools), add_bos=engine.tok.add_bos)


@functools.lru_cache(maxsize=1)
def _assistant_config():
    from bolt_ros.assistant.config import from_ros_parameters, load_params_file
    from bolt_ros.graph import package_file

    return from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))


def assistant_messages(utterance: str) -> tuple[list[dict], list[dict]]:
    """(messages, tools) the assistant sends for `utterance` on the default config and the robot's animations."""
    from bolt_ros.assistant.tools import ToolRegistry
    from bolt_ros.robot.config import load_robot_config

    cfg = _assistant_config()
    registry = ToolRegistry(cfg.tools)
    animations = load_robot_config().animations
    for tool in registry.tools.values():
        if tool.spec.enum_from is not None:
            tool.set_enum([a.name for a in animations], [a.description for a in animations])
    messages = [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": utterance}]
    return messages, registry.openai_tools()
