"""Test instrumentation: what reached generation, and whether a gold answer was in it.

`install(sink)` wraps two methods (test-side monkeypatching; the package itself has no hook):

* `HFBackend._generate_chunk`: every ``generate`` chunk records each request's prompt ids and,
  after the chunk (the processors keep their per-chunk state until the next one), every string
  and every integer sequence found by walking the backend's logits processors' attributes
  recursively (lists, tuples, dicts, sets, 1-D integer tensors; tokenizers, token tables, modules
  and callables are shared machinery, not task state, and are skipped);
* `RolloutEngine.run`: every task's question and gold answers (the reference for the check).

`violations(records, tokenizer)` checks a trace. A gold string is every alias of every objective
of every task run (golds that occur in some task's question are task input and not checked):

* a prompt, decoded, is split at ``<|im_end|>`` into chat turns; the text the agent legitimately
  read is removed: assistant turns (the model's own generation, including the forced prefix of
  the open turn) and ``<information>...</information>`` blocks (``<tool_response>`` in the json
  action format: tool results, which may well contain the answer). What remains (system prompt,
  question, chat glue) must not contain a gold string (case-insensitive, on word boundaries);
* a gold string, or its token ids (encoded alone or after a space) as a contiguous run of an
  integer sequence, found in a logits processor's state must occur in the text read in the same
  chunk's prompts (their tool results and generated turns).

`write_sink(path)` appends records as JSON lines (for subprocesses: `support/gold_trace_site/sitecustomize.py`
installs it when ``MEMPO_TEST_GOLD_TRACE`` names a path prefix); `read_records(prefix)` reads them.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import re
import types
from typing import Any, Callable, Iterable, Optional

_MAX_TENSOR = 100_000
_INFO = re.compile(r"<(information|tool_response)>.*?(?:</\1>|$)", re.S)  # the tool-result block of either format
_ROLE = re.compile(r"<\|im_start\|>(\w+)\n")


def _is_machinery(value: Any) -> bool:
    import torch

    if isinstance(value, (torch.nn.Module, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
                          functools.partial, type)):
        return True
    return any(hasattr(value, name) for name in ("get_vocab", "token_to_id", "pieces", "token_offsets"))


def processor_state(processors: Iterable[Any]) -> tuple[list[str], list[list[int]]]:
    """Every string and integer sequence in the processors' attributes (module docstring)."""
    import torch

    strings: list[str] = []
    int_lists: list[list[int]] = []
    seen: set[int] = set()

    def walk(value: Any, depth: int = 0) -> None:
        if depth > 12 or id(value) in seen:
            return
        if isinstance(value, str):
            strings.append(value)
            return
        if isinstance(value, (bool, int, float)) or value is None:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.dim() == 1 and not value.is_floating_point() and value.numel() <= _MAX_TENSOR:
                int_lists.append([int(v) for v in value.tolist()])
            return
        if isinstance(value, dict):
            for key, item in value.items():
                walk(key, depth + 1)
                walk(item, depth + 1)
            return
        if isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
            if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
                int_lists.append([int(v) for v in items])
                return
            for item in items:
                walk(item, depth + 1)
            return
        if _is_machinery(value):
            return
        attributes = getattr(value, "__dict__", None)
        if attributes is not None:
            walk(attributes, depth + 1)

    for processor in processors:
        walk(getattr(processor, "__dict__", {}))
    return strings, int_lists


def install(sink: Callable[[dict], None]) -> Callable[[], None]:
    """Wrap the generation and rollout entry points (module docstring); returns the uninstaller."""
    from mempo.rollout.backends.hf import HFBackend
    from mempo.rollout.loop import RolloutEngine, as_task

    original_chunk = HFBackend._generate_chunk
    original_run = RolloutEngine.run

    def traced_chunk(self, requests, sampling):
        outputs = original_chunk(self, requests, sampling)
        strings, int_lists = processor_state(self.logits_processors)
        sink({"kind": "generate", "prompts": [list(map(int, r.prompt_ids)) for r in requests],
              "strings": strings, "int_lists": int_lists})
        return outputs

    def traced_run(self, tasks, *args, **kwargs):
        for i, task in enumerate(tasks):
            task = as_task(task, i)
            sink({"kind": "task", "question": task.prompt, "golds": _gold_strings(task.golds)})
        return original_run(self, tasks, *args, **kwargs)

    HFBackend._generate_chunk = traced_chunk
    RolloutEngine.run = traced_run

    def uninstall() -> None:
        HFBackend._generate_chunk = original_chunk
        RolloutEngine.run = original_run

    return uninstall


def _gold_strings(golds: Any) -> list[str]:
    if golds is None:
        return []
    from mempo.protocol.reward import objectives_from_golds

    return [alias for aliases in objectives_from_golds(golds) for alias in aliases]


def write_sink(path: str) -> Callable[[dict], None]:
    def sink(record: dict) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    return sink


def read_records(prefix: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(prefix + "*")):
        with open(path, encoding="utf-8") as handle:
            records.extend(json.loads(line) for line in handle if line.strip())
    return records


def split_prompt(text: str) -> tuple[str, str]:
    """(what is left of a decoded ChatML prompt once the read text is removed, the read text)."""
    rest, read = [], []
    for chunk in text.split("<|im_end|>"):
        match = _ROLE.search(chunk)
        if match is None:
            rest.append(chunk)
            continue
        rest.append(chunk[:match.end()])
        content = chunk[match.end():]
        if match.group(1) == "assistant":
            read.append(content)
        else:
            read.extend(m.group(0) for m in _INFO.finditer(content))
            rest.append(_INFO.sub(" ", content))
    return "\n".join(rest), "\n".join(read)


def _contains_run(values: list[int], run: list[int]) -> bool:
    n = len(run)
    return n > 0 and any(values[i:i + n] == run for i in range(len(values) - n + 1))


def violations(records: list[dict], tokenizer: Any) -> list[str]:
    """Every place a gold answer reached generation outside the text the agent read (module docstring)."""
    from mempo.utils.tokens import decode_ids, encode_text

    questions = [r["question"] for r in records if r["kind"] == "task"]
    golds = sorted({g for r in records if r["kind"] == "task" for g in r["golds"] if g.strip()})
    golds = [g for g in golds if not any(g.lower() in q.lower() for q in questions)]
    patterns = {g: re.compile(r"(?<!\w)" + re.escape(g) + r"(?!\w)", re.I) for g in golds}
    gold_ids = {g: [ids for ids in (encode_text(tokenizer, g), encode_text(tokenizer, " " + g)) if ids]
                for g in golds}
    found = []
    for number, record in enumerate(r for r in records if r["kind"] == "generate"):
        read_texts = []
        for prompt in record["prompts"]:
            rest, read = split_prompt(decode_ids(tokenizer, prompt))
            read_texts.append(read)
            for gold, pattern in patterns.items():
                if pattern.search(rest):
                    found.append(f"generate call {number}: gold {gold!r} in the prompt outside tool results and "
                                 f"generated turns: {rest[max(0, pattern.search(rest).start() - 80):][:200]!r}")
        read = "\n".join(read_texts).lower()
        for gold in golds:
            if gold.lower() in read:
                continue  # the agent read it in this chunk: a processor may hold it
            if any(gold.lower() in s.lower() for s in record["strings"]):
                found.append(f"generate call {number}: gold {gold!r} in a logits processor's strings")
            if any(_contains_run(values, ids) for values in record["int_lists"] for ids in gold_ids[gold]):
                found.append(f"generate call {number}: token ids of gold {gold!r} in a logits processor's state")
    return found


def summary(records: list[dict]) -> dict[str, int]:
    """Counts that show a trace is not empty: tasks, generate calls, prompts, processor sequences."""
    calls = [r for r in records if r["kind"] == "generate"]
    return {"tasks": sum(r["kind"] == "task" for r in records), "generate_calls": len(calls),
            "prompts": sum(len(r["prompts"]) for r in calls),
            "processor_int_lists": sum(len(r["int_lists"]) for r in calls)}


def env_prefix() -> Optional[str]:
    return os.environ.get("MEMPO_TEST_GOLD_TRACE")
