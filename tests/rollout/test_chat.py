"""rollout.chat_template: "auto" (the tokenizer's template, refused when it rewrites an assistant
turn), "builtin" (ChatML) or a Jinja template file, read by training rollouts, SFT example
building and evaluation alike.

`QWEN3_LIKE` reproduces what Qwen3's chat template does to earlier assistant turns (everything up
to ``</think>`` of an assistant turn before the last user turn is dropped: a memory-context
prompt would lose that turn's ``<mem>``)."""
import copy

import pytest

from mempo.rollout.chat import PROBE_ASSISTANT, ChatFormat, ChatTemplateError, render_builtin
from mempo.config import load_config
from support.rollout_fixtures import chat_tokenizer

QWEN3_LIKE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- set content = m.content %}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MARKED = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n[file] {{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "s"}, {"role": "user", "content": "q?"},
            {"role": "assistant", "content": PROBE_ASSISTANT},
            {"role": "user", "content": "<information>x</information>"}]


@pytest.fixture
def qwen3_tok():
    tok = copy.deepcopy(chat_tokenizer())
    tok.chat_template = QWEN3_LIKE
    return tok


def test_auto_uses_a_faithful_tokenizer_template():
    chat = ChatFormat(chat_tokenizer(), template="auto")
    assert chat.uses_tokenizer_template and chat.render(MESSAGES) == render_builtin(MESSAGES)


def test_auto_refuses_a_template_that_drops_assistant_text(qwen3_tok):
    assert "<mem>" not in qwen3_tok.apply_chat_template(MESSAGES, tokenize=False)  # the premise
    with pytest.raises(ChatTemplateError, match=r"^rollout\.chat_template: .*not render an assistant turn verbatim"
                                                r".*rollout\.chat_template=builtin"):
        ChatFormat(qwen3_tok, template="auto")
    builtin = ChatFormat(qwen3_tok, template="builtin")
    assert not builtin.uses_tokenizer_template and builtin.render(MESSAGES) == render_builtin(MESSAGES)


def test_a_template_file_is_used_and_checked(tmp_path, qwen3_tok):
    marked, dropping = tmp_path / "marked.jinja", tmp_path / "qwen3.jinja"
    marked.write_text(MARKED)
    dropping.write_text(QWEN3_LIKE)
    chat = ChatFormat(qwen3_tok, template=str(marked))
    assert chat.render(MESSAGES[:2]) == ("<|im_start|>system\n[file] s<|im_end|>\n<|im_start|>user\n[file] q?"
                                         "<|im_end|>\n<|im_start|>assistant\n")
    assert chat.tool_glue() == ("<|im_end|>\n<|im_start|>user\n[file] ", "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ChatTemplateError, match="verbatim"):
        ChatFormat(chat_tokenizer(), template=str(dropping))
    with pytest.raises(ChatTemplateError, match=r"'nope\.jinja' is neither 'auto', 'builtin' nor a template file"):
        ChatFormat(chat_tokenizer(), template="nope.jinja")


@pytest.mark.parametrize("template, detail", [
    ("{% for m in messages %}{{ m['content'] }", "TemplateSyntaxError"),
    ("{{ raise_exception('this template wants alternating roles') }}", "this template wants alternating roles"),
    ("{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}", "no_such_filter"),
])
def test_a_template_that_cannot_render_is_one_clear_error(tmp_path, template, detail):
    """Issue 21, case 5: a Jinja syntax error, raise_exception() or an unknown filter was a jinja2
    traceback; the probe conversation is rendered at start-up and its error named."""
    path = tmp_path / "bad.jinja"
    path.write_text(template)
    with pytest.raises(ChatTemplateError, match=r"^rollout\.chat_template: the chat template fails on a probe "
                                                r"conversation \(.*rollout\.chat_template=builtin") as error:
        ChatFormat(chat_tokenizer(), template=str(path))
    assert detail in str(error.value) and "\n" not in str(error.value)
    tok = copy.deepcopy(chat_tokenizer())
    tok.chat_template = template  # the tokenizer's own template under "auto" alike
    with pytest.raises(ChatTemplateError, match=detail):
        ChatFormat(tok, template="auto")


def test_training_sft_and_eval_read_the_config_choice(tmp_path, qwen3_tok):
    """The same model and Qwen3-like tokenizer: the config's "auto" is refused by the training
    rollout, the SFT example builder and the evaluation; "builtin" works in all three and gives
    the SFT examples the rollout's prompt ids."""
    import torch

    from mempo.synthetic.oracle import run_oracle
    from mempo.env.build import build_tools
    from mempo.synthetic.build import build_world
    from mempo.eval import eval_episodes, eval_rollout_config, evaluate
    from mempo.rollout.loop import RolloutEngine
    from mempo.rollout.backends import HFBackend
    from mempo.train.sft import run_sft
    from support.rollout_fixtures import tiny_qwen2

    torch.set_num_threads(1)
    model = tiny_qwen2(len(qwen3_tok), seed=0)
    base = ["synthetic.world_entities=25", "eval.objectives=[1]", "eval.episodes=1", "eval.max_turns=2",
            "rollout.max_new_tokens_per_round=8", "sft.steps=1"]
    auto, builtin = load_config(None, base), load_config(None, base + ["rollout.chat_template=builtin"])
    world, retriever = build_world(auto)
    episodes = eval_episodes(world, auto)
    tools = build_tools(auto, retriever)
    trajectory = run_oracle(episodes[1][0], tools, policy="memory")
    for cfg, works in ((auto, False), (builtin, True)):
        steps = [
            lambda: RolloutEngine(HFBackend(model, qwen3_tok), qwen3_tok, tools, config=cfg.rollout),
            lambda: run_sft(cfg, model, qwen3_tok, [trajectory]),
            lambda: evaluate(model, qwen3_tok, episodes, retriever, cfg, show_progress=False),
        ]
        for step in steps:
            if works:
                step()
            else:
                with pytest.raises(ChatTemplateError, match="rollout.chat_template"):
                    step()
    assert eval_rollout_config(builtin, "memory").chat_template == "builtin"
