"""The oracle agent on a tiny world: success under both context policies, protocol format, honest
memory (decisions from its last <mem> + last tool result only), access to chronicle pages, the HTTP
retriever, the turn limit and jsonl records.

Servers started here: one `RetrieverServer` thread on a free 127.0.0.1 port, stopped in the test.
"""
import dataclasses
import re

import pytest

from mempo.env.bm25 import BM25Retriever
from mempo.env.client import HTTPRetriever
from mempo.env.data import Episode, make_episode_prompt
from mempo.synthetic.oracle import (
    OracleAgent, load_trajectories_jsonl, run_oracle, run_oracle_episodes, write_trajectories_jsonl,
)
from mempo.synthetic.oracle_memory import UNKNOWN, memory_line_kinds, parse_oracle_memory
from mempo.env.server import RetrieverServer
from mempo.env.tools import make_tools
from mempo.synthetic.grammar import RELATIONS, QuestionParse, parse_question
from mempo.synthetic.world import World
from mempo.protocol.memory import ShortTextPolicy
from mempo.protocol.grammar import parse_round, validate_format

POLICIES = ("memory", "full")


@pytest.fixture(scope="module")
def world():
    return World.generate(seed=0, num_entities=25, chronicle_fraction=0.5)


@pytest.fixture(scope="module")
def retriever(world):
    with BM25Retriever.build(list(world.documents())) as built:
        yield built


@pytest.fixture(scope="module")
def tools(retriever):
    return make_tools(retriever)


def check_trajectory(trajectory):
    """Score 1, valid format overall and round by round, an answer as the last round."""
    assert trajectory.finished
    assert trajectory.score["score"] == 1.0, (trajectory.final_answer, trajectory.golds)
    assert validate_format(trajectory.response_text).ok
    for round_ in trajectory.rounds:
        assert round_.assistant.startswith("<mem>\n")
        last = round_ is trajectory.rounds[-1]
        report = validate_format(round_.assistant, require_answer=last)
        assert report.ok, report.messages
        assert (round_.action == "answer") == last


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("k", (1, 2, 4))
def test_oracle_solves_tiny_world_episodes(world, tools, policy, k):
    for trajectory in run_oracle_episodes(world.episodes(k, 3, seed=10 + k), tools, policy=policy):
        check_trajectory(trajectory)
        assert trajectory.policy == policy
        searches = sum(r.action == "search" for r in trajectory.rounds)
        assert searches >= 1 and all(r.tool_kind == "search_results" for r in trajectory.rounds[:-1])


def test_memory_policy_prompts_hold_only_the_last_round(world, tools):
    (episode,) = world.episodes(4, 1, seed=3)
    trajectory = run_oracle(episode, tools, policy="memory")
    rounds = trajectory.rounds
    assert len(rounds) >= 3
    assert [m["role"] for m in rounds[0].messages] == ["system", "user"]
    for r in range(1, len(rounds)):
        messages = rounds[r].messages
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert messages[1]["content"] == episode.prompt
        assert messages[2]["content"] == rounds[r - 1].assistant
        assert messages[3]["content"] == rounds[r - 1].tool_text  # search results are never shortened
        joined = "\n".join(m["content"] for m in messages)
        for older in rounds[:r - 1]:
            assert older.assistant not in joined
            assert parse_round(older.assistant).mem not in joined


def test_full_policy_prompts_hold_every_round(world, tools):
    (episode,) = world.episodes(4, 1, seed=3)
    trajectory = run_oracle(episode, tools, policy="full")
    for r, round_ in enumerate(trajectory.rounds):
        assert len(round_.messages) == 2 + 2 * r
        assert [m["content"] for m in round_.messages[2::2]] == [x.assistant for x in trajectory.rounds[:r]]


def test_decisions_come_from_the_last_mem_and_tool_result_only(world, tools):
    (episode,) = world.episodes(4, 1, seed=5)
    memory_run = run_oracle(episode, tools, policy="memory")
    full_run = run_oracle(episode, tools, policy="full")
    assert [r.assistant for r in memory_run.rounds] == [r.assistant for r in full_run.rounds]
    agent = OracleAgent()
    last = full_run.rounds[-1].messages
    # Older rounds are not consulted: blanking them changes nothing.
    blanked = last[:2] + [{"role": m["role"], "content": "<mem>x</mem>" if m["role"] == "assistant" else "y"}
                          for m in last[2:-2]] + last[-2:]
    assert agent.respond(blanked) == full_run.rounds[-1].assistant
    # The memory is: drop what it says and the oracle must find those facts again.
    previous = last[-2]["content"]
    mem = parse_round(previous).mem
    forgetful = previous.replace(mem, mem.splitlines()[0])  # keep only "Step n."
    reply = agent.respond(last[:-2] + [{"role": "assistant", "content": forgetful}, last[-1]])
    assert parse_round(reply).action == "search"


def test_memory_round_trips(world, tools):
    (episode,) = world.episodes(4, 1, seed=6)
    trajectory = run_oracle(episode, tools, policy="memory")
    for round_ in trajectory.rounds:
        mem = parse_round(round_.assistant).mem
        step, objectives = parse_oracle_memory(mem, episode.questions)
        assert step == round_.index + 1
        rebuilt = "\n".join([f"Step {step}."] + [o.memory_text(o is next((x for x in objectives if not x.done), None))
                                                for o in objectives])
        assert rebuilt == mem
    final_mem = parse_round(trajectory.rounds[-1].assistant).mem
    _, objectives = parse_oracle_memory(final_mem, episode.questions)
    assert [o.answer for o in objectives] == [g[0] for g in episode.golds]


@pytest.mark.parametrize("k", (1, 2))
def test_chronicle_facts_are_read_with_access(world, tools, k):
    episodes = world.episodes(k, 2, seed=20 + k, access_fraction=1.0)
    whole_pages = ShortTextPolicy(webpage_chars=None)
    for episode in episodes:
        for policy, short_text in (("full", None), ("memory", whole_pages)):
            trajectory = run_oracle(episode, tools, policy=policy, short_text_policy=short_text)
            check_trajectory(trajectory)
            accesses = [r for r in trajectory.rounds if r.action == "access"]
            assert accesses and all(r.tool_kind == "webpage" and r.tool_ok for r in accesses)
            assert all(r.tool_metadata["page"] >= 1 for r in accesses)


def test_memory_policy_with_100_character_pages_cannot_read_chronicles(world, tools):
    """AgentMemory's default short text cuts the last web page to 100 characters, so the fact on a
    chronicle page never reaches a memory-policy agent: the oracle gives up honestly."""
    (episode,) = world.episodes(1, 1, seed=21, access_fraction=1.0)
    trajectory = run_oracle(episode, tools, policy="memory")
    assert trajectory.finished and trajectory.final_answer == UNKNOWN
    assert trajectory.score["format_ok"] and trajectory.score["score"] == 0.0
    assert any(r.action == "access" for r in trajectory.rounds)


def test_oracle_through_the_http_server(world, retriever):
    with RetrieverServer(retriever) as server:
        client = HTTPRetriever(server.url, timeout=10, retries=0)
        client.wait_until_ready(timeout=10)
        http_tools = make_tools(client)
        (episode,) = world.episodes(2, 1, seed=30, access_fraction=0.5)
        trajectory = run_oracle(episode, http_tools, policy="full")
        check_trajectory(trajectory)
        in_process = run_oracle(episode, make_tools(retriever), policy="full")
        assert trajectory.response_text == in_process.response_text
    assert server._thread is None  # stopped and joined


def test_turn_limit_forces_an_answer(world, tools):
    (episode,) = world.episodes(4, 1, seed=7)
    trajectory = run_oracle(episode, tools, policy="memory", max_turns=2)
    assert trajectory.finished and len(trajectory.rounds) == 2
    assert trajectory.score["format_ok"]
    assert trajectory.final_answer.count(";") == 3 and UNKNOWN in trajectory.final_answer
    unanswered = run_oracle(episode, tools, policy="memory", max_turns=2, agent=OracleAgent(max_turns=64))
    assert not unanswered.finished and unanswered.score["score"] == 0.0


def test_questions_outside_the_grammar_are_answered_unknown(world, tools):
    questions = ["What is the meaning of life?", world.questions(1, hops=1, seed=2)[0].question]
    episode = Episode("odd", questions, [["42"], ["x"]], make_episode_prompt(questions))
    trajectory = run_oracle(episode, tools, policy="memory")
    assert trajectory.finished and trajectory.score["format_ok"]
    assert trajectory.final_answer.split("; ")[0] == UNKNOWN


def test_trajectories_round_trip_through_jsonl(tmp_path, world, tools):
    trajectories = run_oracle_episodes(world.episodes(2, 2, seed=8), tools, policy="memory")
    assert write_trajectories_jsonl(tmp_path / "t.jsonl", trajectories) == 2
    loaded = load_trajectories_jsonl(tmp_path / "t.jsonl")
    for original, restored in zip(trajectories, loaded):
        assert restored.response_text == original.response_text
        assert dataclasses.asdict(restored)["rounds"] == dataclasses.asdict(original)["rounds"]
        assert restored.score["score"] == original.score["score"] == 1.0


@pytest.mark.parametrize("k", (1, 2))
def test_short_think_style(world, tools, k):
    from mempo.synthetic.oracle import OracleAgent

    episodes = world.episodes(k, 3, seed=40 + k)
    full = run_oracle_episodes(episodes, tools, policy="memory")
    for episode, reference in zip(episodes, full):
        trajectory = run_oracle(episode, tools, policy="memory", agent=OracleAgent(think="short"))
        check_trajectory(trajectory)
        assert [(r.action, r.argument) for r in trajectory.rounds] == [(r.action, r.argument) for r in reference.rounds]
        for short, long in zip(trajectory.rounds, reference.rounds):
            assert parse_round(short.assistant).mem == parse_round(long.assistant).mem
            think = parse_round(short.assistant).think.strip()
            assert "\n" not in think and len(think) <= len(parse_round(long.assistant).think.strip())
    with pytest.raises(ValueError):
        OracleAgent(think="long")


# ---------------------------------------------------------------------------------------------
# The deliberately imperfect teacher (drop_fact_prob) and the scoring answer template
# ---------------------------------------------------------------------------------------------

SMALL = dict(relations=("birthplace", "birth_year", "country", "capital", "mayor"), names="short",
             article_style="facts", article_fillers=(0, 0), chronicles=False, chronicle_fraction=0.0,
             distractor_ratio=0.0, prompt_style="compact")


@pytest.fixture(scope="module")
def small_world():
    return World.generate(seed=1, num_entities=300, question_hops=1, **SMALL)


@pytest.fixture(scope="module")
def small_tools(small_world):
    with BM25Retriever.build(list(small_world.documents())) as built:
        yield make_tools(built, options={"search": {"topk": 1}})


def lost_lines(trajectory):
    return [[line for line in (parse_round(r.assistant).mem or "").splitlines() if line.endswith(": done")]
            for r in trajectory.rounds]


@pytest.mark.parametrize("policy", POLICIES)
def test_drop_one_loses_every_fact_a_later_round_needs(small_world, small_tools, policy):
    agent = OracleAgent(think="short", drop_fact_prob=1.0)
    for episode in small_world.episodes(3, 4, seed=7):
        trajectory = run_oracle(episode, small_tools, policy=policy, agent=agent)
        assert validate_format(trajectory.response_text).ok and trajectory.finished
        # Q1 and Q2 are found in rounds 2 and 3 and needed in the answer round: both lost; Q3 is
        # found in the answer round itself, so nothing later needs it and it is answered.
        assert [r.action for r in trajectory.rounds] == ["search"] * 3 + ["answer"]
        assert lost_lines(trajectory) == [[], ["Q1: done"], ["Q1: done", "Q2: done"], ["Q1: done", "Q2: done"]]
        answers = trajectory.final_answer.split("; ")
        assert answers[:2] == [UNKNOWN, UNKNOWN] and answers[2] in episode.golds[2]
        # the lost facts were in what the agent read: the failure comes from the memory alone
        for number, found_in in ((0, 0), (1, 1)):
            assert any(gold in trajectory.rounds[found_in].tool_text for gold in episode.golds[number])
        assert trajectory.score["em"] == pytest.approx(1 / 3)


def test_drop_after_an_intermediate_hop_stops_the_question(small_world, small_tools):
    w = World.generate(seed=1, num_entities=300, question_hops=2, **SMALL)
    with BM25Retriever.build(list(w.documents())) as retriever:
        tools = make_tools(retriever, options={"search": {"topk": 1}})
        for episode in w.episodes(1, 3, seed=3):
            trajectory = run_oracle(episode, tools, agent=OracleAgent(think="short", drop_fact_prob=1.0))
            # hop 1 found in round 2, needed by hop 2: lost, so no second search, answer unknown
            assert [r.action for r in trajectory.rounds] == ["search", "answer"]
            assert trajectory.final_answer == UNKNOWN and lost_lines(trajectory)[1] == ["Q1: done"]


def test_drops_are_seeded_per_episode_and_follow_the_probability(small_world, small_tools):
    episodes = small_world.episodes(2, 150, seed=11)

    def lost(agent, some=episodes):
        return [bool(lost_lines(run_oracle(e, small_tools, agent=agent))[-1]) for e in some]

    base = lost(OracleAgent(think="short", drop_fact_prob=0.4))
    assert base == lost(OracleAgent(think="short", drop_fact_prob=0.4))  # reproducible
    assert base[50:] == lost(OracleAgent(think="short", drop_fact_prob=0.4), episodes[50:])  # order-free
    assert 0.25 < sum(base) / len(base) < 0.55  # 150 draws of p = 0.4
    other_seed = lost(OracleAgent(think="short", drop_fact_prob=0.4, drop_seed=1))
    assert other_seed != base and 0.25 < sum(other_seed) / len(other_seed) < 0.55
    never = [run_oracle(e, small_tools, agent=OracleAgent(think="short")) for e in episodes[:20]]
    zero = [run_oracle(e, small_tools, agent=OracleAgent(think="short", drop_fact_prob=0.0)) for e in episodes[:20]]
    assert [t.response_text for t in never] == [t.response_text for t in zero]
    assert all(t.score["em"] == 1.0 for t in never)
    # the EM of a dropping teacher is what the drops predict: at k=2 only Q1 can be lost
    scores = [run_oracle(e, small_tools, agent=OracleAgent(think="short", drop_fact_prob=0.4)).score["em"]
              for e in episodes]
    assert scores == [0.5 if dropped else 1.0 for dropped in base]
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="drop_fact_prob"):
            OracleAgent(drop_fact_prob=bad)


def test_lost_memory_line_parses_back():
    questions = ["In which city was Tamor born?", "Who is the mayor of Belis?"]
    step, objectives = parse_oracle_memory("Step 4.\nQ1: done\nQ2: mayor of Belis = Kodan", questions)
    assert step == 4 and objectives[0].lost and objectives[0].done and objectives[0].answer == UNKNOWN
    assert not objectives[1].lost and objectives[1].answer == "Kodan"
    assert objectives[0].memory_text(focused=False) == "Q1: done"


def test_answer_template_makes_the_final_round_the_scoring_continuation(small_world, small_tools):
    template = "\n<think>\nI have the answer.\n</think>\n<answer>\n{answer}\n</answer>"  # mempo.scoring's default
    agent = OracleAgent(think="short", answer_template=template)
    for episode in small_world.episodes(2, 3, seed=5):
        reference = run_oracle(episode, small_tools, agent=OracleAgent(think="short"))
        trajectory = run_oracle(episode, small_tools, agent=agent)
        assert trajectory.score["score"] == 1.0
        assert [r.assistant for r in trajectory.rounds[:-1]] == [r.assistant for r in reference.rounds[:-1]]
        last = trajectory.rounds[-1].assistant
        mem = last[:last.index("</mem>") + len("</mem>")]
        assert last == mem + template.replace("{answer}", trajectory.final_answer)
    for bad in ("<answer>{answer}</answer>{answer}", "\n<think>\nx\n</think>\n<search>{answer}</search>", "no slot"):
        with pytest.raises(ValueError, match="answer_template"):
            OracleAgent(answer_template=bad)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("hops", (1, 2, 3))
@pytest.mark.parametrize("memory_style", ("facts", "listed"))
def test_facts_memory_and_question_queries_solve_the_same_episodes(policy, hops, memory_style):
    w = World.generate(seed=2, num_entities=300, question_hops=hops, **SMALL)
    with BM25Retriever.build(list(w.documents())) as retriever:
        tools = make_tools(retriever, options={"search": {"topk": 1}})
        agent = OracleAgent(think="minimal", memory_style=memory_style, query_style="question")
        for episode in w.episodes(3, 3, seed=4):
            trajectory = run_oracle(episode, tools, policy=policy, agent=agent)
            check_trajectory(trajectory)
            for round_, number in zip(trajectory.rounds, range(1, 100)):
                mem = parse_round(round_.assistant).mem.strip().splitlines()
                assert mem[0] == f"Step {number}."
                labels = [line.split(": ", 1)[0] for line in mem[1:]]
                if memory_style == "listed":  # a line for every question from the first round on
                    assert labels == [f"Q{i}" for i in range(1, 4)]
                else:  # only questions under way have a line
                    assert labels == [f"Q{i}" for i in range(1, len(labels) + 1)] and len(labels) <= 3
                for line in mem[1:]:  # found hops are corpus sentences
                    body = line.split(": ", 1)[1]
                    facts = re.sub(r"\s*\?( \(tried \d+\))?$", "", body)
                    sentences = [s + "." for s in facts.rstrip(".").split(". ") if s]
                    for sentence in sentences:
                        assert any(sentence in (r.tool_text or "") for r in trajectory.rounds[:number - 1])
                if round_.action == "search" and round_.argument in episode.questions:
                    assert parse_round(round_.assistant).think.strip() == \
                        f"Q{episode.questions.index(round_.argument) + 1}. Search."
            first_searches = [r.argument for r in trajectory.rounds if r.argument in episode.questions]
            assert first_searches == episode.questions  # each question's first search is its own text
            # later hops ask their own one-hop question of their subject (a fact two questions
            # share is found once)
            later_hops = {QuestionParse(c["subject"], (c["relation"],))
                          for record in episode.metadata["records"] for c in record["chain"][1:]}
            asked = [parse_question(r.argument) for r in trajectory.rounds
                     if r.action == "search" and r.argument not in episode.questions]
            assert set(asked) <= later_hops and len(asked) >= len(later_hops) - 1


def test_facts_memory_lines_parse_back():
    questions = ["In which country is the birthplace of Tamor?", "Who is the mayor of Belis?",
                 "In which year was Kodan born?", "Who is the mayor of the birthplace of Rupi?"]
    mem = ("Step 5.\nQ1: Tamor was born in the city of Zuli. Zuli is a city in Varo.\n"
           "Q2: ? (tried 2)\nQ3: unknown\nQ4: Rupi was born in the city of Mako. ?")
    step, objectives = parse_oracle_memory(mem, questions)
    assert step == 5
    assert [h.value for h in objectives[0].hops] == ["Zuli", "Varo"] and objectives[0].answer == "Varo"
    assert objectives[1].hops[0].tried == 2 and not objectives[1].done
    assert objectives[2].failed and objectives[2].answer == UNKNOWN
    assert objectives[3].hops[0].value == "Mako" and objectives[3].next_hop().subject == "Mako"
    for objective in objectives:
        line = objective.memory_text(focused=True, style="facts")
        assert parse_oracle_memory("Step 5.\n" + line, questions)[1][objective.number - 1] == objective
    with pytest.raises(ValueError, match="memory_style"):
        OracleAgent(memory_style="prose")
    with pytest.raises(ValueError, match="query_style"):
        OracleAgent(query_style="keywords")


@pytest.mark.parametrize("memory_style", ("facts", "listed"))
def test_drops_in_the_facts_memory(small_world, small_tools, memory_style):
    agent = OracleAgent(think="minimal", memory_style=memory_style, query_style="question", drop_fact_prob=1.0)
    for episode in small_world.episodes(2, 3, seed=8):
        trajectory = run_oracle(episode, small_tools, agent=agent)
        assert lost_lines(trajectory) == [[], ["Q1: done"], ["Q1: done"]]
        assert trajectory.final_answer.split("; ")[0] == UNKNOWN and trajectory.score["em"] == 0.5


@pytest.mark.parametrize("memory_style", ("facts", "listed"))
@pytest.mark.parametrize("lost_line", ("subject", "value"))
def test_a_lost_line_can_name_its_subject_or_its_fact(small_world, small_tools, memory_style, lost_line):
    bare = OracleAgent(think="minimal", memory_style=memory_style, query_style="question", drop_fact_prob=1.0)
    named = OracleAgent(think="minimal", memory_style=memory_style, query_style="question", drop_fact_prob=1.0,
                        lost_line=lost_line)
    for episode in small_world.episodes(2, 3, seed=8):
        parsed = parse_question(episode.questions[0])
        line = (f"Q1: {parsed.start} done" if lost_line == "subject" else
                "Q1: " + RELATIONS[parsed.relations[0]].fact.format(s=parsed.start, o=UNKNOWN))
        plain, with_subject = (run_oracle(episode, small_tools, agent=bare),
                               run_oracle(episode, small_tools, agent=named))
        # the same episode, round for round: only the lost line's text differs, and it reads back as lost
        assert ([r.assistant.replace(line, "Q1: done") for r in with_subject.rounds]
                == [r.assistant for r in plain.rounds])
        assert lost_lines(with_subject) == [[], [], []]
        mems = [parse_round(r.assistant).mem for r in with_subject.rounds]
        assert [line in m for m in mems] == [False, True, True]
        assert with_subject.final_answer == plain.final_answer and with_subject.score == plain.score
        assert memory_line_kinds(mems[1], episode.golds) == ["dropped", "pending"]
        assert parse_oracle_memory(mems[1], episode.questions)[1][0].lost
    with pytest.raises(ValueError, match="lost_line"):
        OracleAgent(lost_line="named")


def test_memory_line_kinds_say_what_each_objective_line_holds():
    mem = ("Step 4.\nQ1: Tefot studied at Gadok.\nQ2: done\nQ3: ?\nQ4: ? (tried 2)\n"
           "Q5: Danen was born in the city of Sekek.\nQ6: unknown\nQ8: ? see chronicle-0001 page 2\n"
           "Q9: The New York Times.\nQ10: Gadokian studied at Fibu.\nQ1: Sobe")
    golds = [["Gadok"], ["Viza"], ["x"], ["y"], ["Fibu"], ["z"], ["w"], ["v"], ["new york times", "NYT"], ["Gadok"]]
    assert memory_line_kinds(mem, golds) == [
        "gold",     # the gold in the line (the first Q1 line counts)
        "dropped",  # closed without its fact
        "pending", "pending",
        "other",    # another entity's fact
        "pending",  # "unknown": given up
        "pending",  # Q7: no line
        "pending",  # a pointer, not yet read
        "gold",     # normalised: case, punctuation and articles do not matter
        "other",    # whole words only: "Gadokian" is not "Gadok"
    ]
    assert memory_line_kinds(None, [["a"], ["b"]]) == ["pending", "pending"]
    assert memory_line_kinds("Q1: Sobe", [[""]]) == ["other"]  # an empty alias never matches
    # the teacher's own memory, read back: every line of a solved episode keeps its gold
    world = World.generate(seed=3, num_entities=60, relations=("birthplace", "alma_mater"), names="short",
                           article_style="facts", article_fillers=(0, 0), chronicles=False, chronicle_fraction=0.0,
                           question_hops=1)
    tools = make_tools(BM25Retriever.build(world.documents()))
    episode = world.episodes(3, 1, seed=5)[0]
    run = run_oracle(episode, tools, policy="memory", agent=OracleAgent(memory_style="listed"))
    assert run.score["em"] == 1.0
    assert memory_line_kinds(parse_round(run.rounds[-1].assistant).mem, episode.golds) == ["gold"] * 3
