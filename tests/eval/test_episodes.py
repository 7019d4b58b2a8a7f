"""mempo.eval.episodes: QA files in Search-R1's parquet layout."""
import pytest

pytest.importorskip("transformers")

from mempo.env.build import build_retriever
from mempo.env.corpus import write_corpus
from mempo.env.data import load_qa_datasets
from mempo.eval import evaluate, qa_eval_episodes
from support.qa_eval import answerable, corpus_documents, make_cfg, reader_backend, unanswerable
from support.rollout_fixtures import chat_tokenizer


def test_parquet_input_in_search_r1_layout(tmp_path):
    """Search-R1's merged test.parquet: FlashRAG ids repeat across data sources; the golds also sit
    in reward_model.ground_truth.target; the prompt column holds Search-R1's own instruction."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    write_corpus(tmp_path / "corpus.jsonl", corpus_documents())
    rows = []
    for source, make, numbers in (("nq", answerable, range(3)), ("bamboogle", unanswerable, range(2))):
        for index, i in enumerate(numbers):
            record = make(i)
            rows.append({"id": f"test_{index}", "question": record["question"],
                         "golden_answers": record["golden_answers"], "data_source": source,
                         "prompt": [{"role": "user", "content": "Answer the given question. " + record["question"]}],
                         "ability": "fact-reasoning",
                         "reward_model": {"style": "rule", "ground_truth": {"target": record["golden_answers"]}},
                         "extra_info": {"split": "test", "index": index}})
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    datasets = load_qa_datasets([path])
    assert {name: [r.id for r in d.records] for name, d in datasets.items()} == {
        "nq": ["test_0", "test_1", "test_2"], "bamboogle": ["test_0", "test_1"]}
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, [path], objectives=[1, 2], episodes=3, policies=["memory"])
    sets = qa_eval_episodes(cfg)
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None)
    assert [(r.dataset, r.objectives, r.em) for r in report.rows] == [
        ("nq", 1, 1.0), ("nq", 2, 1.0), ("bamboogle", 1, 0.0), ("bamboogle", 2, 0.0)]


# ------------------------------------------------------------------------------------------------
# the synthetic world's held-out splits: test and validation (eval.split)
# ------------------------------------------------------------------------------------------------
#: a small world of the demo's kind, 2 and 4 objectives evaluated, 8 test and 8 validation episodes per k
SPLIT = ["eval.objectives=[2,4]", "eval.episodes=8", "eval.validation_episodes=8",
         "synthetic.oracle_objectives=[1,2,4]", "synthetic.oracle_episodes=24", "data.num_objectives=[2,4]",
         "data.questions_per_step=4"]


def _names_asked(episodes, names):
    """The names of `names` that occur as a word in the questions of `episodes` (read from the text)."""
    import re
    return {w for e in episodes for q in e.questions for w in re.findall(r"[A-Za-z]+", q)} & names


def test_the_validation_split_is_disjoint_by_entity_from_the_test_split_and_deterministic():
    from mempo.config import load_config
    from mempo.eval import held_out_of_training, validation_episodes
    from mempo.eval import eval_episodes
    from mempo.seeds import eval_question_seed
    from mempo.synthetic.build import synthetic_world
    from mempo.synthetic.heldout import held_out_subjects
    from support.small_world import SMALL

    cfg = load_config(None, [*SMALL, *SPLIT])
    world = synthetic_world(cfg)
    test, validation = eval_episodes(world, cfg, split="test"), eval_episodes(world, cfg, split="validation")
    assert eval_episodes(world, cfg) == test  # eval.split: test, the default
    assert validation == validation_episodes(world, cfg) == eval_episodes(world, load_config(
        None, [*SMALL, *SPLIT, "eval.split=validation"]))
    persons = {e.name for e in world.entities if e.kind == "person"}
    for k in (2, 4):
        assert len(validation[k]) == 8 and all(e.num_objectives == k for e in validation[k])
        questions = [q for e in validation[k] for q in e.questions]
        assert len(set(questions)) == len(questions)  # no question twice within a k
        assert not {e.id for e in validation[k]} & {e.id for e in test[k]}
    # disjoint by entity: no subject in common, read from the metadata and from the questions' text
    test_subjects, validation_subjects = held_out_subjects(test), held_out_subjects(validation)
    assert test_subjects and validation_subjects and not test_subjects & validation_subjects
    assert not _names_asked([e for eps in validation.values() for e in eps], persons) & test_subjects
    # deterministic: a fresh world and config draw the same episodes; a prefix is the first episodes
    again = eval_episodes(synthetic_world(load_config(None, [*SMALL, *SPLIT])), cfg, split="validation")
    assert [e.to_json() for eps in again.values() for e in eps] == [e.to_json() for eps in validation.values()
                                                                    for e in eps]
    assert validation_episodes(world, cfg, 3, [4]) == {4: validation[4][:3]}
    # training leaves out both splits' subjects; without a validation split, the test draw and the held-out
    # set are what they were (the test split's own)
    assert held_out_of_training(world, cfg) == test_subjects | validation_subjects
    plain = load_config(None, [*SMALL, *SPLIT, "eval.validation_episodes=0"])
    assert held_out_of_training(world, plain) == held_out_subjects(eval_episodes(world, plain)) == test_subjects
    assert [e.to_json() for e in test[4]] == [e.to_json() for e in world.episodes(4, 8, seed=eval_question_seed(0, 4))]


def test_the_validation_split_refuses_what_it_does_not_hold():
    from mempo.config import ConfigError, load_config
    from mempo.eval import eval_episodes, held_out_of_training, validation_episodes
    from mempo.synthetic.build import synthetic_world
    from support.small_world import SMALL

    cfg = load_config(None, [*SMALL, *SPLIT])
    world = synthetic_world(cfg)
    with pytest.raises(ConfigError, match=r"^eval.validation_episodes: 8 validation episodes per k are held out; 9"):
        validation_episodes(world, cfg, 9)
    with pytest.raises(ConfigError, match=r"^eval.objectives: the validation split holds out k in \[2, 4\]; k=\[3\]"):
        validation_episodes(world, cfg, objectives=[3])
    with pytest.raises(ConfigError, match=r"^eval.validation_episodes: is 0"):
        validation_episodes(world, load_config(None, [*SMALL, *SPLIT, "eval.validation_episodes=0"]))
    too_many = load_config(None, [*SMALL, *SPLIT, "eval.validation_episodes=400"])  # 200 entities cannot hold them
    with pytest.raises(ConfigError, match=r"^eval.validation_episodes: 400 episodes of 2 objectives asking about no "):
        held_out_of_training(world, too_many)
    with pytest.raises(ValueError, match="split must be one of"):
        eval_episodes(world, cfg, split="train")


def test_no_sft_or_rl_question_asks_about_a_validation_entity():
    """The cold start, the demo's RL episodes and the trainer's pool leave out the validation split's
    subjects as they leave out the test split's; without the split they would ask about some of them."""
    from mempo.apps.demo import rl_episodes
    from mempo.config import ConfigError, load_config
    from mempo.env.build import build_tools
    from mempo.eval import eval_episodes, held_out_of_training
    from mempo.synthetic.build import build_world
    from mempo.synthetic.cold_start import oracle_cold_start
    from mempo.synthetic.heldout import held_out_subjects
    from mempo.train.trainer import _episode_pool
    from support.small_world import SMALL

    cfg = load_config(None, [*SMALL, *SPLIT])
    env = build_world(cfg)
    validation_subjects = held_out_subjects(eval_episodes(env.world, cfg, split="validation"))
    held = held_out_of_training(env.world, cfg)
    cold = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg, held)
    sft_lines = {w for t in cold.trajectories for w in t.prompt.split()}  # renamed, as the demo trains on them
    rl = rl_episodes(cfg, env.world, held, 8)
    pool = _episode_pool(cfg, env.world)
    for episodes in (rl, pool):
        assert episodes and not held_out_subjects(episodes) & held
    assert not {w.strip("?.,") for w in sft_lines} & validation_subjects
    # the same draws holding out the test split alone do ask about validation entities: the check can fail
    plain = load_config(None, [*SMALL, *SPLIT, "eval.validation_episodes=0"])
    assert held_out_subjects(rl_episodes(plain, env.world, held_out_of_training(env.world, plain), 8)) \
        & validation_subjects
    assert held_out_subjects(_episode_pool(plain, env.world)) & validation_subjects
    # a validation split the world cannot hold stops training (a world too small for the test split holds
    # nothing out, as before)
    with pytest.raises(ConfigError, match="eval.validation_episodes"):
        _episode_pool(load_config(None, [*SMALL, *SPLIT, "eval.validation_episodes=400"]), env.world)
    assert _episode_pool(load_config(None, [*SMALL, *SPLIT, "eval.episodes=400"]), env.world)
