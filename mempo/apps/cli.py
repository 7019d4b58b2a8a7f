"""The `mempo` command line: ``mempo <command> [options]`` (also ``python -m mempo`` and
``python -m mempo.apps.cli``); the commands are the rows of `COMMANDS`.

Adding a command is one module with ``add_arguments(parser)`` and ``run(args) -> exit code`` and one
row in `COMMANDS`. The command modules import their libraries inside ``run``, so ``mempo --help``
stays fast.

Exit codes: 0 success, 1 runtime failure (e.g. the port is taken), 2 usage or input error (argparse
errors, and every `mempo.errors.MempoError` a command raises; `main` prints it as one line
``mempo <command>: <message>``, never a traceback; no command prints its own), 130 interrupted.
"""
import argparse
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from mempo import __version__
from mempo.apps import (ask_command, demo_command, eval_command, export_command, plan_command, serve_command,
                        serve_retriever_command, train_commands)
from mempo.errors import MempoError

__all__ = ["main", "build_parser", "Command", "COMMANDS"]


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, help line, argument declarations and runner."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: tuple[Command, ...] = (
    Command("ask", ask_command.HELP, ask_command.add_arguments, ask_command.run),
    Command("demo", demo_command.HELP, demo_command.add_arguments, demo_command.run),
    Command("eval", eval_command.HELP, eval_command.add_arguments, eval_command.run),
    Command("export", export_command.HELP, export_command.add_arguments, export_command.run),
    Command("plan", plan_command.HELP, plan_command.add_arguments, plan_command.run),
    Command("serve", serve_command.HELP, serve_command.add_arguments, serve_command.run),
    Command("serve-retriever", serve_retriever_command.HELP, serve_retriever_command.add_arguments,
            serve_retriever_command.run),
    Command("sft", train_commands.SFT_HELP, train_commands.add_sft_arguments, train_commands.run_sft),
    Command("train", train_commands.TRAIN_HELP, train_commands.add_train_arguments, train_commands.run_train),
)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its options and its positionals (the question, the dotted overrides) in
    any order (``mempo eval --model M eval.objectives=[2] --episodes 8 eval.closed_book=false``);
    plain argparse stops taking positionals at the first option after them."""

    _parsing = False  # argparse's intermixed parse calls parse_known_args itself, twice

    def parse_known_args(self, args=None, namespace=None):
        if self._parsing:
            return super().parse_known_args(args, namespace)
        self._parsing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing = False


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command of `COMMANDS` (each a `_CommandParser`)."""
    parser = argparse.ArgumentParser(prog="mempo", description="MemPO: memory policy optimisation for LLM agents.")
    parser.add_argument("--version", action="version", version=f"mempo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser)
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(command_parser)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the chosen command, return its exit code."""
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.name == args.command)
    try:
        return command.run(args)
    except MempoError as error:  # a user-fixable error: one line, no traceback
        print(f"mempo {args.command}: {_one_line(str(error)) or type(error).__name__}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


#: The longest error line the command line prints (a value quoted in an error can be huge).
MAX_ERROR_CHARS = 1000


def _one_line(message: str) -> str:
    """`message` with its white space (newlines included) collapsed to single spaces, cut to
    `MAX_ERROR_CHARS` characters (the cut says how many more there were)."""
    line = " ".join(message.split())
    if len(line) <= MAX_ERROR_CHARS:
        return line
    return f"{line[:MAX_ERROR_CHARS]} [... {len(line) - MAX_ERROR_CHARS} more characters]"


if __name__ == "__main__":
    sys.exit(main())
