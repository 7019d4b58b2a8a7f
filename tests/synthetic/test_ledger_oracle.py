"""The ledger's teacher (mempo.synthetic.ledger_oracle.LedgerOracle) through `run_oracle` with the ledger's
tools in the json format: its trajectories parse and pass the format check, it is right wherever its memory
keeps every amount, its imperfect memory fails exactly where it drops one, and it never reads a gold."""

import dataclasses
import re

import pytest

from mempo.protocol.grammar import SPACED_ANSWER_TEMPLATE, parse_tool_call, split_rounds, validate_format
from mempo.protocol.tags import JSON_TAG_SET
from mempo.synthetic.ledger import Ledger
from mempo.synthetic.ledger_oracle import LedgerOracle, ledger_memory_kinds, parse_ledger_memory
from mempo.synthetic.ledger_tools import ledger_tools
from mempo.synthetic.oracle import run_oracle
from mempo.synthetic.rename import rename_trajectories
from mempo.tools import Toolset


@pytest.fixture(scope="module")
def ledger():
    return Ledger.generate(seed=1, num_accounts=160, prompt_style="bare")


@pytest.fixture(scope="module")
def toolset(ledger):
    return Toolset(ledger_tools(ledger))


def play(episode, toolset, agent):
    return run_oracle(episode, toolset, agent=agent, system_prompt=toolset.system_prompt(""), tags=JSON_TAG_SET)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_a_perfect_memory_answers_every_question_in_k_plus_2_rounds(ledger, toolset, k):
    agent = LedgerOracle(answer_template=SPACED_ANSWER_TEMPLATE)
    for episode in ledger.episodes(k, 30, seed=2, split="train"):
        t = play(episode, toolset, agent)
        assert t.score["em"] == 1.0 and t.finished and t.final_answer == episode.golds[0][0]
        assert t.num_rounds == (2 if k == 1 else k + 2)
        assert validate_format(t.response_text, tags=JSON_TAG_SET).ok
        actions = [parse_tool_call(r.argument)[0] for r in t.rounds[:-1]]
        assert actions == ["lookup"] * k + ([] if k == 1 else ["calc"])
        assert all(r.tool_ok for r in t.rounds[:-1])
        # the rounds parse as the agent loop parses them, and the last one is the scoring template
        actions = [r.action for r in split_rounds(t.response_text, JSON_TAG_SET)]
        assert actions == ["tool_call"] * (t.num_rounds - 1) + ["answer"]
        assert t.rounds[-1].assistant.endswith(SPACED_ANSWER_TEMPLATE.replace("{answer}", t.final_answer))


def test_every_name_is_written_after_a_space(ledger, toolset):
    # one BPE id per name: the question, the page, the <mem>, the JSON call and the answer all spell " Name"
    episode = ledger.episodes(2, 1, seed=4, split="train")[0]
    t = play(episode, toolset, LedgerOracle())
    for name in episode.metadata["records"][0]["accounts"]:
        for r in t.rounds:
            for text in (r.assistant, r.tool_text or ""):
                assert f"\n{name}" not in text and f'"{name}' not in text and f">{name}" not in text
    assert '{"name": "lookup", "arguments": {"key": " ' in t.rounds[0].assistant


def test_the_imperfect_memory_fails_exactly_where_it_drops_an_amount(ledger, toolset):
    agent = LedgerOracle(drop_fact_prob=0.3, drop_seed=5, answer_template=SPACED_ANSWER_TEMPLATE)
    dropped = kept = 0
    for episode in ledger.episodes([1, 2, 3, 4], 80, seed=3, split="train"):
        t = play(episode, toolset, agent)
        lost = any(" done\n" in r.assistant for r in t.rounds)
        assert validate_format(t.response_text, tags=JSON_TAG_SET).ok
        if lost:
            dropped += 1
            assert t.final_answer == "unknown" and t.score["em"] == 0.0
            # a lost amount is never looked up again
            calls = [parse_tool_call(r.argument)[1].get("key") for r in t.rounds[:-1]]
            assert len(calls) == len(set(calls))
        else:
            kept += 1
            assert t.score["em"] == 1.0
    assert dropped > 10 and kept > 10
    again = [play(e, toolset, agent).response_text for e in ledger.episodes(3, 5, seed=3, split="train")]
    assert again == [play(e, toolset, agent).response_text for e in ledger.episodes(3, 5, seed=3, split="train")]


@pytest.mark.parametrize("lost_line, line", [("subject", "1. {name} done"), ("bare", "1. done"),
                                             ("value", "1. {name} unknown")])
def test_a_lost_line_reads_as_configured_and_is_read_back_as_lost(ledger, toolset, lost_line, line):
    agent = LedgerOracle(drop_fact_prob=1.0, lost_line=lost_line)
    episode = ledger.episodes(2, 1, seed=6, split="train")[0]
    t = play(episode, toolset, agent)
    name = episode.metadata["records"][0]["accounts"][0]
    assert line.format(name=name) in t.rounds[1].assistant and t.final_answer == "unknown"
    assert parse_ledger_memory(t.rounds[1].assistant, 2)[0][0] in ("done", "unknown")


def test_the_teacher_never_reads_a_gold(ledger, toolset):
    """The same trajectories whatever the golds say: the teacher reads the question and the tool results only."""
    agent = LedgerOracle(drop_fact_prob=0.3)
    for episode in ledger.episodes([2, 4], 10, seed=7, split="train"):
        wrong = dataclasses.replace(episode, golds=[["-1"]])
        assert play(wrong, toolset, agent).rounds == play(episode, toolset, agent).rounds
        for r in play(episode, toolset, agent).rounds:
            for message in r.messages:  # the gold appears only where a tool wrote it (the calc result)
                if message["role"] != "user" or message["content"].startswith("<tool_response>"):
                    continue
                assert f" {episode.golds[0][0]} " not in f" {message['content']} " or \
                    episode.metadata["records"][0]["kind"] == "larger"  # a larger question names its answer


def test_closed_book_and_questions_outside_the_grammar_answer_unknown(ledger):
    closed = Toolset(ledger_tools(None))
    episode = ledger.episodes(2, 1, seed=8, split="test")[0]
    t = play(episode, closed, LedgerOracle())
    assert t.final_answer == "unknown" and "1. " in t.rounds[-1].assistant and " unknown" in t.rounds[-1].assistant
    odd = dataclasses.replace(episode, prompt="Questions:\n1. What is the capital of Tamor?\n\n"
                                              "Give the answer in one <answer>.")
    t = play(odd, closed, LedgerOracle())
    assert t.num_rounds == 1 and t.final_answer == "unknown"


def test_renamed_trajectories_stay_right(ledger, toolset):
    held = {ledger.entities[i].name for s in ("test", "validation") for i in ledger.accounts(s)}
    trajectories = [play(e, toolset, LedgerOracle(answer_template=SPACED_ANSWER_TEMPLATE))
                    for e in ledger.episodes([2, 3], 6, seed=9, split="train")]

    def consistent(t):
        """Every looked-up name is on the page the lookup returned and in the last <mem>, with its amount."""
        from mempo.protocol.grammar import parse_tool_call

        last_mem = t.rounds[-1].assistant
        for r in t.rounds:
            name, arguments = parse_tool_call(r.argument) if r.action == "tool_call" else (None, {})
            if name == "lookup":
                key = arguments["key"].strip()
                found = re.search(rf"(?<!\w){key}(\d)", r.tool_text)
                if not found or f"{key}{found.group(1)}" not in last_mem:
                    return False
        return True

    renamed = rename_trajectories(trajectories, ledger.entities, held, seed=0, digit_suffix=True)
    for old, new in zip(trajectories, renamed):
        assert new.response_text != old.response_text and new.score == old.score and consistent(new)
        assert not any(re.search(rf"(?<!\w){name}(?![^\W\d])", new.response_text) for name in held)
        from mempo.protocol.reward import compute_score

        assert compute_score(new.response_text, new.golds, tags=JSON_TAG_SET)["em"] == 1.0
    # without digit_suffix the pages' "Tamor3" keep their old names while the questions' are renamed
    plain = rename_trajectories(trajectories, ledger.entities, held, seed=0)
    assert all(consistent(t) for t in trajectories) and not any(consistent(t) for t in plain)


def test_memory_kinds_per_account():
    mem = "1. Tamor3\n2. Belis done\n3. Kodan ?\n4. Rivel7\nResult 14"
    assert ledger_memory_kinds(mem, [3, 2, 6, 8]) == ["kept", "dropped", "pending", "other"]
    assert ledger_memory_kinds(None, [1, 2]) == ["pending", "pending"]
    assert ledger_memory_kinds("1. Tamor unknown", [5, 6]) == ["dropped", "pending"]
    assert parse_ledger_memory(mem, 4) == ([3, "done", None, 7], 14)
