"""mempo.synthetic.scoring_records: SFT records of the teacher-scoring layout (question, a later
round's <mem> as context, the answer that memory alone gives), drawn from the cold start."""
import pytest

from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE
from mempo.config import ConfigError, load_config
from mempo.env.build import build_tools
from mempo.env.data import parse_episode_prompt
from mempo.synthetic.build import build_world
from mempo.synthetic.cold_start import oracle_cold_start
from mempo.synthetic.oracle_memory import LOST, UNKNOWN
from mempo.synthetic.scoring_records import scoring_layout_records
from mempo.model.builtin import default_corpus_texts, train_tokenizer
from mempo.train.sft import examples_from_trajectories
from support.small_world import SMALL

OVERRIDES = SMALL + ["synthetic.oracle_objectives=[1,2]", "synthetic.oracle_episodes=8", "synthetic.oracle_keep=all",
                     "synthetic.oracle_query_style=question", "synthetic.oracle_memory_style=listed",
                     "synthetic.oracle_drop_fact_prob=0.5", "synthetic.oracle_answer_template=true"]


@pytest.fixture(scope="module")
def cold():
    cfg = load_config(None, OVERRIDES)
    env = build_world(cfg)
    return oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg)


def _candidates(trajectories):
    return sum(len(t.rounds) - 1 for t in trajectories)


def _the_cold_start_passes_on(option, value, **kwargs):
    """synthetic.<option>=<value> reaches the cold start's records (`scoring_layout_records(**kwargs)`), and
    without records to shape it is a ConfigError naming the option."""
    cfg = load_config(None, OVERRIDES + ["synthetic.scoring_sft_examples=4", f"synthetic.{option}={value}"])
    env = build_world(cfg)
    made = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg)
    assert made.scoring_records == scoring_layout_records(made.trajectories, 4, seed=cfg.synthetic.model_seed,
                                                          **kwargs)
    with pytest.raises(ConfigError, match=option):
        load_config(None, OVERRIDES + [f"synthetic.{option}={value}"])


def test_each_record_answers_from_its_memory_alone(cold):
    records = scoring_layout_records(cold.trajectories, 10_000, seed=1)
    assert len(records) == _candidates(cold.trajectories) > 0  # more asked than there are: every round r >= 2
    lost = known = 0
    for record in records:
        system, user, assistant = record["messages"]
        assert (system["role"], user["role"], assistant["role"]) == ("system", "user", "assistant")
        mem = assistant["context"]
        assert mem.startswith("<mem>\nStep ") and mem.endswith("</mem>") and not mem.startswith("<mem>\nStep 1.")
        answers = assistant["content"][len("\n<think>\nI have the answer.\n</think>\n<answer>\n"):-len("\n</answer>")]
        assert assistant["content"] == DEFAULT_ANSWER_TEMPLATE.replace("{answer}", answers)
        questions = parse_episode_prompt(user["content"])
        lines = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in mem.splitlines() if line.startswith("Q")}
        values = answers.split("; ")
        assert len(values) == len(questions)
        for number, value in enumerate(values, 1):
            line = lines[f"Q{number}"]
            if value == UNKNOWN:  # open, lost or given up in this memory
                assert line in ("?", LOST, UNKNOWN) or line.startswith("? ")
                lost += line == LOST
            else:  # a value the memory holds, never one it lacks
                assert line.endswith(f" {value}.")
                known += 1
    assert lost > 0 and known > 0


def test_records_are_a_seeded_draw(cold):
    first = scoring_layout_records(cold.trajectories, 5, seed=3)
    assert len(first) == 5 and first == scoring_layout_records(cold.trajectories, 5, seed=3)
    assert first != scoring_layout_records(cold.trajectories, 5, seed=4)
    assert scoring_layout_records(cold.trajectories, 0) == []
    with pytest.raises(ValueError, match="count"):
        scoring_layout_records(cold.trajectories, -1)
    with pytest.raises(ValueError, match="answer"):
        scoring_layout_records(cold.trajectories, 1, template="<answer></answer>")


def test_the_cold_start_adds_them_when_configured(cold):
    assert cold.scoring_records == [] and "scoring-layout" not in cold.describe_extras()
    cfg = load_config(None, OVERRIDES + ["synthetic.scoring_sft_examples=6", "synthetic.copy_sft_examples=2"])
    env = build_world(cfg)
    made = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg)
    assert made.scoring_records == scoring_layout_records(made.trajectories, 6, seed=cfg.synthetic.model_seed)
    assert made.sft_records == [*made.trajectories, *made.copy_records, *made.scoring_records]
    assert made.describe_extras() == " + 2 copy-task records + 6 scoring-layout records"
    with pytest.raises(ConfigError, match="scoring_sft_examples"):
        load_config(None, SMALL + ["synthetic.scoring_sft_examples=3"])
    with pytest.raises(ConfigError, match="scoring_sft_examples"):
        load_config(None, OVERRIDES + ["synthetic.scoring_sft_examples=-1"])


def test_the_later_round_layout_puts_two_empty_turns_before_the_memory(cold):
    at_question = scoring_layout_records(cold.trajectories, 7, seed=2)
    later = scoring_layout_records(cold.trajectories, 7, seed=2, layout="later_round")
    empty = [{"role": "assistant", "content": ""}, {"role": "user", "content": ""}]
    assert [r["messages"][:2] + empty + r["messages"][2:] for r in at_question] == [r["messages"] for r in later]
    # SFT trains only the answer: the empty assistant turn is no example, the prompt renders both turns
    tokenizer = train_tokenizer(default_corpus_texts(build_world(load_config(None, OVERRIDES)).world), vocab_size=768)
    plain, moved = (examples_from_trajectories(records, tokenizer) for records in (at_question, later))
    assert len(plain) == len(moved) == 7
    for a, b in zip(plain, moved):
        assert len(b.input_ids) > len(a.input_ids) and sum(a.loss_mask) == sum(b.loss_mask)
        assert [i for i, m in zip(a.input_ids, a.loss_mask) if m] == [i for i, m in zip(b.input_ids, b.loss_mask) if m]
    with pytest.raises(ValueError, match="layout"):
        scoring_layout_records(cold.trajectories, 1, layout="blank")
    _the_cold_start_passes_on("scoring_records_layout", "later_round", layout="later_round")
    with pytest.raises(ConfigError, match="oracle_lost_line"):  # nothing is lost
        load_config(None, OVERRIDES + ["synthetic.oracle_drop_fact_prob=0", "synthetic.oracle_lost_line=subject"])


def test_complete_memories_only_give_records_without_unknown(cold):
    every = scoring_layout_records(cold.trajectories, 10_000, seed=1)
    complete = scoring_layout_records(cold.trajectories, 10_000, seed=1, memories="complete")
    def answers(record):
        content = record["messages"][-1]["content"]
        return content[content.index("<answer>\n") + len("<answer>\n"):content.index("\n</answer>")].split("; ")
    with_unknown = [r for r in every if UNKNOWN in answers(r)]
    assert with_unknown and complete and not any(UNKNOWN in answers(r) for r in complete)
    key = lambda r: (r["messages"][1]["content"], r["messages"][-1]["context"])  # noqa: E731
    assert sorted(map(key, complete)) == sorted(key(r) for r in every if UNKNOWN not in answers(r))
    # "any" is the draw it always was; "complete" a seeded draw of its own candidates
    assert scoring_layout_records(cold.trajectories, 3, seed=5, memories="any") == scoring_layout_records(
        cold.trajectories, 3, seed=5)
    assert scoring_layout_records(cold.trajectories, 3, seed=5, memories="complete") == scoring_layout_records(
        cold.trajectories, 3, seed=5, memories="complete")
    with pytest.raises(ValueError, match="memories"):
        scoring_layout_records(cold.trajectories, 1, memories="full")
    _the_cold_start_passes_on("scoring_records_memories", "complete", memories="complete")
