"""Packaging facts: light imports, the installed layout, the public API surface."""
import subprocess
import sys

import mempo.ops


def test_import_mempo_ops_stays_light():
    code = ("import sys, mempo.ops, mempo.ops.advantage, mempo.ops.logprob, mempo.ops.spans\n"
            "heavy = [m for m in ('transformers', 'verl', 'sglang', 'tokenizers', 'triton', 'flash_attn') "
            "if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import mempo.ops pulled in: {out.stdout.strip()}"


def test_kernels_and_scanner_ship_inside_the_package():
    import mempo._scanner  # noqa: F401  (compiled extension)
    import mempo.kernels

    assert mempo.kernels.__name__ == "mempo.kernels"


def test_public_api_resolves():
    for name in mempo.ops.__all__:
        assert getattr(mempo.ops, name) is not None


def test_import_line_of_the_readme_gives_every_op_as_a_function():
    """The README's import line: each name is the op itself, never a submodule of that name."""
    from mempo.ops import (TokenTable, answer_logprob, answer_logprob_from_hidden, answer_logprob_from_token_logp,
                           find_spans, grpo_outcome_advantage, memory_advantage, mempo_advantage)

    for op in (answer_logprob, answer_logprob_from_hidden, answer_logprob_from_token_logp, find_spans,
               grpo_outcome_advantage, memory_advantage, mempo_advantage):
        assert callable(op) and op.__module__.startswith("mempo.ops."), op
    assert isinstance(TokenTable, type)


def test_the_cli_imports_its_commands_and_no_command_imports_the_cli():
    """`mempo.apps.cli` holds the table of commands; a command module never imports the CLI back (no
    register-on-import cycle), and building the parser imports no command's library."""
    code = ("import sys, mempo.apps.train_commands, mempo.apps.eval_command, mempo.apps.demo_command, "
            "mempo.apps.serve_retriever_command, mempo.apps.serve_command, mempo.apps.ask_command\n"
            "print('mempo.apps.cli' in sys.modules)\n"
            "import mempo.apps.cli as cli\n"
            "cli.build_parser()\n"
            "print(sorted(c.name for c in cli.COMMANDS))\n"
            "print([m for m in ('mempo.apps.demo', 'mempo.eval', 'mempo.train.trainer', 'mempo.serve.agent', "
            "'torch') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["False",
                                          "['ask', 'demo', 'eval', 'export', 'plan', 'serve', 'serve-retriever', "
                                          "'sft', 'train']", "[]"]
