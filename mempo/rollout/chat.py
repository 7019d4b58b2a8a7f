"""Chat formatting of round prompts: messages -> token ids, the forced ``<mem>`` prefix, tool segments.

Text is encoded without added special tokens (no BOS; special tokens written in the text, such as
``<|im_start|>``, match as added tokens) and decoded with special tokens kept and no clean-up, so
``decode`` shows exactly what the ids are. The full-context sequence is the chat rendering of
``AgentMemory.messages("full")``, round by round, with the model's own ids for every assistant turn.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

from mempo.errors import MempoError
from mempo.protocol.memory import MEM_PREFIX
from mempo.utils.tokens import decode_ids, encode_text, is_transformers_tokenizer

__all__ = ["ChatFormat", "ChatTemplateError", "ToolSegment", "render_builtin",
           "default_stop_token_ids", "check_template", "PROBE_ASSISTANT", "IM_START", "IM_END"]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_SENTINEL_ASSISTANT = "MEMPO0SENTINEL0ASSISTANT"
_SENTINEL_TOOL = "MEMPO0SENTINEL0TOOL"
#: The assistant turn of the probe conversation `check_template` renders.
PROBE_ASSISTANT = ("<mem> Q1: probe memory MEMPO0PROBE0MEM </mem>\n<think>\nprobe reasoning MEMPO0PROBE0THINK\n"
                   "</think>\n<search> probe query </search>")
_PROBE_TOOL = "<information>probe result MEMPO0PROBE0TOOL</information>"


class ChatTemplateError(MempoError, ValueError):
    """A chat template that cannot carry the protocol, or a template file that cannot be read."""


def check_template(render) -> None:
    """Raise `ChatTemplateError` unless ``render(messages, add_generation_prompt=True)`` keeps the
    probe's assistant turn (``<mem>…</mem><think>…</think><search>…</search>``) and the tool result
    after it verbatim and in order: the protocol keeps every turn's ``<mem>`` and builds the memory
    context from the last turn's text (Qwen3's template, for one, drops everything before
    ``</think>`` of earlier assistant turns). A template that fails to render the probe at all (a
    Jinja syntax error, ``raise_exception(...)``, an unknown filter or test, anything it raises) is a
    `ChatTemplateError` too, with the template's own message on one line. The error names
    ``rollout.chat_template`` and suggests ``builtin``."""
    messages = [{"role": "system", "content": "probe system"}, {"role": "user", "content": "probe question?"},
                {"role": "assistant", "content": PROBE_ASSISTANT}, {"role": "user", "content": _PROBE_TOOL}]
    try:
        text = render(messages, add_generation_prompt=True)
    except Exception as error:  # jinja2's TemplateSyntaxError / TemplateError / UndefinedError, whatever it raises
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        line = getattr(error, "lineno", None)
        raise ChatTemplateError(
            f"rollout.chat_template: the chat template fails on a probe conversation "
            f"({detail}{f', template line {line}' if line else ''}); fix it or set "
            "rollout.chat_template=builtin (ChatML)") from None
    if not isinstance(text, str):
        raise ChatTemplateError(f"rollout.chat_template: the chat template rendered {type(text).__name__}, not text")
    at = text.find(PROBE_ASSISTANT)
    if at < 0:
        got = text[text.find("MEMPO0PROBE0") - 60:][:240] if "MEMPO0PROBE0" in text else text[-240:]
        raise ChatTemplateError(
            "rollout.chat_template: the chat template does not render an assistant turn verbatim (a probe "
            "turn '<mem>...</mem><think>...</think><search>...</search>' followed by a user turn came out as "
            f"{got!r}; templates such as Qwen3's drop text before '</think>' of earlier turns, which loses "
            "their <mem>); set rollout.chat_template=builtin (ChatML) or give a template file")
    if text.find(_PROBE_TOOL, at + len(PROBE_ASSISTANT)) < 0:
        raise ChatTemplateError("rollout.chat_template: the chat template does not render a user turn after an "
                                "assistant turn verbatim; set rollout.chat_template=builtin or give a template file")


def _token_id(tokenizer: Any, token: str) -> Optional[int]:
    if is_transformers_tokenizer(tokenizer):
        vocab = tokenizer.get_vocab()
        return vocab.get(token)
    return tokenizer.token_to_id(token)


def default_stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's EOS id plus ``<|im_end|>`` and ``<|endoftext|>`` when they are single tokens."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None) if is_transformers_tokenizer(tokenizer) else None
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(i) for i in eos)
    for token in (IM_END, "<|endoftext|>"):
        token_id = _token_id(tokenizer, token)
        if token_id is not None:
            ids.append(int(token_id))
    return tuple(dict.fromkeys(ids))


def render_builtin(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The built-in Qwen-style (ChatML) rendering::

        <|im_start|>{role}\n{content}<|im_end|>\n      (for every message, in order)
        <|im_start|>assistant\n                         (the generation prompt)
    """
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    if add_generation_prompt:
        text += f"{IM_START}assistant\n"
    return text


class ToolSegment(NamedTuple):
    """The ids appended after a tool call; ``ids[information_start:information_end]`` are the tool text's."""

    ids: list[int]
    information_start: int
    information_end: int


class ChatFormat:
    """Round prompts and tool segments for one tokenizer.

    Args:
        tokenizer: transformers tokenizer or ``tokenizers.Tokenizer``.
        forced_prefix: the text every assistant turn starts with (``"<mem>"``; ``""`` for none),
            encoded on its own (``prefix_ids``). The loop appends these ids to the prompt and records
            them as the first ids of the round, in the response, so a round's decoded text starts
            with ``<mem>`` and ``AgentMemory.add_llm_gen(text, forced_prefix="<mem>")`` stores it once.
        template (``rollout.chat_template``): ``"auto"``: the tokenizer's own chat template (ChatML
            as ``"builtin"`` for a tokenizer without one); ``"builtin"``: `render_builtin`, encoded as
            text (a tokenizer lacking ``<|im_start|>`` / ``<|im_end|>`` tokens encodes them as plain
            text: fine for tests, wrong for a real model); else the path of a Jinja template file,
            rendered by ``apply_chat_template``. A tokenizer or file template is checked with
            `check_template`.
    """

    def __init__(self, tokenizer: Any, *, forced_prefix: str = MEM_PREFIX, template: str = "auto") -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")
        self.tokenizer = tokenizer
        self.template = template
        self.template_text: Optional[str] = None
        if template not in ("auto", "builtin"):
            path = Path(template).expanduser()
            if not path.is_file():
                raise ChatTemplateError(f"rollout.chat_template: {template!r} is neither 'auto', 'builtin' nor a "
                                        "template file that exists")
            if not hasattr(tokenizer, "apply_chat_template"):
                raise ChatTemplateError("rollout.chat_template: a template file needs a transformers tokenizer "
                                        "(apply_chat_template)")
            try:
                self.template_text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ChatTemplateError(f"rollout.chat_template: cannot read {template}: {error}") from None
        self.uses_tokenizer_template = self.template_text is not None or (has_template and template == "auto")
        if self.uses_tokenizer_template:
            check_template(self.render)
        self.forced_prefix = forced_prefix or ""
        self.prefix_ids: list[int] = encode_text(tokenizer, self.forced_prefix)
        self._glue: Optional[tuple[list[int], list[int]]] = None

    def _template_kwargs(self) -> dict[str, Any]:
        return {"chat_template": self.template_text} if self.template_text is not None else {}

    def encode(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (the forced prefix not included)."""
        if self.uses_tokenizer_template:
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      **self._template_kwargs())
        return render_builtin(messages, add_generation_prompt)

    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        """Prompt ids of ``messages`` with the generation prompt, without the forced prefix.

        Returns a list of ints [P]."""
        if self.uses_tokenizer_template:
            result = self.tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True,
                                                        return_dict=False, **self._template_kwargs())
            if hasattr(result, "keys") and "input_ids" in result:
                result = result["input_ids"]
            if result and isinstance(result[0], (list, tuple)):
                result = result[0]
            return [int(t) for t in result]
        return self.encode(render_builtin(messages, True))

    def tool_glue(self) -> tuple[str, str]:
        """(text before the tool result, text after it) of a tool segment: the turn boundary and the
        user turn's start, then the turn's end and the next generation prompt (ChatML:
        ``<|im_end|>\n<|im_start|>user\n`` / ``<|im_end|>\n<|im_start|>assistant\n``; for a tokenizer
        template read off it by rendering sentinel messages)."""
        if not self.uses_tokenizer_template:
            return f"{IM_END}\n{IM_START}user\n", f"{IM_END}\n{IM_START}assistant\n"
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                    {"role": "assistant", "content": _SENTINEL_ASSISTANT},
                    {"role": "user", "content": _SENTINEL_TOOL}]
        text = self.render(messages, add_generation_prompt=True)
        after_assistant = text.rfind(_SENTINEL_ASSISTANT)
        tool_at = text.rfind(_SENTINEL_TOOL)
        if after_assistant < 0 or tool_at < after_assistant:
            raise ValueError("could not read the tool-turn boundaries off the tokenizer's chat template "
                             "(it does not render assistant and user contents verbatim); use template='builtin'")
        before = text[after_assistant + len(_SENTINEL_ASSISTANT):tool_at]
        after = text[tool_at + len(_SENTINEL_TOOL):]
        return before, after

    def tool_segment(self, tool_text: str) -> ToolSegment:
        """The ids appended after a tool call (mask 0 in the response): glue, the tool text, glue,
        encoded separately and concatenated, so the tool text's ids are known
        (``information_start:information_end``)."""
        if self._glue is None:
            before, after = self.tool_glue()
            self._glue = (self.encode(before), self.encode(after))
        before_ids, after_ids = self._glue
        text_ids = self.encode(tool_text)
        start = len(before_ids)
        return ToolSegment(before_ids + text_ids + after_ids, start, start + len(text_ids))
