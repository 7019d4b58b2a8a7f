"""Installed only by tests that put this directory on PYTHONPATH: when MEMPO_TEST_GOLD_TRACE names a
path prefix, every Python process of the run (torchrun's workers included) records what reached
generation into ``<prefix>.<pid>.jsonl`` (tests/support/gold_trace.py)."""
import os
import sys

if os.environ.get("MEMPO_TEST_GOLD_TRACE"):
    tests_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if tests_dir not in sys.path:
        sys.path.append(tests_dir)
    from support import gold_trace

    gold_trace.install(gold_trace.write_sink(f"{os.environ['MEMPO_TEST_GOLD_TRACE']}.{os.getpid()}.jsonl"))
