"""``mempo ask``: one question through the trained agent, each round printed as it finishes.

    mempo ask "QUESTION" [section.field=value ...] --model MODEL_DIR [--config CONFIG.yaml]
              [--corpus CORPUS.jsonl | --retriever-url URL | --index-dir DIR] [--max-turns N]
              [--max-tokens N] [--temperature T] [--json]

Overrides go anywhere among the options. QUESTION is what a person asks: one question, or several
as numbered lines (``1. …`` ``2. …``); it is laid out as the config's episodes are
(`mempo.env.data.user_turn`). The same loop as `mempo serve` and `mempo eval`
(`mempo.serve.agent.AgentService`); the rounds go to stdout as they happen (memory, action, a
result excerpt), then the answer (``--json``: one JSON object, `AgentAnswer.to_dict`, at the end
instead). Exit 0 when the agent answered, 1 when it ended without an answer, 2 for a user error
(one line).
"""
from __future__ import annotations

import argparse
import json
import re

from mempo.apps.serve_command import add_agent_arguments, agent_config
from mempo.config import ConfigError

__all__ = ["HELP", "add_arguments", "run", "EXCERPT_CHARS"]

HELP = "ask the trained agent one question, printing each round (memory, search, result) and the answer"
EXCERPT_CHARS = 240
_OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+=")  # section.field=value; a question rarely looks so


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="the question (quote it)")
    add_agent_arguments(parser)
    parser.add_argument("--max-turns", type=int, default=None, help="rounds at most (default eval.max_turns)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="tokens per round at most (default rollout.max_new_tokens_per_round)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default "
                                                                        "eval.temperature: 0, greedy)")
    parser.add_argument("--json", action="store_true", help="print the answer and its rounds as one JSON object")


def _excerpt(text: str, chars: int = EXCERPT_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= chars else line[:chars] + " ..."


def print_round(round_) -> None:
    """One round as a few lines: its memory, its action and argument, the tool result's excerpt."""
    print(f"round {round_.index + 1}: memory: {_excerpt(round_.memory or '(none)')}", flush=True)
    if round_.action is not None:
        print(f"  {round_.action}: {_excerpt(round_.argument or '')}", flush=True)
    else:
        print(f"  no action (stopped: {round_.stop_reason})", flush=True)
    if round_.tool_result is not None:
        status = "result" if round_.tool_ok else "tool error"
        print(f"  {status}: {_excerpt(round_.tool_result)}", flush=True)
    print(f"  tokens: prompt {round_.prompt_tokens}, generated {round_.generated_tokens}, tool {round_.tool_tokens}",
          flush=True)


def _question_and_overrides(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the question told from the overrides among the positional words, wherever it
    stood (argparse gives the first positional word to the question)."""
    words = [args.question, *args.overrides]
    questions = [word for word in words if not _OVERRIDE.match(word)]
    if len(questions) != 1:
        raise ConfigError("question", f"give one question (quoted), got {len(questions)}: "
                                      f"{', '.join(repr(q[:40]) for q in questions) or 'only overrides'}")
    return argparse.Namespace(**{**vars(args), "question": questions[0],
                                 "overrides": [word for word in words if _OVERRIDE.match(word)]})


def run(args: argparse.Namespace) -> int:
    """Check the question (`mempo.env.data.check_question`: at most `MAX_QUESTION_CHARS` characters,
    encodable; lines allowed) and the flags, load the agent (`mempo.serve.load.load_agent`) and
    answer ``args.question``."""
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.env.data import check_question, user_turn
    from mempo.eval.episodes import prompt_style
    from mempo.serve.agent import AgentOptions, check_agent_options
    from mempo.serve.load import load_agent
    from mempo.utils.log import log

    # the question and the flags are checked before the (slow) model load
    args = _question_and_overrides(args)
    if not args.question.strip():
        raise ConfigError("question", "is empty")
    check_question(args.question, "question", one_line=False)  # e.g. a byte that is not UTF-8 in argv: one line
    options = AgentOptions(temperature=args.temperature, max_new_tokens=args.max_tokens, max_turns=args.max_turns)
    try:
        check_agent_options(options)
    except ValueError as error:
        raise ConfigError("--" + str(error).split(" ", 1)[0].replace("_", "-").replace("new-tokens", "tokens"),
                          str(error)) from None
    cfg = agent_config(args)
    try:  # the layout's refusals (the service lays the question out again)
        user_turn(args.question, prompt_style(cfg))
    except ValueError as error:
        raise ConfigError("question", str(error)) from None
    agent = load_agent(cfg, args.model, index_dir=args.index_dir, log=log,
                       max_turns_limit=max(args.max_turns or 0, cfg.eval.max_turns))
    try:
        answer = agent.service.answer(args.question, options, on_round=None if args.json else print_round)
    finally:
        agent.close()
    if args.json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False, indent=2))
    else:
        print(f"answer: {answer.answer if answer.answer is not None else '(none)'}  "
              f"[{answer.finish_reason}, {len(answer.rounds)} round(s), {answer.seconds:.1f} s]")
    return 0 if answer.answer is not None else 1
