"""The ledger: a synthetic task where memory is the bottleneck (`Ledger`, the world of ``synthetic.task:
ledger``; its tools: `mempo.synthetic.ledger_tools`, its teacher: `mempo.synthetic.ledger_oracle`).

Accounts with one-word names each have one entry, an amount, written on a ledger page; a page lists the
entries of ``page_entries`` accounts, and a lookup of an account shows its entry and the page, the other
accounts' entries beside it being the distractors (`entry_line`)::

    L0042: Kodan7, Tamor3, Rivel5, Belis1.                 the page (a lookup by its id)
    Found Tamor3 on L0042: Kodan7, Tamor3, Rivel5, Belis1.  a lookup of Tamor

An amount is written right after its account's name. A byte-level BPE that splits digits apart (Qwen's,
the demo's) then reads the amount's first digit as the token after the name's, which a small model copies
in one step (an induction head: the token that followed this name before); with a space between them a
~1 M-parameter model copied no two-digit amount right (docs/experiments/G01-ledger-demo.md; a second
digit would need the same two-token context), so the demo's amounts are one digit (``synthetic.ledger_amounts:
[1, 9]``).

A question names k accounts on k different pages and asks for arithmetic over their amounts, so it
needs k lookups, then one calculation (`QUESTION_KINDS`)::

    balance     (k = 1)   What is the balance of Tamor?                         3
    total       (k >= 2)  What is the total balance of Tamor and Belis?          4    (3 + 1)
    difference  (k >= 2)  How much more does Tamor hold than Belis?              2    (3 - 1)
                          How much more do Tamor and Kodan hold together than Belis?   9 (3 + 7 - 1)
    larger      (k = 2)   Which holds more, Tamor or Belis?                      Tamor

Under the memory context the agent sees only its last turn and the last tool result, so every amount
found must travel in its ``<mem>`` to the calculation: an agent that drops one cannot answer. In this
task k (``eval.objectives``, ``data.num_objectives``, ``synthetic.oracle_objectives``) counts the accounts
a question needs, and an episode asks one question (one gold).

Golds are strings: a positive integer in digits (a difference subtracts the smallest amount) or an account
name. EM compares after SQuAD normalisation (`mempo.protocol.reward.
normalize_answer`: lower case, punctuation and articles dropped, white space collapsed): ``47``,
`` 47 `` and ``47.`` match the gold ``47``; ``47.0`` and ``forty-seven`` do not; ``tamor`` matches ``Tamor``.

Splits, by account (`SPLITS`): the accounts are shuffled once (seeded) and cut into ``test``
(`TEST_SHARE`), ``validation`` (`VALIDATION_SHARE`) and ``train`` (the rest); a question draws all its
accounts from one split, so evaluation (test), model selection (validation) and training never share an
account. Everything is deterministic from the seed and the sizes (standard library only).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Iterator, Optional, Sequence, Union

from mempo.env.corpus import Document
from mempo.env.data import PROMPT_STYLES, Episode, QARecord, make_episode_prompt
from mempo.synthetic.entities import Entity, Names

__all__ = ["Ledger", "QUESTION_KINDS", "SPLITS", "TEST_SHARE", "VALIDATION_SHARE", "MIN_ACCOUNTS", "kinds_for",
           "question_text", "parse_ledger_question", "expression_of", "answer_of", "page_line", "entry_line"]

#: The question kinds (module docstring); `kinds_for` says which a k allows.
QUESTION_KINDS = ("balance", "total", "difference", "larger")
SPLITS = ("train", "validation", "test")
#: The shares of the accounts in the test and validation splits (the rest train).
TEST_SHARE = 0.2
VALIDATION_SHARE = 0.1
#: The fewest accounts a ledger has (each split then holds a few).
MIN_ACCOUNTS = 40
#: How often a question's draw is retried before the split is said to be too small.
_DRAW_ATTEMPTS = 200

_NAME = r"[A-Z][a-z]+"
_LIST = rf"{_NAME}(?:, {_NAME})*(?: and {_NAME})?"
_QUESTION_RES = {
    "balance": re.compile(rf"^What is the balance of (?P<accounts>{_NAME})\?$"),
    "total": re.compile(rf"^What is the total balance of (?P<accounts>{_LIST})\?$"),
    "difference": re.compile(rf"^How much more (?:does (?P<one>{_NAME}) hold|do (?P<many>{_LIST}) hold together) "
                             rf"than (?P<last>{_NAME})\?$"),
    "larger": re.compile(rf"^Which holds more, (?P<a>{_NAME}) or (?P<b>{_NAME})\?$"),
}


def kinds_for(k: int) -> tuple[str, ...]:
    """The question kinds of k accounts: ``balance`` for 1; ``total``, ``difference``, ``larger`` for 2;
    ``total``, ``difference`` for more."""
    if k < 1:
        raise ValueError(f"a ledger question needs at least 1 account, got {k}")
    return ("balance",) if k == 1 else ("total", "difference", "larger") if k == 2 else ("total", "difference")


def _listing(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def question_text(kind: str, accounts: Sequence[str]) -> str:
    """The question of `kind` about `accounts` in order (for ``difference`` the last is subtracted)."""
    if kind == "balance":
        return f"What is the balance of {accounts[0]}?"
    if kind == "total":
        return f"What is the total balance of {_listing(accounts)}?"
    if kind == "difference":
        if len(accounts) == 2:
            return f"How much more does {accounts[0]} hold than {accounts[1]}?"
        return f"How much more do {_listing(accounts[:-1])} hold together than {accounts[-1]}?"
    if kind == "larger":
        return f"Which holds more, {accounts[0]} or {accounts[1]}?"
    raise ValueError(f"unknown question kind {kind!r}; kinds are {QUESTION_KINDS}")


def _split_listing(text: str) -> list[str]:
    head, _, last = text.rpartition(" and ")
    return (head.split(", ") + [last]) if head else [last]


def parse_ledger_question(question: str) -> Optional[tuple[str, list[str]]]:
    """``(kind, accounts in order)`` of a question `question_text` writes, else None (the teacher reads
    questions this way: it knows the question grammar, not the ledger)."""
    text = question.strip()
    for kind, pattern in _QUESTION_RES.items():
        match = pattern.match(text)
        if match is None:
            continue
        if kind == "larger":
            return kind, [match.group("a"), match.group("b")]
        if kind == "difference":
            first = [match.group("one")] if match.group("one") else _split_listing(match.group("many"))
            return kind, first + [match.group("last")]
        return kind, _split_listing(match.group("accounts"))
    return None


def expression_of(kind: str, amounts: Sequence[Union[int, str]]) -> Optional[str]:
    """The calculation a question of `kind` needs over the amounts of its accounts in order (None for
    ``balance``: nothing to calculate): a sum, the sum of all but the last minus the last, or the first
    minus the second (``larger``: its sign names the answer)."""
    values = [str(a) for a in amounts]
    if kind == "balance":
        return None
    if kind == "total":
        return " + ".join(values)
    if kind in ("difference", "larger"):
        return " + ".join(values[:-1]) + " - " + values[-1]
    raise ValueError(f"unknown question kind {kind!r}; kinds are {QUESTION_KINDS}")


def answer_of(kind: str, accounts: Sequence[str], amounts: Sequence[int]) -> str:
    """The gold answer string of a question (module docstring)."""
    if kind == "balance":
        return str(amounts[0])
    if kind == "total":
        return str(sum(amounts))
    if kind == "difference":
        return str(sum(amounts[:-1]) - amounts[-1])
    if kind == "larger":
        return accounts[0] if amounts[0] > amounts[1] else accounts[1]
    raise ValueError(f"unknown question kind {kind!r}; kinds are {QUESTION_KINDS}")


def entry_line(name: str, amount: int, page: str) -> str:
    """An account's lookup: its entry, then the page listing it among the other accounts' entries (the
    distractors): ``Found Tamor3 on L0042: Kodan7, Tamor3, Rivel5, Belis1.`` The entry comes first so that its
    amount is the first number of the result, a place a small model learns to copy from; found only on the
    page, it is the digit after a name the context holds three more times (the question, the call, the
    ``<mem>``), which a ~1 M-parameter model never learnt to pick (docs/experiments/G01-ledger-demo.md)."""
    return f"Found {name}{amount} on {page}"


def page_line(page_id: str, entries: Sequence[tuple[str, int]]) -> str:
    """A page as a lookup shows it: ``L0042: Kodan7, Tamor3.`` (each amount right after its name)."""
    return f"{page_id}: " + ", ".join(f"{name}{amount}" for name, amount in entries) + "."


@dataclass
class Ledger:
    """A generated ledger (build it with `Ledger.generate`). ``entities``: the accounts as
    `mempo.synthetic.entities.Entity` records (kind ``"account"``, ``doc_id`` the page holding the
    entry), so what works on a world's names (the tokenizer's name list, the copy warm-up, renaming)
    works here; ``amounts[i]`` / ``splits[i]``: account i's amount and split; ``pages``: page id ->
    account indices in the order the page lists them."""

    seed: int
    entities: list[Entity]
    amounts: list[int]
    splits: list[str]
    pages: dict[str, list[int]]
    params: dict[str, Any] = field(default_factory=dict)
    _by_name: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name = {e.name: e.index for e in self.entities}

    @classmethod
    def generate(cls, seed: int = 0, num_accounts: int = 200, *, page_entries: int = 4,
                 amounts: tuple[int, int] = (1, 9), prompt_style: str = "numbered") -> "Ledger":
        """A ledger deterministic from ``seed``: ``num_accounts`` accounts (at least `MIN_ACCOUNTS`) with
        unique one-word names, each with an amount drawn uniformly from ``amounts`` (``[least, most]``,
        1 <= least < most), on pages of ``page_entries`` (>= 1) entries (the last page may hold fewer);
        ``prompt_style``: the episode prompt's layout (`mempo.env.data.PROMPT_STYLES`). ValueError naming
        what is wrong."""
        if num_accounts < MIN_ACCOUNTS:
            raise ValueError(f"a ledger needs at least {MIN_ACCOUNTS} accounts, got {num_accounts}")
        if page_entries < 1:
            raise ValueError(f"page_entries must be >= 1, got {page_entries}")
        least, most = int(amounts[0]), int(amounts[1])
        if not 1 <= least < most:
            raise ValueError(f"amounts must be [least, most] with 1 <= least < most, got {list(amounts)}")
        if prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
        rng = random.Random(f"mempo-ledger/{seed}/accounts")  # names, amounts, pages, splits, in this order
        namer = Names(rng)
        names = [namer.unique(namer.short_word) for _ in range(num_accounts)]
        values = [rng.randint(least, most) for _ in range(num_accounts)]
        order = list(range(num_accounts))
        rng.shuffle(order)
        width = max(4, len(str((num_accounts + page_entries - 1) // page_entries)))
        pages: dict[str, list[int]] = {}
        page_of = [""] * num_accounts
        for start in range(0, num_accounts, page_entries):
            page_id = f"L{start // page_entries + 1:0{width}d}"
            pages[page_id] = order[start:start + page_entries]
            for index in pages[page_id]:
                page_of[index] = page_id
        shuffled = list(range(num_accounts))
        rng.shuffle(shuffled)
        n_test, n_validation = round(TEST_SHARE * num_accounts), round(VALIDATION_SHARE * num_accounts)
        splits = [""] * num_accounts
        for position, index in enumerate(shuffled):
            splits[index] = "test" if position < n_test else "validation" if position < n_test + n_validation \
                else "train"
        entities = [Entity(i, "account", names[i], page_of[i]) for i in range(num_accounts)]
        params = {"num_accounts": num_accounts, "page_entries": page_entries, "amounts": [least, most],
                  "prompt_style": prompt_style}
        return cls(seed=seed, entities=entities, amounts=values, splits=splits, pages=pages, params=params)

    # -- lookups ------------------------------------------------------------------------------

    @property
    def num_documents(self) -> int:
        """The number of pages."""
        return len(self.pages)

    def accounts(self, split: str) -> list[int]:
        """The indices of the accounts of `split` (`SPLITS`), in index order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [i for i, s in enumerate(self.splits) if s == split]

    def amount(self, name: str) -> Optional[int]:
        """The amount of the account named `name` (None: no such account)."""
        index = self._by_name.get(name)
        return None if index is None else self.amounts[index]

    def page_text(self, page_id: str) -> str:
        """`page_line` of a page."""
        return page_line(page_id, [(self.entities[i].name, self.amounts[i]) for i in self.pages[page_id]])

    def lookup(self, key: str) -> list[str]:
        """What a key finds, one line each: an account's name (exact, case-sensitive) its entry and the page
        listing it (`entry_line`: ``Found Tamor3 on L0042: Kodan7, Tamor3, Rivel5, Belis1.``), a page id that
        page (`page_line`); anything else nothing."""
        key = key.strip()
        if key in self.pages:
            return [self.page_text(key)]
        index = self._by_name.get(key)
        if index is None:
            return []
        return [entry_line(key, self.amounts[index], self.page_text(self.entities[index].doc_id))]

    def documents(self) -> Iterator[Document]:
        """Every page as a `Document` (id, title ``"Ledger page <id>"``, text `page_line`), in id order."""
        for page_id in self.pages:
            yield Document(page_id, f"Ledger page {page_id}", self.page_text(page_id))

    # -- questions and episodes ---------------------------------------------------------------

    def questions(self, num: int, k: int, seed: int = 0, *, split: str,
                  exclude_accounts: Collection[str] = ()) -> list[QARecord]:
        """``num`` questions of ``k`` accounts of `split`, none in `exclude_accounts` (names), the k on
        different pages; kinds drawn uniformly from `kinds_for` (k), accounts without repeats within a
        question (a question may recur across the list). Drawn with ``random.Random(f"mempo-ledger/<ledger
        seed>/questions/<split>/<k>/<seed>")``; ids ``ledger<seed>-<split>-k<k>-q<seed>-<i>``. Each record's
        gold is the answer string (`answer_of`); its metadata: ``kind``, ``accounts``, ``amounts``, ``pages``,
        ``expression`` (`expression_of`), ``split`` and ``chain`` (per account ``{"relation": "balance",
        "subject", "value"}``: the subjects `mempo.synthetic.heldout.question_subjects` reads). ValueError
        when the split has too few accounts on different pages for k."""
        kinds = kinds_for(k)
        excluded = frozenset(exclude_accounts)
        pool = [i for i in self.accounts(split) if self.entities[i].name not in excluded]
        if len({self.entities[i].doc_id for i in pool}) < k:
            raise ValueError(f"the {split} split has {len(pool)} usable accounts on "
                             f"{len({self.entities[i].doc_id for i in pool})} pages, fewer than the {k} pages a "
                             f"question of {k} accounts needs; use more accounts (synthetic.ledger_accounts)")
        rng = random.Random(f"mempo-ledger/{self.seed}/questions/{split}/{k}/{seed}")
        records = []
        for number in range(int(num)):
            kind = rng.choice(kinds)
            chosen = self._draw(rng, pool, k, kind)
            if chosen is None:
                raise ValueError(f"could not draw a {kind!r} question of {k} accounts from the {split} split "
                                 f"({len(pool)} accounts) in {_DRAW_ATTEMPTS} attempts; use more accounts")
            names = [self.entities[i].name for i in chosen]
            values = [self.amounts[i] for i in chosen]
            metadata = {"kind": kind, "accounts": names, "amounts": values,
                        "pages": [self.entities[i].doc_id for i in chosen], "expression": expression_of(kind, values),
                        "split": split, "ledger_seed": self.seed,
                        "chain": [{"relation": "balance", "subject": n, "value": str(v)}
                                  for n, v in zip(names, values)]}
            records.append(QARecord(f"ledger{self.seed}-{split}-k{k}-q{seed}-{number}", question_text(kind, names),
                                    [answer_of(kind, names, values)], metadata))
        return records

    def _draw(self, rng: random.Random, pool: Sequence[int], k: int, kind: str) -> Optional[list[int]]:
        """k accounts of `pool` on different pages that suit `kind` (difference: a smallest amount last, and
        for k = 2 two different amounts, as for larger), or None after `_DRAW_ATTEMPTS`."""
        for _ in range(_DRAW_ATTEMPTS):
            chosen = rng.sample(pool, k)
            if len({self.entities[i].doc_id for i in chosen}) < k:
                continue
            values = [self.amounts[i] for i in chosen]
            if kind in ("difference", "larger") and k == 2 and values[0] == values[1]:
                continue  # two equal amounts: no larger one, a difference of 0
            if kind == "difference":
                smallest = min(range(k), key=lambda j: values[j])
                chosen = chosen[:smallest] + chosen[smallest + 1:] + [chosen[smallest]]
            return list(chosen)
        return None

    def episodes(self, num_objectives: Union[int, Sequence[int]], num_episodes: int, seed: int = 0, *,
                 split: str, exclude_accounts: Collection[str] = (), style: Optional[str] = None) -> list[Episode]:
        """``num_episodes`` one-question episodes of `split`: episode i asks a question of ``k = num_objectives``
        accounts (or ``num_objectives[i % len]`` for mixed k), drawn by `questions` per k (same seed). Ids
        ``ledger<seed>-<split>-k<k>-s<seed>-<i>``; ``metadata["records"]`` holds the question's metadata;
        style: the prompt layout (None: the ledger's ``prompt_style``)."""
        cycle = [int(num_objectives)] if isinstance(num_objectives, int) else [int(k) for k in num_objectives]
        if not cycle or any(k < 1 for k in cycle):
            raise ValueError(f"num_objectives must be >= 1 (an int or a non-empty list), got {num_objectives!r}")
        ks = [cycle[i % len(cycle)] for i in range(int(num_episodes))]
        drawn = {k: iter(self.questions(ks.count(k), k, seed, split=split, exclude_accounts=exclude_accounts))
                 for k in sorted(set(ks))}
        style = style if style is not None else self.params["prompt_style"]
        episodes = []
        for number, k in enumerate(ks):
            record = next(drawn[k])
            episodes.append(Episode(id=f"ledger{self.seed}-{split}-k{k}-s{seed}-{number}", questions=[record.question],
                                    golds=[list(record.golden_answers)],
                                    prompt=make_episode_prompt([record.question], style),
                                    source_ids=[record.id], metadata={"records": [dict(record.metadata)]}))
        return episodes
