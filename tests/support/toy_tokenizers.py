"""Small tokenizers and trajectory texts for the span-scanner tests and benchmark (no downloads).

* `byte_level_tokenizer()`: byte-level BPE trained here (~800 ids) with a Qwen2-style split regex;
  the tag markers are ordinary text, so BPE learns pieces such as "<mem", ">\\n", "</", "></".
* `special_tag_tokenizer()`: the same model with the 12 markers added as special tokens (the
  id-only fast path applies).
* `whole_text_tokenizer()`: byte-level BPE without any pre-split, so merges cross word and marker
  boundaries freely ("><", "e>\\n<", ...): the hardest case for mapping bytes back to tokens.
* `json_special_tag_tokenizer()`: `byte_level_tokenizer()` with the 10 markers of the JSON tool-call
  tag set (`JSON_MARKERS`, as Qwen's vocabulary has ``<tool_call>``) added as special tokens.
All are built once per process (functools.lru_cache) from seeded generated text. `json_random_text`
makes texts of the JSON tool-call format (``<tool_call>{...}</tool_call>``, ``<tool_response>``).
"""
from __future__ import annotations

import functools
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

TAG_NAMES = ("mem", "think", "search", "access", "answer", "information")
MARKERS = tuple(m for name in TAG_NAMES for m in (f"<{name}>", f"</{name}>"))
JSON_TAG_NAMES = ("mem", "think", "tool_call", "answer", "tool_response")
JSON_MARKERS = tuple(m for name in JSON_TAG_NAMES for m in (f"<{name}>", f"</{name}>"))

# The pre-tokenizer split of Qwen2 (and, up to details, Llama 3 and GPT-4).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

WORDS = (
    "the of and to in is was for on that with as by at from his her an which it be are this "
    "river city museum capital founded population director film album born year team league "
    "president company university novel author song band river bridge mountain island war "
    "treaty king queen empire railway station award prize season episode series game church "
    "who what when where how many first last largest oldest between after before during "
    "Paris London Berlin Tokyo Nile Amazon Einstein Curie Mozart Beatles Hotpot Wikipedia "
    "1889 1921 2003 42 7 3.14 100,000 café naïve Zürich São Paulo Москва 東京 北京 😀 — … "
    "mem think search access answer information memo thinking searched answered informed "
    "<div> <p> </p> <br/> a<b c>d x < y > z -> => <= == != && || html http://example.org/page"
).split()

ACTION_QUERIES = ("who founded", "when was", "capital of", "population of", "author of")


def _sentence(rng: random.Random, lo: int = 3, hi: int = 14) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def well_formed_trajectory(rng: random.Random, rounds: int, doc_words: int = 40) -> str:
    """A trajectory following the protocol: per round mem, think, one action, and the tool's
    information block after search/access; the last round answers."""
    parts = []
    for r in range(rounds):
        parts.append(f"<mem>{_sentence(rng)}</mem>\n")
        parts.append(f"<think>\n{_sentence(rng, 5, 25)}\n</think>\n")
        if r == rounds - 1:
            parts.append(f"<answer>{_sentence(rng, 1, 4)}</answer>")
            break
        action = rng.choice(("search", "access"))
        parts.append(f"<{action}>{rng.choice(ACTION_QUERIES)} {_sentence(rng, 1, 4)}</{action}>")
        parts.append("\n\n<information>")
        parts.append(_sentence(rng, doc_words // 2, doc_words))
        if rng.random() < 0.3:  # tool output quoting tags: content, not structure
            parts.append(f" {rng.choice(MARKERS)} {_sentence(rng, 1, 5)}")
        parts.append("</information>\n\n")
    return "".join(parts)


_JUNK = (
    "<", ">", "</", "<<", ">>", "><", "\n<", ">\n", "<mem", "mem>", "</mem", "<MEM>", "< mem>",
    "<mem >", "<me m>", "<memo>", "</ answer>", "<answer/>", "<information", "<think>>",
    "<<mem>>", "</mem></mem>", "<mem><mem>", "\n<mem>", "<search></search>", "<i>", "</>",
)


def malformed_text(rng: random.Random) -> str:
    """Random words with markers and marker-like junk inserted anywhere, glued or spaced."""
    pieces = []
    for _ in range(rng.randint(0, 40)):
        roll = rng.random()
        if roll < 0.45:
            pieces.append(rng.choice(WORDS))
        elif roll < 0.8:
            pieces.append(rng.choice(MARKERS))
        else:
            pieces.append(rng.choice(_JUNK))
        pieces.append(rng.choice(("", "", " ", "\n", "  ", "\n\n")))
    return "".join(pieces)


def mutated_trajectory(rng: random.Random) -> str:
    """A well-formed trajectory with markers deleted, duplicated or inserted at random places."""
    text = well_formed_trajectory(rng, rng.randint(1, 5), doc_words=16)
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.4:  # delete one marker occurrence
            marker = rng.choice(MARKERS)
            at = text.find(marker)
            if at >= 0:
                text = text[:at] + text[at + len(marker):]
        elif roll < 0.8:  # insert a marker at a random character position
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(MARKERS) + text[at:]
        else:  # truncate
            text = text[: rng.randint(0, len(text))]
    return text


def random_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.3:
        return well_formed_trajectory(rng, rng.randint(1, 4), doc_words=20)
    if roll < 0.65:
        return mutated_trajectory(rng)
    return malformed_text(rng)


def json_tool_call_trajectory(rng: random.Random, rounds: int, doc_words: int = 20) -> str:
    """A trajectory of the JSON tool-call format: per round mem, think, one ``<tool_call>`` holding a
    Hermes JSON call (or the answer in the last round), answered in ``<tool_response>``."""
    parts = []
    for r in range(rounds):
        parts.append(f"<mem>{_sentence(rng)}</mem>\n<think>\n{_sentence(rng, 5, 25)}\n</think>\n")
        if r == rounds - 1:
            parts.append(f"<answer>{_sentence(rng, 1, 4)}</answer>")
            break
        name = rng.choice(("lookup", "calc", "search"))
        parts.append(f'<tool_call>\n{{"name": "{name}", "arguments": {{"q": "{_sentence(rng, 1, 4)}"}}}}\n</tool_call>')
        parts.append(f"\n<tool_response>\n{_sentence(rng, doc_words // 2, doc_words)}")
        if rng.random() < 0.3:  # tool output quoting tags (either format's): content, not structure
            parts.append(f" {rng.choice(JSON_MARKERS + MARKERS)} {_sentence(rng, 1, 5)}")
        parts.append("\n</tool_response>\n")
    return "".join(parts)


_JSON_JUNK = ("<tool", "_call>", "<tool_call", "</tool_", "<tool_calls>", "<TOOL_CALL>", "< tool_call>",
              '{"name": "x"}', "{", "}", '"', "<tool_response", "response>", "<tool_call>{", "}</tool_call>")


def json_random_text(rng: random.Random) -> str:
    """Well-formed JSON-format trajectories, mutated ones, and junk mixing both formats' markers."""
    roll = rng.random()
    if roll < 0.3:
        return json_tool_call_trajectory(rng, rng.randint(1, 4))
    if roll < 0.65:
        text = json_tool_call_trajectory(rng, rng.randint(1, 5), doc_words=16)
        for _ in range(rng.randint(1, 6)):
            at = rng.randint(0, len(text))
            if rng.random() < 0.6:
                text = text[:at] + rng.choice(JSON_MARKERS + MARKERS) + text[at:]
            else:
                text = text[:at]
        return text
    pieces = []
    for _ in range(rng.randint(0, 40)):
        roll = rng.random()
        pieces.append(rng.choice(WORDS) if roll < 0.4 else rng.choice(JSON_MARKERS) if roll < 0.75
                      else rng.choice(_JSON_JUNK + _JUNK))
        pieces.append(rng.choice(("", "", " ", "\n")))
    return "".join(pieces)


def training_corpus(seed: int = 0, size: int = 400) -> list[str]:
    rng = random.Random(seed)
    corpus = [random_text(rng) for _ in range(size)]
    corpus += [well_formed_trajectory(rng, 3) for _ in range(size // 4)]
    return corpus


def _train(pre_tokenizer, vocab_size: int, corpus: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


@functools.lru_cache(maxsize=None)
def byte_level_tokenizer() -> Tokenizer:
    """Byte-level BPE (~800 ids), Qwen2-style split; tags are plain text."""
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return _train(pre, 800, training_corpus(0))


@functools.lru_cache(maxsize=None)
def special_tag_tokenizer() -> Tokenizer:
    """`byte_level_tokenizer()` plus the 12 markers as special tokens."""
    tokenizer = Tokenizer.from_str(byte_level_tokenizer().to_str())
    tokenizer.add_special_tokens(list(MARKERS))
    return tokenizer


@functools.lru_cache(maxsize=None)
def whole_text_tokenizer() -> Tokenizer:
    """Byte-level BPE with no pre-split (~600 ids): merges cross markers and words."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return _train(pre, 600, training_corpus(1, size=200))


@functools.lru_cache(maxsize=None)
def json_special_tag_tokenizer() -> Tokenizer:
    """`byte_level_tokenizer()` plus the 10 JSON tool-call markers as special tokens."""
    tokenizer = Tokenizer.from_str(byte_level_tokenizer().to_str())
    tokenizer.add_special_tokens(list(JSON_MARKERS))
    return tokenizer
