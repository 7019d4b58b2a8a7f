"""AgentMemory and the two context policies (`mempo.protocol.memory`), with the seed's 4-round example."""
import pytest

from mempo.protocol.memory import (
    DEFAULT_SYSTEM_PROMPT,
    AgentMemory,
    Record,
    ShortTextPolicy,
)
from mempo.protocol.grammar import find_blocks, validate_format

SILENT_CUT = ShortTextPolicy(cut_notice=None)  # the reference's plain 100-character cut


def system_and_question(question):
    return [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
            {"role": "user", "content": question}]


def tool_text(label):
    """A tool result longer than 100 characters, wrapped as the environment returns it."""
    return "<information>" + label + "(完整) " + "长文本" * 60 + "</information>"


def first_100(text):
    content = text[len("<information>"):-len("</information>")]
    return "<information>" + content[:100] + "</information>"


# ---------------------------------------------------------------------------------------------
# The 4-round example of the seed notes (section 4.2): preparing round 5
# ---------------------------------------------------------------------------------------------

LLM_GENS = [
    "<mem>记忆1</mem><think>...</think><search>...</search>",
    "<mem>记忆2</mem><think>...</think><search>...</search>",
    "<mem>记忆3</mem><think>...</think><search>...</search>",
    "<mem>记忆4</mem><think>...</think><search>...</search>",
]
TOOL_TEXTS = [tool_text(f"搜索结果{k}") for k in range(1, 5)]


def four_rounds(add_tool, policy=SILENT_CUT):
    memory = AgentMemory("原始问题", short_text_policy=policy)
    for llm_gen, result in zip(LLM_GENS, TOOL_TEXTS):
        memory.add_llm_gen(llm_gen)
        add_tool(memory, result)
    return memory


def test_seed_example_records():
    memory = four_rounds(AgentMemory.add_webpage)
    records = memory.records
    assert len(records) == 9 and memory.num_rounds == 4
    assert [r.type for r in records] == ["prompt"] + ["llm_gen", "webpage"] * 4
    assert records[0] == Record("prompt", "原始问题", "原始问题")
    assert [r.text for r in records[1::2]] == LLM_GENS
    assert [r.text for r in records[2::2]] == TOOL_TEXTS


def test_seed_example_round_5_with_webpages_cut_to_100_characters():
    memory = four_rounds(AgentMemory.add_webpage)
    search_4_short = first_100(TOOL_TEXTS[3])
    assert len(search_4_short) == len("<information>") + 100 + len("</information>")
    assert memory.messages("memory") == system_and_question("原始问题") + [
        {"role": "assistant",
         "content": "<mem>记忆4</mem><think>...</think><search>...</search>"},
        {"role": "user", "content": search_4_short},
    ]
    assert memory.records[6].short_text == first_100(TOOL_TEXTS[2])


def test_seed_example_round_5_with_search_results_kept_whole():
    memory = four_rounds(AgentMemory.add_search_results)
    assert memory.messages("memory") == system_and_question("原始问题") + [
        {"role": "assistant", "content": LLM_GENS[3]},
        {"role": "user", "content": TOOL_TEXTS[3]},
    ]


def test_seed_example_full_policy_keeps_everything_in_order():
    memory = four_rounds(AgentMemory.add_webpage)
    expected = system_and_question("原始问题")
    for llm_gen, result in zip(LLM_GENS, TOOL_TEXTS):
        expected += [{"role": "assistant", "content": llm_gen},
                     {"role": "user", "content": result}]
    assert memory.messages("full") == expected


# ---------------------------------------------------------------------------------------------
# Memory policy edge cases (the reference's backward scan)
# ---------------------------------------------------------------------------------------------


def test_fresh_memory_shows_only_the_question():
    memory = AgentMemory("Who directed it?", system_prompt="Be brief.")
    expected = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Who directed it?"}]
    assert memory.messages("memory") == expected
    assert memory.messages("full") == expected
    assert memory.num_rounds == 0 and memory.question == "Who directed it?"


def test_after_one_round():
    memory = AgentMemory("q")
    memory.add_llm_gen("<mem></mem><think>t</think><search>s</search>")
    memory.add_search_results("<information>r1</information>")
    assert memory.messages() == system_and_question("q") + [
        {"role": "assistant", "content": "<mem></mem><think>t</think><search>s</search>"},
        {"role": "user", "content": "<information>r1</information>"},
    ]


def test_llm_gen_with_no_tool_result_yet():
    memory = AgentMemory("q")
    memory.add_llm_gen("<mem></mem><think>t</think><answer>a</answer>")
    assert memory.messages() == system_and_question("q") + [
        {"role": "assistant", "content": "<mem></mem><think>t</think><answer>a</answer>"}]


def test_last_record_an_llm_gen_keeps_everything_since_the_last_but_one_tool_result():
    memory = AgentMemory("q", short_text_policy=SILENT_CUT)
    memory.add_llm_gen("<mem>1</mem>A")
    memory.add_webpage(tool_text("r1"))
    memory.add_llm_gen("<mem>2</mem>B")
    memory.add_webpage(tool_text("r2"))
    memory.add_llm_gen("<mem>3</mem>C")
    assert memory.messages() == system_and_question("q") + [
        {"role": "assistant", "content": "<mem>2</mem>B"},
        {"role": "user", "content": first_100(tool_text("r2"))},
        {"role": "assistant", "content": "<mem>3</mem>C"},
    ]
    # only one tool result so far: the scan reaches the question and keeps every record
    short = AgentMemory("q")
    short.add_llm_gen("<mem>1</mem>A")
    short.add_search_results("<information>r1</information>")
    short.add_llm_gen("<mem>2</mem>B")
    assert [m["content"] for m in short.messages()[2:]] == [
        "<mem>1</mem>A", "<information>r1</information>", "<mem>2</mem>B"]


def test_two_tool_results_in_a_row_keep_only_the_newest():
    memory = AgentMemory("q")
    memory.add_llm_gen("<mem>1</mem>A")
    memory.add_webpage("<information>page 1</information>")
    memory.add_webpage("<information>page 2</information>")
    assert memory.messages() == system_and_question("q") + [
        {"role": "user", "content": "<information>page 2</information>"}]


def test_policy_name_is_checked():
    with pytest.raises(ValueError):
        AgentMemory("q").messages("window")


# ---------------------------------------------------------------------------------------------
# No nested <mem>
# ---------------------------------------------------------------------------------------------


def test_continuation_after_a_forced_mem_prefix_gets_the_prefix_once():
    memory = AgentMemory("q")
    record = memory.add_llm_gen("summary</mem><think>t</think><answer>a</answer>")
    assert record.text == "<mem>summary</mem><think>t</think><answer>a</answer>"
    assert memory.messages()[-1]["content"] == record.text
    assert validate_format(record.text).ok


def test_text_that_already_starts_with_mem_is_stored_as_is():
    memory = AgentMemory("q")
    whole = "<mem>summary</mem><think>t</think><answer>a</answer>"
    assert memory.add_llm_gen(whole).text == whole
    assert memory.add_llm_gen("\n" + whole).text == "\n" + whole
    for message in memory.messages("full") + memory.messages("memory"):
        assert "<mem><mem>" not in message["content"]
        assert message["content"].count("<mem>") <= 1


def test_other_forced_prefixes():
    memory = AgentMemory("q")
    assert memory.add_llm_gen("x</think>", forced_prefix="<think>").text == "<think>x</think>"
    assert memory.add_llm_gen("as is", forced_prefix=None).text == "as is"
    assert memory.add_llm_gen("as is", forced_prefix="").text == "as is"


# ---------------------------------------------------------------------------------------------
# short_text configuration
# ---------------------------------------------------------------------------------------------


def test_default_policy_cuts_webpages_visibly_and_keeps_search_results():
    memory = AgentMemory("q")
    page = tool_text("网页")
    content = page[len("<information>"):-len("</information>")]
    web = memory.add_webpage(page)
    assert web.short_text == ("<information>" + content[:100]
                              + f"\n[... shortened: the first 100 of {len(content)} characters "
                              "are shown]\n</information>")
    (block,) = find_blocks(web.short_text)  # still one closed <information> block
    assert (block.tag, block.closed, block.end) == ("information", True, len(web.short_text))
    assert memory.add_search_results(page).short_text == page


def test_short_text_limits_are_configurable():
    policy = ShortTextPolicy(search_results_chars=5, webpage_chars=None,
                             cut_notice=" [{shown}/{total}]")
    memory = AgentMemory("q", short_text_policy=policy)
    assert memory.add_search_results("<information>0123456789</information>").short_text == (
        "<information>01234 [5/10]</information>")
    page = tool_text("p")
    assert memory.add_webpage(page).short_text == page


def test_short_text_of_unwrapped_and_short_texts():
    policy = ShortTextPolicy(webpage_chars=4, cut_notice=None)
    assert policy.short_text("webpage", "abcdefgh") == "abcd"
    assert policy.short_text("webpage", "abcd") == "abcd"
    assert policy.short_text("webpage", "<information>abc</information>") == (
        "<information>abc</information>")
    assert policy.short_text("llm_gen", "abcdefgh") == "abcdefgh"
    with pytest.raises(ValueError):
        ShortTextPolicy(webpage_chars=-1)


def test_explicit_short_text_overrides_the_policy():
    memory = AgentMemory("q")
    record = memory.add_webpage("<information>long page</information>", short_text="<information>"
                                "summary</information>")
    assert record.short_text == "<information>summary</information>"
    assert memory.messages()[-1]["content"] == "<information>summary</information>"
    assert memory.messages("full")[-1]["content"] == "<information>long page</information>"


def test_record_type_is_checked():
    with pytest.raises(ValueError):
        Record("tool", "x", "x")


def test_newest_tool_result_can_be_shown_whole():
    """ShortTextPolicy(newest_tool_result="full"): the page just read is shown whole once, then short."""
    page = "<information>" + "x" * 300 + "</information>"
    memory = AgentMemory("Q?", short_text_policy=ShortTextPolicy(newest_tool_result="full", cut_notice=None))
    memory.add_llm_gen("<mem>m1</mem><think>t</think><access>d1</access>")
    memory.add_webpage(page)
    assert memory.messages("memory")[-1] == {"role": "user", "content": page}
    memory.add_llm_gen("<mem>m2</mem><think>t</think><access>d2</access>")
    memory.add_webpage(page.replace("x", "y"))
    shown = memory.messages("memory")
    assert shown[-1]["content"] == page.replace("x", "y")
    assert all("x" * 101 not in m["content"] for m in shown)  # the older page only as its short text
    default = AgentMemory("Q?")
    default.add_llm_gen("<mem>m1</mem><think>t</think><access>d1</access>")
    default.add_webpage(page)
    assert len(default.messages("memory")[-1]["content"]) < len(page)
    with pytest.raises(ValueError, match="newest_tool_result"):
        ShortTextPolicy(newest_tool_result="whole")
