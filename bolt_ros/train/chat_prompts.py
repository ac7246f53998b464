"""General-chat utterances for a talk drafter: frames with a topic slot (questions, opinions, what people tell,
requests for a story or a tip), so the drafter sees the target answer thousands of different things, not a few
hundred templates. A drafter trained on 300 talk turns drafted the replies it had seen (4.5-6 tokens a pass) and
almost nothing else (1.1 on held-out chat, docs/dflash.md): what it lacked was variety.

None of the frames is a frame of HELD_OUT_CHAT (a good day, the best thing about being a robot, a grandma's birthday,
zebras' stripes, a fence, a bedtime story, a dropped mug, see you next week), and `chat_utterances` drops any
utterance equal to a held-out one.
"""
from __future__ import annotations

import random

_ANIMALS = ["cats", "dogs", "owls", "dolphins", "elephants", "octopuses", "horses", "frogs", "giraffes", "turtles",
            "sharks", "rabbits", "foxes", "whales", "ants", "parrots", "koalas", "bats", "lions", "snails",
            "hedgehogs", "crows", "jellyfish", "squirrels", "camels", "butterflies", "wolves", "ducks", "kangaroos",
            "spiders", "seals", "chickens"]
_TOPICS = ["music", "painting", "football", "chess", "the ocean", "outer space", "volcanoes", "dinosaurs",
           "rainbows", "thunderstorms", "the moon", "computers", "trains", "bicycles", "cooking", "gardening",
           "camping", "snow", "summer", "autumn", "tea", "chocolate", "books", "poetry", "history", "mathematics",
           "the internet", "video games", "birthdays", "holidays", "friendship", "kindness", "dreams", "the stars",
           "rivers", "mountains", "deserts", "forests", "cities", "airplanes", "boats", "magic tricks", "the piano",
           "dancing", "photography", "swimming", "tennis", "the circus", "pirates", "castles", "ice cream",
           "bread", "cheese", "apples", "honey", "the weather", "clouds", "electricity", "batteries", "magnets",
           "the seasons", "languages", "jokes", "puzzles", "board games", "libraries", "museums", "zoos",
           "farms", "fireworks", "the wind", "sunsets", "recycling", "science", "art", "school", "homework",
           "robots in films", "superheroes", "fairy tales", "knitting", "yoga", "running", "hiking", "skiing"]
_ACTIVITIES = ["play the violin", "bake bread", "speak French", "ride a horse", "juggle", "paint with watercolours",
               "write poems", "play chess", "swim faster", "grow vegetables", "draw animals", "sing in a choir",
               "knit a scarf", "code in Python", "skateboard", "take better photos", "make pancakes",
               "play basketball", "meditate", "fix a bike", "tell better jokes", "remember names", "save money",
               "wake up early", "keep a diary", "dance salsa", "build a birdhouse", "fold paper cranes"]
_PLACES = ["to the park", "to the lake", "to the mountains", "to the market", "to the cinema", "to a concert",
           "to the dentist", "to the library", "to my aunt's house", "to the zoo", "to a museum", "to the gym",
           "to the seaside", "to a wedding", "to the hospital", "to a football match", "to Paris", "to the farm",
           "camping", "shopping", "to the swimming pool", "to a new restaurant"]
_PEOPLE = ["my brother", "my best friend", "my neighbour", "my dad", "my daughter", "my boss", "my teacher",
           "my cousin", "my uncle", "my wife", "my husband", "my roommate", "my little sister", "our dog"]
_THINGS = ["a new bike", "a puppy", "a guitar", "a book about birds", "a red scarf", "a telescope", "a plant",
           "new shoes", "a board game", "a kite", "a camera", "a painting", "a jigsaw puzzle", "a watch"]

# (frame, slot list)
_FRAMES: list[tuple[str, list[str]]] = [
    ("What do you think about {}?", _TOPICS), ("Do you like {}?", _TOPICS), ("Tell me something about {}.", _TOPICS),
    ("What's your favourite thing about {}?", _TOPICS), ("Can you explain {} to me?", _TOPICS),
    ("Why do people love {}?", _TOPICS), ("Tell me a joke about {}.", _TOPICS),
    ("Write a tiny poem about {}.", _TOPICS), ("I've been reading about {} lately.", _TOPICS),
    ("I don't really get {}.", _TOPICS), ("{} makes me happy.", _TOPICS), ("Have you heard of {}?", _TOPICS),
    ("Tell me a fun fact about {}.", _ANIMALS), ("What do {} eat?", _ANIMALS), ("Where do {} live?", _ANIMALS),
    ("Are {} smart?", _ANIMALS), ("Do {} sleep?", _ANIMALS), ("I saw some {} today.", _ANIMALS),
    ("Would you be scared of {}?", _ANIMALS), ("How long do {} live?", _ANIMALS), ("I love {}!", _ANIMALS),
    ("How do I learn to {}?", _ACTIVITIES), ("I want to {}.", _ACTIVITIES), ("Can you {}?", _ACTIVITIES),
    ("Is it hard to {}?", _ACTIVITIES), ("Give me a tip: I'm trying to {}.", _ACTIVITIES),
    ("My friend can {}.", _ACTIVITIES),
    ("I went {} yesterday.", _PLACES), ("We're going {} this weekend.", _PLACES), ("Should I go {} today?", _PLACES),
    ("I'm nervous about going {}.", _PLACES),
    ("{} is coming over for dinner.", _PEOPLE), ("{} is feeling sick.", _PEOPLE),
    ("I had an argument with {}.", _PEOPLE), ("{} says hello.", _PEOPLE), ("What should I cook for {}?", _PEOPLE),
    ("{} got a promotion.", _PEOPLE),
    ("I got {} for my birthday.", _THINGS), ("I'm thinking of buying {}.", _THINGS), ("Look, I made {}.", _THINGS),
    ("Do you want {}?", _THINGS),
    ("Tell me a story about {}.", _ANIMALS), ("Tell me a short story about {}.", _TOPICS),
]


def chat_utterances(n: int, seed: int = 0, held: set[str] = frozenset()) -> list[str]:
    """n distinct general-chat utterances (topic frames), none equal (case-insensitive) to one in `held`."""
    rng = random.Random(seed + 7)
    held = {h.lower() for h in held}
    total = sum(len(slots) for _, slots in _FRAMES)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n and len(seen) < total:
        frame, slots = rng.choice(_FRAMES)
        u = frame.format(rng.choice(slots))
        u = u[0].upper() + u[1:]
        if u.lower() not in seen and u.lower() not in held:
            out.append(u)
        seen.add(u.lower())
    return out
