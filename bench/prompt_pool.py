"""The peer probe's prompt pool: ordinary text that leaves Gemma 3 270M undecided, generated, filtered and shipped.

Candidates come from templates and word lists kept in this file (story openings, questions, lists, opinions,
descriptions, dialogue, instructions, letters, reviews, ...), made by a seeded generator that needs no server, so the
same candidates come out on every machine and Python. Each candidate is then asked of a real Gemma 3 270M Q4_K_M
llama-server (build 11434, -np 1, -t 1, idle: its answers are bit-for-bit repeatable) exactly as the peer probe asks
(specwatch.probe.peerprobe.body, the prompt swapped: 8 tokens, top-5 logprobs, temperature 0, /v1/completions). A
candidate is kept when the model is undecided on it: 8 tokens and a text that is not blank, a first token whose
logprob is at most FIRST_AT_MOST and a mean logprob over the 8 tokens of at most MEAN_AT_MOST. The survivors are
written, in an order fixed by a keyed hash of each prompt (a shuffle that needs no server to check), to
exporter/probe/prompts.json, a JSON list of strings shipped in the package.

    python -m bench.prompt_pool            generate, filter on two servers, write the pool (about 15 minutes)
    python -m bench.prompt_pool --check    the shipped pool is what this script makes (no server: candidates and order)
    python -m bench.prompt_pool --check --refilter   the same, and every candidate asked again (the filter needs servers)

Pool indices are what recordings name (bench/peer_record.py): prompts from RESERVED on are kept for held-out
measurements and never used to tune.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import random
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
POOL = ROOT / "exporter" / "probe" / "prompts.json"
SEED = 20261206
"""Seeds the candidates' generator and keys the pool's order."""
CANDIDATES = 4500
"""Candidates generated (distinct prompts of 4 to 25 words)."""
MEAN_AT_MOST = -1.0
"""Kept when the mean logprob of the 8 greedy tokens is at most this (a geometric mean probability under 0.37)...
-0.5 kept 98% of the candidates: it filtered nothing out."""
FIRST_AT_MOST = -0.7
"""...and the first token's logprob at most this (its probability under one half: the model unsure from the first
token on)."""
TOKENS = 8
MIN_WORDS, MAX_WORDS = 4, 25
MAX_BYTES = 300_000
RESERVED = 400
"""Pool indices from here on are held out: the tuning recording uses [0, RESERVED) only."""

# Word lists -------------------------------------------------------------------------------------------------------

NAMES = ("Anna", "Tom", "Maria", "James", "Lena", "Omar", "Grace", "Kenji", "Sofia", "Daniel", "Priya", "Lucas", "Emma",
         "Noah", "Chloe", "Ivan", "Fatima", "Leo", "Hannah", "Marco", "Zoe", "Samuel", "Aisha", "Peter", "Nina", "Oscar",
         "Clara", "Hugo", "Mia", "Ben", "Rosa", "Felix", "Julia", "Adam", "Eva", "Max", "Lily", "Carlos", "Sara", "Theo")
RELATIVES = ("mother", "father", "sister", "brother", "grandmother", "grandfather", "aunt", "uncle", "cousin", "son",
             "daughter", "wife", "husband", "neighbour", "best friend", "boss", "teacher", "roommate")
PLACES = ("Paris", "Tokyo", "a small fishing village", "the mountains", "New York", "the desert", "an island",
          "Rome", "the countryside", "London", "a busy market", "the old harbour", "Berlin", "a quiet forest",
          "Cairo", "the seaside", "Mexico City", "a mountain cabin", "Sydney", "the city centre", "a farm", "Lisbon",
          "a train station", "the library", "a hospital", "the airport", "a school", "a castle", "the museum",
          "a campsite", "Iceland", "Kenya", "Peru", "Norway", "Vietnam", "Scotland", "Canada", "Morocco", "India")
ROOMS = ("kitchen", "attic", "basement", "garden", "living room", "bedroom", "office", "garage", "classroom", "hallway",
         "bakery", "workshop", "waiting room", "greenhouse", "library", "studio", "cellar", "balcony")
ANIMALS = ("cat", "dog", "fox", "owl", "horse", "rabbit", "parrot", "turtle", "goat", "wolf", "bear", "mouse",
           "hedgehog", "crow", "dolphin", "frog", "squirrel", "donkey", "duck", "lizard", "hamster", "goldfish", "pig",
           "sheep", "deer", "bee", "snail", "penguin", "elephant", "tiger")
OBJECTS = ("clock", "umbrella", "key", "letter", "box", "lamp", "mirror", "bicycle", "suitcase", "painting", "map",
           "ring", "camera", "notebook", "chair", "violin", "teapot", "photograph", "coat", "radio", "candle", "kite",
           "telescope", "jar", "shoe", "hat", "blanket", "bottle", "book", "phone", "backpack", "guitar", "compass")
FOODS = ("pancakes", "soup", "bread", "pizza", "curry", "salad", "apple pie", "pasta", "rice", "chocolate cake",
         "lemonade", "tea", "coffee", "sushi", "tacos", "porridge", "cheese", "ice cream", "dumplings", "omelette",
         "hummus", "cookies", "stew", "noodles", "a sandwich", "roast chicken", "banana bread", "tomato sauce")
DISHES = ("pancakes", "vegetable soup", "banana bread", "a simple curry", "lemonade", "pizza dough", "tomato sauce",
          "a fruit salad", "fried rice", "chocolate chip cookies", "a cheese omelette", "lentil stew", "guacamole",
          "apple crumble", "a green smoothie", "mashed potatoes", "garlic bread", "iced tea", "hot chocolate")
JOBS = ("teacher", "nurse", "farmer", "baker", "pilot", "doctor", "plumber", "gardener", "librarian", "chef",
        "firefighter", "painter", "engineer", "lawyer", "carpenter", "photographer", "journalist", "shopkeeper",
        "musician", "scientist", "dentist", "postman", "architect", "mechanic", "tailor", "fisherman", "waiter")
ACTIVITIES = ("swimming", "cooking", "reading", "running", "gardening", "painting", "travelling", "camping", "dancing",
              "hiking", "fishing", "knitting", "singing", "cycling", "baking", "writing letters", "playing chess",
              "learning a language", "watching films", "taking photographs", "going to the beach", "playing the piano",
              "working from home", "waking up early", "living in a city", "shopping online", "studying at night")
SKILLS = ("to cook", "to play the guitar", "to speak Spanish", "to draw", "to swim", "to code", "to juggle",
          "to write a poem", "to ride a bike", "to save money", "to sleep better", "to make friends", "to type fast",
          "to grow tomatoes", "to bake bread", "to tie a tie", "to read music", "to meditate", "to change a tyre")
TOPICS = ("summer", "winter", "rainy days", "old movies", "public transport", "small towns", "social media", "homework",
          "long walks", "birthdays", "museums", "video games", "coffee shops", "the ocean", "trains", "music festivals",
          "Mondays", "libraries", "the weekend", "autumn leaves", "spring", "family dinners", "road trips",
          "the internet", "school uniforms", "gardens", "holidays", "the news", "football", "history", "the moon",
          "robots", "friendship", "money", "art", "cities", "science", "television", "the future", "childhood")
ADJECTIVES = ("quiet", "strange", "bright", "cold", "tiny", "enormous", "dusty", "cheerful", "dark", "old", "new",
              "beautiful", "noisy", "empty", "crowded", "warm", "mysterious", "lonely", "colourful", "peaceful",
              "broken", "shiny", "forgotten", "magical", "ordinary", "busy", "gentle", "tall", "narrow", "wet")
WEATHER = ("rainy", "sunny", "foggy", "windy", "snowy", "hot", "cold", "grey", "stormy", "cloudy", "bright", "quiet")
TIMES = ("morning", "afternoon", "evening", "night", "day", "Sunday", "Monday", "Friday night", "winter evening",
         "summer afternoon", "spring morning")
PRODUCTS = ("blender", "vacuum cleaner", "pair of headphones", "backpack", "coffee machine", "desk lamp", "phone case",
            "pair of running shoes", "kettle", "water bottle", "electric toothbrush", "umbrella", "office chair",
            "board game", "rice cooker", "winter jacket", "keyboard", "tent", "toaster", "alarm clock")
CATEGORIES = ("fruits", "vegetables", "animals", "colours", "countries", "sports", "musical instruments", "flowers",
              "birds", "jobs", "board games", "breakfast foods", "things to do on a rainy day", "famous painters",
              "kitchen tools", "things to pack for a holiday", "hobbies", "trees", "rivers", "insects", "desserts",
              "gifts for a friend", "ways to relax", "words that rhyme with cat", "things in a classroom",
              "names for a dog", "places to visit in Europe", "household chores", "winter clothes", "spices")
FEELINGS = ("happy", "nervous", "tired", "excited", "sad", "angry", "surprised", "bored", "proud", "worried",
            "curious", "calm", "lonely", "hopeful", "confused")
TASKS = ("clean the kitchen", "plant a tree", "paint a wall", "write a cover letter", "pack a suitcase",
         "make a cup of tea", "fix a flat tyre", "organise a bookshelf", "plan a birthday party", "wash a car",
         "start a vegetable garden", "train a puppy", "set up a tent", "learn a new song", "bake a cake",
         "prepare for a job interview", "clean a window", "build a birdhouse", "write a short story",
         "make a budget", "study for an exam", "move to a new house", "sew a button", "make new friends",
         "take a good photograph", "care for a houseplant", "cook rice", "start running", "wrap a present")
VERBS_PAST = ("lost the keys", "ate the last cookie", "forgot my birthday", "sold the car", "painted the door green",
              "moved to another city", "quit your job", "found the map", "broke the window", "adopted a cat",
              "won the race", "missed the train", "told everyone", "cancelled the trip", "bought a boat")
PLURALS = {"fox": "foxes", "wolf": "wolves", "mouse": "mice", "sheep": "sheep", "deer": "deer", "goldfish": "goldfish"}
CITIES = ("Paris", "Tokyo", "New York", "Rome", "London", "Berlin", "Cairo", "Mexico City", "Sydney", "Lisbon", "Iceland",
          "Kenya", "Peru", "Norway", "Vietnam", "Scotland", "Canada", "Morocco", "India", "Istanbul", "Vienna", "Seoul")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
CONTEXTS = ("It had been raining for three days.", "The bus was late again.", "Nobody expected what happened next.",
            "The town was quiet after the festival.", "It was the first day of the holidays.",
            "The letter arrived on a Tuesday.", "Everyone had gone home except one person.",
            "The lights in the building flickered.", "It was the coldest winter anyone remembered.",
            "The market was full of people.", "The phone rang twice and stopped.", "The river had flooded the road.")
QUESTIONS = (
    "What is a good name for a pet {animal}?", "Why do people enjoy {activity}?", "What should I pack for a trip to {place}?",
    "How do you make {dish}?", "What is the best way {skill}?", "What does a {job} do all day?",
    "Which is better, {food} or {food2}?", "What is your favourite thing about {topic}?",
    "Where is a good place to go {activity2}?",
    "What is the hardest part of being a {job}?", "Why is {topic} important?", "What can I cook with {food} and {food2}?",
    "How can I help my {relative} feel less {feeling}?", "What would you do with a {adjective} {object}?",
    "What is the most interesting thing about {animals}?", "How do I explain {topic} to a child?",
    "What gift should I buy for my {relative}?", "Is it a good idea to start {activity}?", "What makes a good {job}?",
    "What do you think about {topic}?", "How long does it take {skill}?", "What is a fun thing to do in {place}?",
    "Why are some people afraid of {animals}?", "What should I name my new {object}?", "What do {animals} eat?",
    "How can I get better at {activity}?", "What is one thing everyone should know about {topic}?",
    "What did people do before {topic} existed?", "Can you describe a typical day in {city}?",
    "What is the difference between a {job} and a {job2}?", "How would you describe {topic} in one sentence?",
)
OPINIONS = (
    "The best thing about {topic} is", "I think {topic} is", "In my opinion, the worst part of {activity} is",
    "Honestly, {food} tastes", "The most underrated thing about {topic} is", "People who love {activity} are",
    "My favourite memory of {topic} is", "If I could change one thing about {topic}, it would be",
    "The problem with {topic} is that", "I have never understood why people like {activity}, because",
    "What I love most about {place} is", "Everyone says {food} is great, but", "The best {job} I ever met was",
    "Nothing beats {food} on a {weather} {time}, because", "My {relative} always says that {topic} is",
)
STORIES = (
    "Once upon a time, in {place}, there was a {adjective} {animal} who",
    "{name} opened the {object2} and found", "It was a {weather} {time} in {place} when {name}",
    "The {adjective} {object} in the {room} had been there for", "Nobody in {place} knew why {name}",
    "On the morning of her birthday, {name} woke up and", "{context} {name} looked out of the window and",
    "The {animal} stopped in the middle of the road and", "When {name} was a child, {pronoun} used to",
    "Long ago, a {job} from {place} decided to", "{name} had never seen a {adjective} {object} before.",
    "The last time {name} visited {place},", "{context} In the {room}, {name} found",
    "Every {time}, the old {job} would", "The {animal} and the {animal2} were best friends until",
    "{name} and {name2} arrived in {place} just as", "It all started with a {adjective} {object} and",
    "The door to the {room} was open, and", "{name} picked up the {object} and said",
    "In a {adjective} house at the end of the street lived a {job} who",
)
LISTS = (
    "Here is a list of {category}:", "Five {category} I like:", "My favourite {category} are",
    "Three things every {job} needs:", "Ingredients for {dish}:\n-", "My to-do list for {day}:\n1.",
    "Things to do in {place}:\n1.", "A shopping list for {dish}:", "Ten {category}, in no particular order:",
    "Reasons to try {activity}:\n1.", "Things I want to do this {season}:\n-", "The best {category} for children:",
    "Packing list for {place}:\n-", "Some {category} that start with the letter {letter}:",
)
DESCRIPTIONS = (
    "The {room} was {adjective} and", "She described the {object} as", "The view from the top of the hill was",
    "The {animal} had {adjective} fur and", "{city} in {month} is", "My {relative}'s {room} always smells of",
    "The {job} wore a {adjective} coat and", "From the outside, the house looked", "The sky over {city} was",
    "The {object} was so {adjective} that", "Walking into the {room}, you first notice", "{name}'s {object} is",
    "The market in {city} sells", "A typical {job} starts the day by", "The {adjective} {room} smelled of",
)
DIALOGUES = (
    "\"Where are you going?\" asked {name}.", "{name}: Did you remember to {task}?\n{name2}:",
    "\"I can't believe you {past},\" said {name}.", "{name}: What do you want for dinner?\n{name2}:",
    "\"Have you ever been to {place}?\" {name} asked.", "{name}: I think we should get a {animal}.\n{name2}:",
    "\"Is this your {object}?\" the {job} asked.", "{name}: Why are you so {feeling} today?\n{name2}:",
    "{name} said, \"The problem is", "\"Tell me about {place},\" said {name}.", "Customer: Do you sell {food}?\nShopkeeper:",
    "Teacher: Who can tell me about {topic}?\nStudent:", "{name}: What are you reading?\n{name2}:",
    "Doctor: How have you been feeling?\nPatient:", "\"What happened to the {object}?\" asked {name}.",
)
INSTRUCTIONS = (
    "To {task}, first", "Step 1: Find a {adjective} {object}.\nStep 2:", "How to {task}:\n1.",
    "Before you {task}, make sure", "The easiest way to {task} is", "Here is how I {task_past}:",
    "A beginner's guide to {activity}:", "Tips for anyone who wants to {task}:", "If you want to {task}, you should",
    "Write a short poem about {topic}.\n\n", "Describe a {adjective} {room} in three sentences.\n\n",
    "Give me a reason to try {activity}.\n\n", "Explain {topic} to a ten year old.\n\n",
    "Write a sentence about a {animal}.\n\n", "Suggest a name for a {adjective} {animal}.\n\n",
)
LETTERS = (
    "Dear {name},\n\nI am writing to", "Hi {name}, thanks for", "Dear {relative},\nI hope you are",
    "Dear diary, today I", "{day}, {month} {date}. Today", "To whom it may concern,\n\nI", "Dear {name}, I am sorry that",
    "Hello {name}! I just got back from {place} and", "Dear neighbour, I wanted to let you know that",
)
REVIEWS = (
    "This {product} is", "I bought this {product} for my {relative} and", "Review: The {product} arrived",
    "I have used this {product} for a month and", "Two stars. The {product}", "The restaurant's {food} was",
    "We stayed three nights in {place} and", "The film was", "Five stars! This {product}",
    "I would not recommend this {product} because",
)
FACTS = (
    "{animals} are known for", "The most interesting fact about {topic} is", "A {job} usually",
    "Most people don't know that {animals}", "The history of {food} begins", "In {city}, people usually",
    "One surprising thing about {topic} is", "Scientists who study {animals} have found", "{city} is famous for",
    "The main reason people move to {city} is",
)
CHATS = (
    "User: Can you help me {task}?\nAssistant:", "User: I feel {feeling} today.\nAssistant:",
    "User: Tell me something about {topic}.\nAssistant:", "User: What should I cook tonight?\nAssistant:",
    "User: Recommend a hobby for my {relative}.\nAssistant:", "User: I want to visit {place}.\nAssistant:",
    "User: Give me an idea for a story about a {animal}.\nAssistant:",
)
QA_FORMS = ("Question: {q}\nAnswer:", "Q: {q}\nA:", "{q}\n", "{q}")

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
SEASONS = ("summer", "winter", "spring", "autumn", "year", "weekend", "month")
LETTERS_ABC = tuple("ABCDEFGHLMPRST")


class _Rng:
    """Choices from random.Random's random() alone: the one method whose sequence Python promises to keep."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed).random

    def pick(self, items: Sequence[str]) -> str:
        return items[int(self._random() * len(items))]

    def chance(self, p: float) -> bool:
        return self._random() < p

    def unit(self) -> float:
        return self._random()


def _plural(animal: str) -> str:
    return PLURALS.get(animal, animal + "s")


def _fill(template: str, rng: _Rng) -> str:
    """`template` with each {slot} drawn from its word list (a slot named twice, e.g. {name} and {name2}, differs)."""
    name = rng.pick(NAMES)
    slots: dict[str, Callable[[], str]] = {
        "name": lambda: name, "name2": lambda: rng.pick([n for n in NAMES if n != name]),
        "pronoun": lambda: rng.pick(("she", "he", "they")),
        "relative": lambda: rng.pick(RELATIVES), "place": lambda: rng.pick(PLACES), "room": lambda: rng.pick(ROOMS),
        "animal": lambda: rng.pick(ANIMALS),
        "animals": lambda: _plural(rng.pick(ANIMALS)), "city": lambda: rng.pick(CITIES),
        "animal2": lambda: rng.pick(ANIMALS), "object": lambda: rng.pick(OBJECTS),
        "object2": lambda: rng.pick(("box", "letter", "door", "drawer", "suitcase", "envelope", "gate", "cupboard")),
        "food": lambda: rng.pick(FOODS), "food2": lambda: rng.pick(FOODS), "dish": lambda: rng.pick(DISHES),
        "job": lambda: rng.pick(JOBS), "job2": lambda: rng.pick(JOBS), "activity": lambda: rng.pick(ACTIVITIES),
        "activity2": lambda: rng.pick(("swimming", "hiking", "camping", "fishing", "cycling", "dancing", "shopping",
                                       "skiing", "running", "sailing", "walking")),
        "skill": lambda: rng.pick(SKILLS), "topic": lambda: rng.pick(TOPICS), "adjective": lambda: rng.pick(ADJECTIVES),
        "weather": lambda: rng.pick(WEATHER), "time": lambda: rng.pick(TIMES), "product": lambda: rng.pick(PRODUCTS),
        "category": lambda: rng.pick(CATEGORIES), "feeling": lambda: rng.pick(FEELINGS), "task": lambda: rng.pick(TASKS),
        "task_past": lambda: rng.pick(("cleaned my kitchen", "planted a tree", "learned to cook", "packed for a month",
                                       "trained my dog", "fixed my bike", "saved for a holiday", "painted my room")),
        "past": lambda: rng.pick(VERBS_PAST), "month": lambda: rng.pick(MONTHS), "day": lambda: rng.pick(DAYS),
        "date": lambda: str(1 + int(rng.unit() * 28)),
        "season": lambda: rng.pick(SEASONS), "letter": lambda: rng.pick(LETTERS_ABC),
        "context": lambda: rng.pick(CONTEXTS),
    }
    out, at = [], 0
    while True:
        start = template.find("{", at)
        if start < 0:
            out.append(template[at:])
            return "".join(out)
        end = template.index("}", start)
        out.append(template[at:start])
        out.append(slots[template[start + 1:end]]())
        at = end + 1


def _question(rng: _Rng) -> str:
    return rng.pick(QA_FORMS).replace("{q}", _fill(rng.pick(QUESTIONS), rng))


KINDS: tuple[tuple[str, float, Callable[[_Rng], str]], ...] = (
    ("question", 3.0, _question),
    ("story", 2.0, lambda rng: _fill(rng.pick(STORIES), rng)),
    ("opinion", 1.5, lambda rng: _fill(rng.pick(OPINIONS), rng)),
    ("list", 1.0, lambda rng: _fill(rng.pick(LISTS), rng)),
    ("description", 1.2, lambda rng: _fill(rng.pick(DESCRIPTIONS), rng)),
    ("dialogue", 1.2, lambda rng: _fill(rng.pick(DIALOGUES), rng)),
    ("instruction", 1.2, lambda rng: _fill(rng.pick(INSTRUCTIONS), rng)),
    ("letter", 0.8, lambda rng: _fill(rng.pick(LETTERS), rng)),
    ("review", 0.8, lambda rng: _fill(rng.pick(REVIEWS), rng)),
    ("fact", 0.8, lambda rng: _fill(rng.pick(FACTS), rng)),
    ("chat", 0.6, lambda rng: _fill(rng.pick(CHATS), rng)),
)
"""Each kind of text, how often it is drawn, and how one is made."""


def _with_context(prompt: str, rng: _Rng) -> str:
    """Now and then a sentence of context before the prompt: longer prompts, as an eval's are."""
    if rng.chance(0.3) and not prompt.startswith(("User:", "Dear", "Hi ", "Hello", "To whom", "Q", "Customer", "Teacher",
                                                    "Doctor")):
        return f"{rng.pick(CONTEXTS)} {prompt}"
    return prompt


def candidates(count: int = CANDIDATES, seed: int = SEED) -> list[tuple[str, str]]:
    """`count` distinct (kind, prompt) pairs of MIN_WORDS to MAX_WORDS words, the same on every run."""
    rng = _Rng(seed)
    weights = [w for _, w, _ in KINDS]
    total = sum(weights)
    seen: set[str] = set()
    made: list[tuple[str, str]] = []
    attempts = 0
    while len(made) < count:
        attempts += 1
        if attempts > 50 * count:
            raise RuntimeError(f"only {len(made)} distinct candidates in {attempts} attempts: the word lists are too small")
        at, point = 0, rng.unit() * total
        while point >= weights[at]:
            point -= weights[at]
            at += 1
        kind, _, make = KINDS[at]
        prompt = _with_context(make(rng), rng)
        if prompt in seen or not MIN_WORDS <= len(prompt.split()) <= MAX_WORDS:
            continue
        seen.add(prompt)
        made.append((kind, prompt))
    return made


def order_key(prompt: str) -> str:
    """The pool's order: a keyed hash of each prompt, a shuffle anyone can check without the server."""
    return hashlib.sha256(f"{SEED}\x00{prompt}".encode()).hexdigest()


# The filter -------------------------------------------------------------------------------------------------------


def request(prompt: str) -> dict[str, Any]:
    """Exactly what the peer probe sends, with `prompt` in place of its question."""
    from specwatch.probe.peerprobe import body

    return {**body(0), "prompt": prompt}


def ask(url: str, prompt: str) -> Any:
    data = json.dumps(request(prompt)).encode()
    asked = urllib.request.Request(f"{url}/v1/completions", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(asked, timeout=120) as answer:
        return json.loads(answer.read())


def measure(answer: Any) -> tuple[str, list[float]]:
    """The answer's text and its tokens' logprobs (the greedy token is the top-1 at temperature 0)."""
    from specwatch.probe.readers import read_choice

    tokens = read_choice(answer).tokens
    return "".join(t.text or "" for t in tokens), [t.logprob if t.logprob is not None else 0.0 for t in tokens]


def undecided(text: str, values: Sequence[float]) -> bool:
    """The criterion: 8 tokens, a text that is not blank, and a model unsure at the first token and on average."""
    return (len(values) == TOKENS and bool(text.strip()) and values[0] <= FIRST_AT_MOST
            and statistics.fmean(values) <= MEAN_AT_MOST)


Measured = tuple[str, str, str, list[float]]
"""A candidate asked: (kind, prompt, the answer's text, its tokens' logprobs)."""


def answers_cache() -> Path:
    from tests.support import llamabuild

    return llamabuild.cache_root() / "prompt_pool" / f"answers-{SEED}.jsonl"


def run_filter(made: Sequence[tuple[str, str]], servers: int, log: Path | None, cache: Path | None) -> list[Measured]:
    """Every candidate asked of a real Gemma (b11434, -np 1, -t 1, idle), `servers` of them side by side. Answers
    already in `cache` (a JSONL file of prompt, text and values) are not asked again; new ones are added to it."""
    from specwatch.demo.llamaserver import LlamaServer
    from tests.support import gemma

    known: dict[str, tuple[str, list[float]]] = {}
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            record = json.loads(line)
            known[record["prompt"]] = (record["text"], record["values"])
    results: list[Measured | None] = [(k, p, *known[p]) if p in known else None for k, p in made]
    missing = [i for i, r in enumerate(results) if r is None]
    if not missing:
        return [r for r in results if r is not None]
    model = gemma.model()
    running = [LlamaServer(model, ["-a", gemma.ALIAS], threads=1, parallel=1, log_dir=log, startup_timeout=180).start()
               for _ in range(servers)]
    started, done, lock, stop = time.monotonic(), [0], threading.Lock(), threading.Event()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(cache, "a") if cache is not None else contextlib.nullcontext() as out:
            def work(lane: int) -> None:
                url = running[lane].url
                for index in missing[lane::servers]:
                    if stop.is_set():
                        return
                    kind, prompt = made[index]
                    text, values = measure(ask(url, prompt))
                    results[index] = (kind, prompt, text, values)
                    with lock:
                        if out is not None:
                            out.write(json.dumps({"prompt": prompt, "text": text, "values": values}) + "\n")
                            out.flush()
                        done[0] += 1
                        if done[0] % 250 == 0:
                            print(f"  {done[0]}/{len(missing)} asked, {time.monotonic() - started:.0f} s",
                                  file=sys.stderr, flush=True)

            with concurrent.futures.ThreadPoolExecutor(servers) as pool:
                futures = [pool.submit(work, lane) for lane in range(servers)]
                try:
                    for future in futures:
                        future.result()
                except BaseException:
                    stop.set()  # an interrupt or a failed lane: the others stop after their answer in flight
                    raise
    finally:
        for server in running:
            server.close()
    return [r for r in results if r is not None]


def kept(measured: Sequence[Measured]) -> list[str]:
    return [prompt for _, prompt, text, values in measured if undecided(text, values)]


def pool_of(kept: Sequence[str]) -> list[str]:
    return sorted(kept, key=order_key)


def render(pool: Sequence[str]) -> str:
    return "[\n" + ",\n".join(json.dumps(p) for p in pool) + "\n]\n"


def criterion() -> str:
    return (f"{TOKENS} tokens, a text that is not blank, first-token logprob <= {FIRST_AT_MOST}, "
            f"mean logprob of the {TOKENS} tokens <= {MEAN_AT_MOST}")


def _report(measured: Sequence[Measured]) -> None:
    asked = Counter(k for k, _, _, _ in measured)
    good = Counter(k for k, _, text, values in measured if undecided(text, values))
    for kind, _, _ in KINDS:
        print(f"  {kind:12s} {good[kind]:5d} of {asked[kind]:5d} kept ({good[kind] / max(asked[kind], 1):.0%})")


def check(refilter: bool, servers: int) -> int:
    shipped = json.loads(POOL.read_text())
    made = candidates()
    prompts = {p for _, p in made}
    problems = []
    if not isinstance(shipped, list) or not all(isinstance(p, str) for p in shipped):
        problems.append("not a JSON list of strings")
    if len(set(shipped)) != len(shipped):
        problems.append("duplicates")
    if stray := [p for p in shipped if p not in prompts]:
        problems.append(f"{len(stray)} prompts this script does not generate, e.g. {stray[0]!r}")
    if shipped != pool_of(shipped):
        problems.append("not in the pool's order (sorted by order_key)")
    if POOL.read_text() != render(shipped):
        problems.append("not written as render() writes it")
    if (size := POOL.stat().st_size) >= MAX_BYTES:
        problems.append(f"{size} bytes, over {MAX_BYTES}")
    if refilter:
        expected = pool_of(kept(run_filter(made, servers, None, None)))
        if expected != shipped:
            gone, new = set(shipped) - set(expected), set(expected) - set(shipped)
            problems.append(f"the filter now keeps another set: {len(gone)} shipped prompts not kept, {len(new)} kept "
                            "prompts not shipped")
    print(f"{POOL.relative_to(ROOT)}: {len(shipped)} prompts of {len(made)} candidates, {POOL.stat().st_size} bytes; "
          f"criterion: {criterion()}")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    print("ok" if not problems else "differs", "(candidates and order" + (", and the filter asked again)" if refilter
                                                                           else "; the filter was not asked again)"))
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_pool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="verify the shipped pool instead of writing it")
    parser.add_argument("--refilter", action="store_true", help="with --check: ask every candidate again (servers)")
    parser.add_argument("--servers", type=int, default=2, help="llama-servers asked side by side (2: one per CPU)")
    parser.add_argument("--candidates", type=int, default=CANDIDATES,
                        help=f"generate and ask only the first N candidates ({CANDIDATES}); the pool is written "
                             "only for the full count")
    parser.add_argument("--log-dir", type=Path, help="where the servers' logs go")
    parser.add_argument("--fresh", action="store_true",
                        help="ask every candidate again instead of reading answers kept from an earlier run (they are "
                             "kept in the cache, ~/.cache/specwatch/prompt_pool/, so the criterion can be tuned)")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.refilter, args.servers)
    made = candidates()[:args.candidates]
    started = time.monotonic()
    measured = run_filter(made, args.servers, args.log_dir, None if args.fresh else answers_cache())
    pool = pool_of(kept(measured))
    text = render(pool)
    print(f"generated {len(made)}, kept {len(pool)} ({len(pool) / len(made):.1%}) in {time.monotonic() - started:.0f} s; "
          f"criterion: {criterion()}")
    _report(measured)
    if args.candidates != CANDIDATES:
        print("(a trial on part of the candidates: the pool is not written)")
        return 0
    POOL.write_text(text)
    print(f"wrote {POOL.relative_to(ROOT)}: {len(pool)} prompts, {len(text.encode())} bytes; "
          f"indices from {RESERVED} on are held out")
    return 0 if len(text.encode()) < MAX_BYTES else 1


if __name__ == "__main__":
    raise SystemExit(main())
