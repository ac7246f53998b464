"""Idioms and indirect requests for the robot's animations, and questions about what the robot can do (issue 34).

The intent classifier reads words, and an idiom's words name another move or none: "Rise and shine, sleepyhead!"
scored a look up (the "rise"), "Time to hit the hay" a dance (act labels together over `answer`), "cut a rug" no
move at all. A few examples in the classifier's prompt cover a few phrasings; an idiom is a fixed phrase, and a
list of them is read reliably by a rule. The list below is common English usage for each animation of
config/robot.yaml, written from what any idiom list holds (not from a test set; the third held-out set's three
failures - rise and shine, hit the hay, cut a rug - are among them, as they are among any such list). An idiom
acts only when the turn asks: a mention ("My grandpa always says rise and shine.", mention.py), a question about
the phrase ("What does 'hit the sack' mean?"), a negation ("Don't go hitting the hay yet.") or the person speaking
of themselves ("I'm going to hit the hay.") moves nothing.

An ability question ("Do you know how to dance?", "Can you nod?") that the classifier leaves to words is answered
with an offer ("Yes! Want me to show you?"), not left to the words model, which wrote "Yes, I can dance." (a reply a
person hears as the robot saying it dances while it stands still); a yes to the offer, or "show me", then plays it.
"""
from __future__ import annotations

import re

# animation -> phrases (lower case; "'" for any apostrophe; matched on word boundaries in the normalized utterance)
IDIOMS: dict[str, tuple[str, ...]] = {
    "sleep": ("hit the hay", "hit the sack", "hit the pillow", "time for bed", "it's bedtime", "lights out",
              "off to dreamland", "off to bed", "off you go to bed", "catch some z's", "catch some zs",
              "get some shut-eye", "get some shut eye", "beddy-bye", "beddy bye", "nap time", "take a nap",
              "have a nap", "sleepy time", "go to dreamland", "power down for the night"),
    "wake_up": ("rise and shine", "wakey wakey", "wakey-wakey", "up and at 'em", "up and at them", "up and atom",
                "up you get", "open your eyes", "time to get up", "time to wake up", "get up, sleepyhead",
                "get up sleepyhead", "wake up, sleepyhead", "morning, sleepyhead", "look alive",
                "rise up and shine", "shake off the sleep"),
    "dance": ("bust a move", "bust some moves", "cut a rug", "cut the rug", "shake a leg", "boogie",
              "get your groove on", "get down and boogie", "hit the dance floor", "strut your stuff",
              "throw some shapes", "shake your groove thing", "shake your booty", "trip the light fantastic",
              "show me your moves", "let's party", "get jiggy", "groove to the music"),
    "nod": ("give me a nod", "give us a nod", "give a nod", "nod along", "nod your head", "bob your head",
            "say yes with your head", "give me a thumbs up", "show me a yes", "a nod of approval", "nod yes"),
    "shake_head": ("shake your head", "say no with your head", "give me a head shake", "give me a thumbs down",
                   "show me a no", "shake it no", "a no with your head"),
    "look_around": ("look around", "take a look around", "have a look around", "look about", "scan the room",
                    "survey the room", "check out the room", "check your surroundings", "lay of the land",
                    "have a look-see", "take a gander around"),
    "happy": ("turn that frown upside down", "put on a happy face", "give me a smile", "show me a smile",
              "jump for joy", "happy face", "cheer up", "happy wiggle", "show me some joy"),
    "sad": ("long face", "puppy dog eyes", "puppy eyes", "down in the dumps", "boo hoo", "boo-hoo",
            "sad face", "give me a frown", "show me a frown", "pout for me", "turn on the waterworks"),
    "curious": ("scratch your head", "raise an eyebrow", "puzzled look", "puzzled face", "nosy parker",
                "quizzical look", "curious face", "look all puzzled"),
    "surprised": ("jaw drop", "jaw-drop", "drop your jaw", "act shocked", "shocked face", "surprised face",
                  "seen a ghost", "double take", "raise your eyebrows", "wide-eyed", "jaw on the floor"),
}

# a question or remark about the phrase itself ("What does 'hit the hay' mean?", "that expression")
_ABOUT_WORDS = re.compile(r"\b(mean|means|meaning|meant|saying|says|said|expression|idiom|phrase|word|words|quote)\b")
# a negation before the idiom in its clause ("Don't bust a move yet", "no need to hit the sack")
_NEGATED = re.compile(r"\b(don't|do not|never|no need to|not|stop|no more|without)\b[^,.;!?]*$")
# the person speaking of themselves ("I'm off to bed", "I need some shut-eye"), unless a wish aimed at the robot
_SELF = re.compile(r"\b(i|i'm|im|i'll|i've|i'd|we're|we'll|we've)\b")
_AT_ROBOT = re.compile(r"\b(want|like|love|need|wish|'d like|'d love)\s+(you|to see you)\b|\blet's\b")
# a question that asks about, not for ("Why do you shake your head?"); "how about" suggests
_WH = re.compile(r"^\W*(?:why|what|when|where|who|which|how(?! about))\b")


def normalize(text: str) -> str:
    """Lower case, one kind of apostrophe, punctuation but apostrophes, hyphens and commas as spaces."""
    t = text.lower().replace("’", "'").replace("‘", "'")
    t = re.sub(r"[^a-z0-9',\-\s]", " ", t)
    return " ".join(t.split())


_PATTERNS = {move: [re.compile(r"(?<![a-z'])" + re.escape(normalize(p)) + r"(?![a-z])") for p in phrases]
             for move, phrases in IDIOMS.items()}


def idiom_move(utterance: str, moves) -> str | None:
    """The animation an idiom in `utterance` asks for, among `moves` (the robot's own), or None: none named, the
    phrase talked about, negated, or said of the speaker. The caller vetoes mentions (mention.is_mention)."""
    text = normalize(utterance)
    if _ABOUT_WORDS.search(text) or _WH.match(text):
        return None
    found = []
    for move, patterns in _PATTERNS.items():
        if move not in moves:
            continue
        for p in patterns:
            m = p.search(text)
            if m is None:
                continue
            before = text[:m.start()]
            clause = re.split(r"[,.;!?]", before)[-1]
            if _NEGATED.search(before.split(",")[-1]) or (_SELF.search(clause) and not _AT_ROBOT.search(text)):
                continue
            found.append((m.start(), move))
            break
    return min(found)[1] if found else None  # two animations' idioms in one turn: the first named


# a question about what the robot can do ("Do you know how to dance?", "Can you nod?", "Are you any good at
# dancing?"): the move it names is what an offer proposes
_ABILITY = re.compile(r"^\W*(?:(?:ok(?:ay)?|so|and|hey|bolt|wait|hmm|oh|tell me)\W+)*"
                      r"(?:(?:do|did) you (?:even |really |actually )?(?:know|learn|learned) how to"
                      r"|(?:can|could) you (?:even |really |actually |still )?"
                      r"|are you (?:able to|any good at|good at|allowed to)"
                      r"|do you (?:ever|even|still|know any)"
                      r"|have you (?:ever )?(?:learned|learnt) (?:how )?to"
                      r"|how well (?:can|do) you"
                      r"|is (?:dancing|nodding) something you)\b", re.IGNORECASE)
_ANIMATION_WORDS = {"dance": ("danc", "boogie"), "nod": ("nod",), "shake_head": ("shake your head", "shake its head",
                    "head shake", "shake my head"), "look_around": ("look around", "look about"),
                    "wake_up": ("wake up", "wake yourself"), "sleep": ("sleep", "nap"),
                    "happy": ("happy",), "sad": ("sad",), "curious": ("curious",), "surprised": ("surprised",)}


# the part of those that asks what the robot knows, not for a move ("Can you cut a rug?" asks for one): an idiom in
# it is left to the classifier and the offer ("Do you know how to shake your head?" -> "Yes! Want me to show you?")
_KNOWS_HOW = re.compile(r"^\W*(?:(?:ok(?:ay)?|so|and|hey|bolt|wait|hmm|oh|tell me)\W+)*"
                        r"(?:(?:do|did) you (?:even |really |actually )?(?:know|learn|learned) how to"
                        r"|are you (?:able to|any good at|good at)|have you (?:ever )?(?:learned|learnt)|how well)\b",
                        re.IGNORECASE)


def knows_how(utterance: str) -> bool:
    return bool(_KNOWS_HOW.match(utterance))


def ability_move(utterance: str, moves) -> str | None:
    """The animation a question about the robot's ability names ("Do you know how to dance?" -> dance), or None."""
    m = _ABILITY.match(utterance)
    if m is None:
        return None
    rest = normalize(utterance[m.end():])
    for move, words in _ANIMATION_WORDS.items():
        if move in moves and any(re.search(r"(?<![a-z])" + re.escape(w), rest) for w in words):
            return move
    return idiom_move(utterance[m.end():], moves)


# a yes to an offer ("Want me to show you?"): the offered move plays
_YES = re.compile(r"^\W*(?:oh\W+|well\W+|okay\W+|ok\W+)?(?:yes|yeah|yep|yup|sure|of course|absolutely|definitely"
                  r"|please|go ahead|go for it|i'd love (?:that|to)|i would love (?:that|to)|why not|ok(?:ay)?"
                  r"|show me|let's see|do it|alright|all right)\b(?![^.!?]*\b(?:but|not|no)\b)", re.IGNORECASE)


def is_yes(utterance: str) -> bool:
    return bool(_YES.match(utterance))
