"""tools/failure_anatomy.py: each objective lands in the first stage that failed, queries of both styles are
read, and the command writes one row per file."""
import dataclasses
import json

import pytest

from mempo.eval.records import EpisodeRecord, RoundRecord
from support.paths import load_script


def load_tool():
    """tools/failure_anatomy.py as a module (tools/ is not a package)."""
    return load_script("tools/failure_anatomy.py")


def _round(index, mem_lines, action, argument, result=None):
    text = "<mem>\n" + "\n".join(mem_lines) + "\n</mem>\n<think>\nQ1. Search.\n</think>\n"
    text += f"<{action}> {argument} </{action}>"
    return RoundRecord(index=index, assistant=text, action=action, action_argument=argument,
                       stop_reason="action", tool_result=result, tool_ok=result is not None, prompt_tokens=10)


def _episode(questions, golds, rounds, finish_reason, predictions):
    return EpisodeRecord(dataset="", objectives=len(questions), policy="memory", episode_id="e", questions=questions,
                         golds=golds, system="", user="", rounds=rounds, finish_reason=finish_reason,
                         final_answer="; ".join(p or "" for p in predictions) if finish_reason == "answer" else None,
                         predictions=predictions, em=0.0, f1=0.0, score=0.0, format_ok=True)


def _info(text):
    return f"<information>Doc 1 {text}</information>"


# one answered episode whose eight objectives fail at eight different stages (the first is right)
QUESTIONS = ["In which city was Bedur born?", "At which university did Nadu study?", "In which city was Tamor born?",
             "In which city was Kodan born?", "In which city was Zelo born?", "In which city was Mira born?",
             "At which university did Pelo study?", "At which university did Sami study?"]
GOLDS = [["Minu"], ["Lidar"], ["Belis"], ["Sapo"], ["Rupa"], ["Tova"], ["Kuna"], ["Dere"]]
SEARCHES = [("In which city was Bedur born?", "Bedur was born in the city of Minu."),
            ("At which university did Tamor study?", "Tamor studied at Vore. Tamor was born in the city of Belis."),
            ("In which city was Kodan born?", "Kodan studied at Hale."),
            ("Zelo born city", "Zelo was born in the city of Rupa."),
            ("In which city was Mira born?", "Mira was born in the city of Tova."),
            ("Pelo studied at", "Pelo studied at Kuna."),
            ("At which university did Sami study?", "Sami studied at Dere.")]
LAST_MEM = ["Step 8.", "Q1: Bedur was born in the city of Minu.", "Q2: Nadu studied at Lidar.",
            "Q3: Tamor studied at Vore.", "Q4: Kodan studied at Hale.", "Q5: Zelo done", "Q6: ?",
            "Q7: Pelo studied at Wrong.", "Q8: Sami studied at Dere."]
PREDICTIONS = ["Minu", "Lidar2", "Vore", "Hale", "unknown", "unknown", "Wrong", "Deres"]
STAGES_OF_EPISODE = ["right", "not_searched", "other_relation", "not_retrieved", "mem_dropped", "mem_pending",
                     "mem_other", "mem_gold"]


def _answered():
    rounds = [_round(i, ["Step 1."], "search", q, _info(r)) for i, (q, r) in enumerate(SEARCHES)]
    rounds.append(_round(len(SEARCHES), LAST_MEM, "answer", "; ".join(PREDICTIONS)))
    return _episode(QUESTIONS, GOLDS, rounds, "answer", PREDICTIONS)


def _unanswered():
    rounds = [_round(0, ["Step 1.", "Q1: ?"], "search", "In which city was Bedur born?",
                     _info("Bedur was born in the city of Minu."))]
    return dataclasses.replace(_episode(["In which city was Bedur born?"], [["Minu"]], rounds, "turn_limit", [None]),
                               episode_id="u")


def test_each_objective_lands_in_the_first_stage_that_failed():
    tool = load_tool()
    assert tool.objective_stages(_answered()) == STAGES_OF_EPISODE
    assert tool.objective_stages(_unanswered()) == ["no_answer"]
    assert set(STAGES_OF_EPISODE) | {"no_answer"} == set(tool.STAGES)


def test_queries_of_both_styles_are_read_and_other_text_is_not():
    tool = load_tool()
    assert tool.query_parse("Vaver born city").start == "Vaver"
    assert tool.query_parse("Vaver studied at").relations == ("alma_mater",)
    assert tool.query_parse("In which city was Vaver born?").relations == ("birthplace",)
    assert tool.query_parse("born city") is None and tool.query_parse("where is Vaver") is None
    # a query no style reads names its subject by the word: searched, its relation counted as asked
    free = _episode(["In which city was Vaver born?"], [["Mafor"]],
                    [_round(0, ["Step 1."], "search", "Vaver", _info("Vaver was born in the city of Mafor.")),
                     _round(1, ["Step 2.", "Q1: Vaver was born in the city of Mafor."], "answer", "Tape")],
                    "answer", ["Tape"])
    assert tool.objective_stages(free) == ["mem_gold"]


def test_shares_by_k_and_the_command_writes_one_row_per_file(tmp_path, capsys):
    tool = load_tool()
    shares = tool.anatomy([_answered(), _unanswered()])
    assert shares["objectives"] == 9 and shares["right"] == round(1 / 9, 4) and shares["no_answer"] == round(1 / 9, 4)
    assert sum(shares[s] for s in tool.STAGES) == pytest.approx(1.0, abs=1e-3)
    assert tool.anatomy([_answered(), _unanswered()], k=1)["no_answer"] == 1.0
    assert shares["no_answer_looped"] == 0.0  # one round: nothing repeated
    first = _unanswered().rounds[0]
    stuck = dataclasses.replace(_unanswered(), rounds=[first, dataclasses.replace(first, index=1, tool_result=None)])
    assert tool.looped(stuck) and not tool.looped(_unanswered()) and not tool.looped(_answered())
    assert not tool.looped(dataclasses.replace(stuck, finish_reason="answer"))
    moved = dataclasses.replace(stuck.rounds[1], assistant=first.assistant.replace("Q1: ?", "Q1: Minu"))
    assert not tool.looped(dataclasses.replace(stuck, rounds=[first, moved]))  # the memory changed
    assert tool.anatomy([_answered(), stuck])["no_answer_looped"] == round(1 / 9, 4)
    with pytest.raises(ValueError, match="no objectives to classify at k = 4"):
        tool.anatomy([_answered()], k=4)
    path = tmp_path / "eval_trajectories.jsonl"
    path.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in (_answered(), _unanswered())))
    assert tool.main([str(path), "--json", str(tmp_path / "rows.json")]) == 0
    printed = capsys.readouterr().out
    assert f"| {path} | 9 | 0.111 |" in printed and "| mem_gold | no_answer_looped |" in printed
    assert json.loads((tmp_path / "rows.json").read_text())[str(path)]["mem_gold"] == round(1 / 9, 4)
    with pytest.raises(SystemExit):
        tool.main([str(tmp_path / "missing.jsonl")])


def test_pairs_say_what_was_kept_lost_and_gained(tmp_path, capsys):
    tool = load_tool()
    before = _answered()
    # after: the first objective's answer lost, the eighth's (its gold was in memory) gained
    after = dataclasses.replace(before, predictions=["Minx", *PREDICTIONS[1:7], "Dere"])
    pairs = tool.transitions([before, _unanswered()], [after])
    assert pairs[("right", "mem_gold")] == 1 and pairs[("mem_gold", "right")] == 1 and sum(pairs.values()) == 8
    assert tool.transition_line(pairs) == ("right in both 0; lost 1 (mem_gold 1); gained 1 (mem_gold 1)")
    with pytest.raises(ValueError, match="share no episode"):
        tool.transitions([before], [dataclasses.replace(after, episode_id="other")])
    files = [tmp_path / "before.jsonl", tmp_path / "after.jsonl"]
    for path, record in zip(files, (before, after)):
        path.write_text(json.dumps(record.to_dict()) + "\n")
    assert tool.main(["--pairs", *map(str, files)]) == 0
    assert f"{files[0]} -> {files[1]}: right in both 0; lost 1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tool.main(["--pairs", str(files[0])])
