"""A question about who or what is in view, answered from the newest caption (issue 34).

Asked "Who is there?" with a caption of a man in the doorway in its prompt, the 0.5B model introduced the robot
itself ("There's Bolt, a small friendly robot ...") or said "How can I assist you today?"; asked "Is anyone else
around?" after a caption of a cat, "Yes, there are people nearby." (conversation_scripts_heldout3.yaml, before any
change). The intent classifier's `see` label marks such a question, and the robot says what its camera saw last, in
words of the caption itself; with no caption the model answers as before (it cannot know).
"""
from __future__ import annotations

import re

from bolt_ros.assistant.conversation import SCENE_HEADER
from bolt_ros.assistant.mention import is_question

# the scene block as Conversation.user_message writes it: "[What you see (newest last):\n- just now: ...\n]\n..."
_LINE = re.compile(r"^\s*-\s*(?:just now|\d+ s ago|\d+ min ago):\s*(.+?)\s*$", re.MULTILINE)
SEE_LINES = ["Right now, {caption}.", "From here I can see this: {caption}.", "What I see: {caption}."]
# a person's pronoun ("it" is too often the weather, the day, the thing just talked of)
_THIRD = re.compile(r"\b(?:he|she|his|her|him|hers|they|them|their)\b", re.IGNORECASE)


def newest_caption(user_content: str) -> str:
    """The newest caption in a user message's scene block ("" when it has none)."""
    if SCENE_HEADER not in user_content:
        return ""
    block = user_content.split(SCENE_HEADER, 1)[1].split("]\n", 1)[0]
    lines = _LINE.findall(block)
    return lines[-1].rstrip(".") if lines else ""


def see_options(caption: str) -> list[str]:
    """What to say for a caption, in its own words ("Right now, a cat is sleeping on a blue sofa."); its first
    letter in lower case after an article ("A small grey cat" -> "a small grey cat")."""
    first, _, rest = caption.partition(" ")
    if first.lower() in ("a", "an", "the", "two", "three", "some", "someone", "somebody"):
        caption = f"{first.lower()} {rest}".strip()
    return [x.format(caption=caption) for x in SEE_LINES]


def follows_view(utterance: str, last_replies: list[str]) -> bool:
    """A question about him / her right after the robot said what it sees ("Who's in the kitchen?" -> "Right now,
    an elderly woman with white hair is stirring a pot on the stove." -> "What is she doing?"): answered from the
    view again. Left to words, the 0.5B model answered from its own system prompt ("She is turning and tilting her
    head.", held out 4, 2 of 3 seeds) or a caption's colour wrongly ("The hoodie is white." for a red one)."""
    if not last_replies or not is_question(utterance) or not _THIRD.search(utterance):
        return False
    return any(last_replies[-1].startswith(x.split("{caption}")[0]) for x in SEE_LINES)
