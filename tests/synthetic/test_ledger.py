"""The ledger (mempo.synthetic.ledger): determinism, pages, golds recomputed from the pages, the question
grammar and the splits by account."""

import re

import pytest

from mempo.env.data import parse_episode_prompt
from mempo.protocol.reward import compute_score, em_check, normalize_answer
from mempo.synthetic.ledger import (
    MIN_ACCOUNTS, QUESTION_KINDS, SPLITS, Ledger, answer_of, expression_of, kinds_for, parse_ledger_question,
    question_text,
)


@pytest.fixture(scope="module")
def ledger():
    return Ledger.generate(seed=3, num_accounts=200, page_entries=4, prompt_style="bare")


def amounts_on_pages(ledger):
    """{account name: amount} read back from the page texts alone."""
    read = {}
    for doc in ledger.documents():
        body = doc.text.split(": ", 1)[1].rstrip(".")
        for entry in body.split(", "):
            # "Tamor3": the amount right after the name
            name, amount = re.fullmatch(r"([A-Z][a-z]+)(\d+)", entry).groups()
            assert name not in read, f"{name} listed twice"
            read[name] = int(amount)
    return read


def test_same_seed_same_ledger_and_questions_other_seed_another():
    a, b = Ledger.generate(7, 120), Ledger.generate(7, 120)
    assert [d.text for d in a.documents()] == [d.text for d in b.documents()] and a.splits == b.splits
    assert [e.to_json() for e in a.episodes([2, 4], 10, 5, split="test")] == \
        [e.to_json() for e in b.episodes([2, 4], 10, 5, split="test")]
    assert [d.text for d in Ledger.generate(8, 120).documents()] != [d.text for d in a.documents()]
    # another question seed draws other questions from the same ledger
    assert [e.questions for e in a.episodes(2, 10, 5, split="test")] != \
        [e.questions for e in a.episodes(2, 10, 6, split="test")]


def test_pages_hold_every_account_once_with_its_amount(ledger):
    read = amounts_on_pages(ledger)
    assert read == {e.name: ledger.amounts[e.index] for e in ledger.entities}
    assert all(1 <= a <= 9 for a in ledger.amounts) and len(set(ledger.amounts)) == 9
    assert ledger.num_documents == 50 and all(len(ids) == 4 for ids in ledger.pages.values())
    for e in ledger.entities:  # an account's doc_id is the page listing it
        assert e.name in ledger.page_text(e.doc_id) and e.kind == "account"
    assert len({normalize_answer(e.name) for e in ledger.entities}) == 200  # unique even after answer normalisation


def test_lookup_finds_an_account_or_a_page_and_nothing_else(ledger):
    account = ledger.entities[17]
    page = ledger.page_text(account.doc_id)
    assert ledger.lookup(account.name) == [f"Found {account.name}{ledger.amounts[17]} on {page}"]
    assert f" {account.name}{ledger.amounts[17]}" in f" {page}"  # the entry is on that page too
    assert ledger.lookup(f"  {account.doc_id} ") == [ledger.page_text(account.doc_id)]
    assert ledger.lookup(account.name.lower()) == [] and ledger.lookup("Nobody") == [] and ledger.lookup("") == []


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_golds_are_right_by_recomputation_from_the_pages(ledger, k):
    read = amounts_on_pages(ledger)
    episodes = ledger.episodes(k, 60, seed=1, split="train")
    kinds = set()
    for episode in episodes:
        (question,) = parse_episode_prompt(episode.prompt)
        kind, accounts = parse_ledger_question(question)
        kinds.add(kind)
        values = [read[a] for a in accounts]
        if kind == "balance":
            expected = str(values[0])
        elif kind == "total":
            expected = str(sum(values))
        elif kind == "difference":
            expected = str(sum(values[:-1]) - values[-1])
            assert int(expected) > 0  # the smallest is subtracted
        else:
            expected = accounts[0] if values[0] > values[1] else accounts[1]
            assert values[0] != values[1]
        assert episode.golds == [[expected]] and len(accounts) == k == len(set(accounts))
        record = episode.metadata["records"][0]
        assert record["accounts"] == accounts and record["amounts"] == values and record["kind"] == kind
        assert len(set(record["pages"])) == k  # k accounts on k pages: k lookups
        assert record["expression"] == expression_of(kind, values)
        assert [step["subject"] for step in record["chain"]] == accounts
    assert kinds == set(kinds_for(k))  # every kind of this k is drawn


def test_the_question_grammar_round_trips():
    for kind in QUESTION_KINDS:
        for k in {"balance": [1], "larger": [2]}.get(kind, [2, 3, 4]):
            names = ["Tamor", "Belis", "Kodan", "Rivel"][:k]
            assert parse_ledger_question(question_text(kind, names)) == (kind, names)
    assert parse_ledger_question("What is the capital of Tamor?") is None
    assert answer_of("larger", ["A", "B"], [3, 9]) == "B" and expression_of("larger", [3, 9]) == "3 - 9"
    assert expression_of("balance", [5]) is None and expression_of("difference", [5, 6, 2]) == "5 + 6 - 2"
    with pytest.raises(ValueError, match="unknown question kind"):
        question_text("product", ["A", "B"])
    with pytest.raises(ValueError, match="at least 1 account"):
        kinds_for(0)


def test_golds_are_strings_scored_by_em_with_squad_normalisation():
    # docs: "47", " 47 " and "47." match 47; "47.0" does not; an account name matches in any case
    assert all(em_check(p, ["47"]) for p in ("47", " 47 ", "47."))
    assert not em_check("47.0", ["47"]) and not em_check("forty-seven", ["47"])
    assert em_check("tamor", ["Tamor"])
    response = "<mem>\n1. Tamor 35\n</mem>\n<think>\nI have the answer.\n</think>\n<answer> 35 </answer>"
    from mempo.protocol.tags import JSON_TAG_SET

    assert compute_score(response, [["35"]], tags=JSON_TAG_SET)["em"] == 1.0


def test_splits_are_disjoint_by_account_and_episodes_keep_to_theirs(ledger):
    sets = {split: {ledger.entities[i].name for i in ledger.accounts(split)} for split in SPLITS}
    assert sum(map(len, sets.values())) == 200 and (len(sets["test"]), len(sets["validation"])) == (40, 20)
    assert not (sets["test"] & sets["validation"]) and not (sets["train"] & (sets["test"] | sets["validation"]))
    for split in SPLITS:
        used = {a for e in ledger.episodes([1, 2, 3, 4], 40, 9, split=split)
                for a in e.metadata["records"][0]["accounts"]}
        assert used <= sets[split], split
    # exclusions hold too
    excluded = frozenset(list(sets["train"])[:100])
    used = {a for e in ledger.episodes(2, 40, 9, split="train", exclude_accounts=excluded)
            for a in e.metadata["records"][0]["accounts"]}
    assert used and not (used & excluded)


def test_sizes_and_splits_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match=f"at least {MIN_ACCOUNTS} accounts"):
        Ledger.generate(0, MIN_ACCOUNTS - 1)
    with pytest.raises(ValueError, match="page_entries must be >= 1"):
        Ledger.generate(0, 50, page_entries=0)
    with pytest.raises(ValueError, match="1 <= least < most"):
        Ledger.generate(0, 50, amounts=(5, 5))
    with pytest.raises(ValueError, match="prompt_style"):
        Ledger.generate(0, 50, prompt_style="chatty")
    one_page = Ledger.generate(0, 40, page_entries=40)  # every account on one page: no two-page question
    with pytest.raises(ValueError, match=re.escape("fewer than the 2 pages")):
        one_page.questions(1, 2, split="test")
    with pytest.raises(ValueError, match="split must be one of"):
        one_page.accounts("dev")
    with pytest.raises(ValueError, match="num_objectives must be >= 1"):
        one_page.episodes([], 3, split="test")
