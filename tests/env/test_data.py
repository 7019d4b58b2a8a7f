"""QA loaders (jsonl, parquet when pyarrow is installed), episodes and MEM1-style composition."""
import json

import pytest

from mempo.env.data import (
    COMPACT_INSTRUCTIONS, EPISODE_INSTRUCTIONS, PROMPT_STYLES, DataError, Episode, MissingDependencyError,
    QARecord, compose_episodes, load_episodes_jsonl, load_qa, load_qa_jsonl, load_qa_parquet, make_episode_prompt,
    parse_episode_prompt, qa_record_from_json, user_turn, write_episodes_jsonl, write_qa_jsonl,
)
from mempo.protocol.reward import compute_score

try:
    import pyarrow  # noqa: F401
    HAS_PYARROW = True
except ImportError:
    HAS_PYARROW = False


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pool(n=12):
    return [QARecord(f"r{i}", f"Question number {i}?", [f"answer {i}", f"alias {i}"]) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# records and jsonl
# ---------------------------------------------------------------------------------------------


def test_jsonl_accepts_search_r1_fields_and_aliases(tmp_path):
    path = write_lines(tmp_path / "nq.jsonl", [
        json.dumps({"id": "train_0", "question": "who wrote x?", "golden_answers": ["A", "B"],
                    "data_source": "nq"}),
        "",
        json.dumps({"question": "capital?", "answers": ["Paris"]}),
        json.dumps({"id": 7, "question": "year?", "answer": 1843}),
        json.dumps({"question": "q4", "answer": "single"}),
        json.dumps({"question": "q5", "reward_model": {"style": "rule", "ground_truth": {"target": ["T1", "T2"]}},
                    "extra_info": {"split": "test"}}),
    ])
    records = load_qa_jsonl(path)
    assert [r.id for r in records] == ["train_0", "nq:3", "7", "nq:5", "nq:6"]
    assert [r.golden_answers for r in records] == [["A", "B"], ["Paris"], ["1843"], ["single"], ["T1", "T2"]]
    assert records[0].metadata == {"data_source": "nq"}
    assert records[4].metadata == {"extra_info": {"split": "test"}}
    assert load_qa(path) == records
    out = write_qa_jsonl(tmp_path / "out.jsonl", records)
    assert out == 5 and load_qa_jsonl(tmp_path / "out.jsonl") == records


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"golden_answers": ["x"]}), "missing field 'question'"),
    (json.dumps({"question": "   ", "golden_answers": ["x"]}), "'question' is blank"),
    (json.dumps({"question": 3, "golden_answers": ["x"]}), "'question' must be a string"),
    (json.dumps({"question": "q"}), "missing gold answers"),
    (json.dumps({"question": "q", "golden_answers": []}), "empty list"),
    (json.dumps({"question": "q", "golden_answers": ["ok", " "]}), "'golden_answers'[1] is blank"),
    (json.dumps({"question": "q", "golden_answers": [["nested"]]}), "must be a string"),
    (json.dumps({"question": "q", "answer": {"text": "x"}}), "must be a string or a list"),
    (json.dumps({"id": "first", "question": "q", "answer": "x"}), "duplicate id 'first'"),
    # issue 21, case 5: these passed the loader and failed later (a ValueError when drawn, an
    # unhashable data_source, a UnicodeEncodeError after the model loaded)
    (json.dumps({"question": "who\nwrote it?", "answer": "x"}), "field 'question' holds a line break ('\\n' at "
                                                                 "character 4)"),
    (json.dumps({"question": "who\u2028wrote it?", "answer": "x"}), "field 'question' holds a line break"),
    (json.dumps({"question": "q", "answer": "x", "data_source": ["nq"]}), "field 'data_source' must be a string, "
                                                                        "got list"),
    (json.dumps({"question": "q", "answer": "x", "data_source": {"a": 1}}), "'data_source' must be a string, got dict"),
    ('{"question": "caf\\ud800", "answer": "x"}', "field 'question' is not encodable text (surrogates not allowed "
                                                  "at character 4)"),
    ('{"question": "q", "answer": ["ok", "\\udfff"]}', "field 'answer[1]' is not encodable text"),
    # issue 21, case 6: a 50 MB question ran for minutes; the bound is MAX_QUESTION_CHARS
    (json.dumps({"question": "why " * 2000, "answer": "x"}), "field 'question' is 8000 characters long; the limit "
                                                             "is 4096"),
])
def test_bad_jsonl_lines_name_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"id": "first", "question": "q", "answer": "a"}), "", line])
    with pytest.raises(DataError) as info:
        load_qa_jsonl(path)
    assert f"{path}:3:" in str(info.value) and message in str(info.value)


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_qa_jsonl(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="unknown QA file type"):
        load_qa(tmp_path / "data.csv")
    with pytest.raises(DataError):
        qa_record_from_json({"question": "q", "answer": "a"})  # no id and no default


@pytest.mark.skipif(HAS_PYARROW, reason="pyarrow is installed: the missing-package error cannot happen")
def test_parquet_without_pyarrow_names_the_package(tmp_path):
    with pytest.raises(MissingDependencyError, match="pyarrow"):
        load_qa_parquet(tmp_path / "train.parquet")


@pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow is not installed (parquet support is optional)")
def test_parquet_round_trip_and_bad_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": ["a", "b"], "question": ["q1", "q2"], "golden_answers": [["x", "y"], ["z"]],
                      "data_source": ["nq", "hotpotqa"]})
    pq.write_table(table, tmp_path / "train.parquet")
    records = load_qa(tmp_path / "train.parquet")
    assert [(r.id, r.question, r.golden_answers, r.metadata) for r in records] == [
        ("a", "q1", ["x", "y"], {"data_source": "nq"}), ("b", "q2", ["z"], {"data_source": "hotpotqa"})]
    bad = pa.table({"question": ["q1", "q2"], "golden_answers": [["x"], []]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="row 1: .*empty list"):
        load_qa_parquet(tmp_path / "bad.parquet")


# ---------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------


def test_prompt_format_is_exact():
    prompt = make_episode_prompt(["Who wrote A?", "Where is B?"])
    assert prompt == (EPISODE_INSTRUCTIONS + "\n\nQuestions:\n1. Who wrote A?\n2. Where is B?\n\n"
                      'Give all 2 answers in one <answer> block, in the order of the questions, separated by ";", '
                      "e.g. <answer>answer 1; answer 2</answer>.")
    single = make_episode_prompt(["Who wrote A?"])
    assert single.endswith("Questions:\n1. Who wrote A?\n\nGive the answer in one <answer> block, "
                           "e.g. <answer>your answer</answer>.")
    joined = make_episode_prompt(["Who wrote A?", "Where is B?"], style="joined")
    assert "\n\nQuestions: Who wrote A?; Where is B?\n\n" in joined
    assert "answer 1; answer 2; answer 3; ...</answer>" in make_episode_prompt([f"q{i}?" for i in range(5)])
    compact = make_episode_prompt(["Who wrote A?", "Where is B?"], style="compact")
    assert compact == (COMPACT_INSTRUCTIONS + "\n\nQuestions:\n1. Who wrote A?\n2. Where is B?\n\n"
                       'Give all 2 answers in one <answer>, separated by ";".')
    bare = make_episode_prompt(["Who wrote A?", "Where is B?"], style="bare")
    assert bare == compact[len(COMPACT_INSTRUCTIONS) + 2:]  # the compact prompt without its instructions
    assert (make_episode_prompt(["Who wrote A?"], style="bare")
            == "Questions:\n1. Who wrote A?\n\nGive the answer in one <answer>.")


def test_prompt_parse_round_trip_and_errors():
    questions = [f"Question {i}?" for i in range(1, 11)]
    for style in PROMPT_STYLES:
        assert parse_episode_prompt(make_episode_prompt(questions, style)) == questions
    with pytest.raises(DataError):
        parse_episode_prompt("Just some text.")
    with pytest.raises(ValueError):
        make_episode_prompt([])
    with pytest.raises(ValueError):
        make_episode_prompt(["a; b", "c"], style="joined")
    with pytest.raises(ValueError):
        make_episode_prompt(["two\nlines"])


def test_a_typed_question_is_laid_out_as_training_laid_out_its_prompts():
    for style in PROMPT_STYLES:
        assert user_turn("At which university did Monom study?", style) == make_episode_prompt(
            ["At which university did Monom study?"], style)
        # several questions as numbered lines; stray white space and blank lines do not matter
        assert user_turn(" 1. Who wrote A?\n\n2.  Where   is B? \n", style) == make_episode_prompt(
            ["Who wrote A?", "Where is B?"], style)
        # a prompt that already holds a question list is the sender's layout: kept as it is
        prompt = make_episode_prompt(["Who wrote A?", "Where is B?"], "numbered")
        assert user_turn(prompt, style) == prompt
    # line breaks inside one question become spaces; numbering that skips is one question
    assert user_turn("Who wrote\nA?", "bare") == make_episode_prompt(["Who wrote A?"], "bare")
    assert user_turn("1. Who wrote A?\n3. Where is B?", "bare") == make_episode_prompt(
        ["1. Who wrote A? 3. Where is B?"], "bare")
    with pytest.raises(ValueError, match="empty"):
        user_turn(" \n ", "bare")
    with pytest.raises(ValueError, match="joined"):
        user_turn("1. a; b\n2. c", "joined")


# ---------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------


def test_compose_is_deterministic_and_draws_distinct_questions():
    a = compose_episodes(pool(), num_objectives=3, num_episodes=5, seed=1)
    b = compose_episodes(pool(), num_objectives=3, num_episodes=5, seed=1)
    c = compose_episodes(pool(), num_objectives=3, num_episodes=5, seed=2)
    assert [e.to_json() for e in a] == [e.to_json() for e in b]
    assert [e.questions for e in a] != [e.questions for e in c]
    for episode in a:
        assert episode.num_objectives == 3 and len(set(episode.source_ids)) == 3
        assert parse_episode_prompt(episode.prompt) == episode.questions
        assert episode.golds == [[f"answer {s[1:]}", f"alias {s[1:]}"] for s in episode.source_ids]
    assert a[0].id == "episode-k3-s1-0"


def test_compose_without_reuse_is_disjoint():
    episodes = compose_episodes(pool(), num_objectives=4, num_episodes=3, seed=0, reuse_questions=False)
    ids = [s for e in episodes for s in e.source_ids]
    assert sorted(ids) == sorted(r.id for r in pool())
    with pytest.raises(ValueError, match="needs 16"):
        compose_episodes(pool(), num_objectives=4, num_episodes=4, seed=0, reuse_questions=False)
    with pytest.raises(ValueError):
        compose_episodes(pool(2), num_objectives=3, num_episodes=1)
    with pytest.raises(ValueError):
        compose_episodes(pool(), num_objectives=0, num_episodes=1)


def test_compose_mixed_k_cycles_through_the_counts():
    one_k = compose_episodes(pool(), num_objectives=3, num_episodes=4, seed=1)
    assert [e.to_json() for e in compose_episodes(pool(), [3], 4, seed=1)] == [e.to_json() for e in one_k]
    mixed = compose_episodes(pool(), num_objectives=[1, 3], num_episodes=5, seed=1)
    assert [e.num_objectives for e in mixed] == [1, 3, 1, 3, 1]
    assert [e.id for e in mixed][:2] == ["episode-k1-s1-0", "episode-k3-s1-1"]
    assert all(len(set(e.source_ids)) == e.num_objectives for e in mixed)
    disjoint = compose_episodes(pool(), num_objectives=[2, 4], num_episodes=4, seed=0, reuse_questions=False)
    ids = [s for e in disjoint for s in e.source_ids]
    assert [e.num_objectives for e in disjoint] == [2, 4, 2, 4] and len(set(ids)) == len(ids) == 12
    with pytest.raises(ValueError, match="needs 14"):
        compose_episodes(pool(), num_objectives=[2, 4], num_episodes=5, seed=0, reuse_questions=False)
    with pytest.raises(ValueError, match="fewer than num_objectives=3"):
        compose_episodes(pool(2), num_objectives=[1, 3], num_episodes=2)
    # the largest k drawn counts: one episode of [1, 3] is one question
    assert [e.num_objectives for e in compose_episodes(pool(2), num_objectives=[1, 3], num_episodes=1)] == [1]
    for bad in ([], [2, 0]):
        with pytest.raises(ValueError, match="must be >= 1"):
            compose_episodes(pool(), num_objectives=bad, num_episodes=1)


def test_golds_go_straight_to_compute_score():
    (episode,) = compose_episodes(pool(), num_objectives=3, num_episodes=1, seed=4)
    answers = [golds[-1] for golds in episode.golds]  # an alias counts
    response = "<mem>m</mem><think>t</think><answer>" + "; ".join(answers) + "</answer>"
    assert compute_score(response, episode.golds)["score"] == 1.0
    half = "<mem>m</mem><think>t</think><answer>" + answers[0] + "; wrong</answer>"
    assert compute_score(half, episode.golds)["score"] == pytest.approx(1 / 3)
    (single,) = compose_episodes(pool(), num_objectives=1, num_episodes=1, seed=4)
    response = "<think>t</think><answer>" + single.golds[0][1] + "</answer>"
    assert compute_score(response, single.golds)["score"] == 1.0


def test_episode_jsonl_round_trip_and_errors(tmp_path):
    episodes = compose_episodes(pool(), num_objectives=2, num_episodes=3, seed=0)
    assert write_episodes_jsonl(tmp_path / "e.jsonl", episodes) == 3
    assert load_episodes_jsonl(tmp_path / "e.jsonl") == episodes
    write_lines(tmp_path / "bad.jsonl", [json.dumps(episodes[0].to_json()),
                                         json.dumps({"id": "x", "questions": ["a"], "golds": [], "prompt": "p"})])
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*1 questions but 0 gold lists"):
        load_episodes_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(DataError):
        Episode.from_json({"id": "x", "questions": "a", "golds": [["a"]], "prompt": "p"})


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------


def test_ids_are_unique_per_data_source_and_records_group_into_datasets(tmp_path):
    from mempo.env.data import load_qa_datasets

    merged = write_lines(tmp_path / "test.jsonl", [
        json.dumps({"id": "test_0", "question": "q1", "golden_answers": ["a"], "data_source": "nq"}),
        json.dumps({"id": "test_0", "question": "q2", "golden_answers": ["b"], "data_source": "hotpotqa"}),
        json.dumps({"id": "test_1", "question": "q3", "golden_answers": ["c"], "data_source": "nq"}),
    ])
    plain = write_lines(tmp_path / "bamboogle.jsonl", [json.dumps({"question": "q4", "answer": "d"})])
    datasets = load_qa_datasets([merged, plain])
    assert list(datasets) == ["nq", "hotpotqa", "bamboogle"]
    assert [r.question for r in datasets["nq"].records] == ["q1", "q3"]
    assert datasets["bamboogle"].files == [str(plain)] and datasets["nq"].files == [str(merged)]
    again = write_lines(tmp_path / "dup.jsonl", [
        json.dumps({"id": "test_0", "question": "q1", "golden_answers": ["a"], "data_source": "nq"}),
        json.dumps({"id": "test_0", "question": "q2", "golden_answers": ["b"], "data_source": "nq"}),
    ])
    with pytest.raises(DataError, match=r"dup\.jsonl:2: duplicate id 'test_0' in data_source 'nq' "
                                        r"\(first seen on line 1\)"):
        load_qa_datasets([again])
    empty = write_lines(tmp_path / "empty.jsonl", [""])
    with pytest.raises(DataError, match=r"empty\.jsonl: no QA records"):
        load_qa_datasets([empty])
    with pytest.raises(DataError, match=r"absent\.parquet: QA file not found"):
        load_qa_datasets([tmp_path / "absent.parquet"])
    with pytest.raises(DataError, match="no QA files given"):
        load_qa_datasets([])


def test_a_directory_or_a_file_given_twice_is_refused(tmp_path):
    """Issue 21: ``data.train_files`` naming a directory was a traceback (case 5); the same QA file
    given twice doubled the question pool silently (case 7: refused, by any path)."""
    from mempo.env.data import check_qa_files, load_qa_datasets

    path = write_lines(tmp_path / "qa.jsonl", [json.dumps({"question": "q1", "answer": "a"})])
    other = write_lines(tmp_path / "other.jsonl", [json.dumps({"question": "q2", "answer": "b"})])
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    for load in (load_qa, lambda p: load_qa_datasets([p]), lambda p: check_qa_files([p])):
        with pytest.raises(DataError, match=r"folder\.jsonl: is a directory, not a QA file"):
            load(folder)
    again = tmp_path / "sub" / ".." / "qa.jsonl"
    (tmp_path / "sub").mkdir()
    for paths in ([path, path], [path, other, again]):
        with pytest.raises(DataError, match=r"qa\.jsonl: the same QA file is given twice \(also as .*qa\.jsonl\)"):
            load_qa_datasets(paths)
    assert check_qa_files([str(path), other]) == [path, other]
    assert len(load_qa_datasets([path, other])) == 2
