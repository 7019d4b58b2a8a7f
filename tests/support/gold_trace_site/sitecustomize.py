"""Installed only by tests that put this directory on PYTHONPATH: when MEMPO_TEST_GOLD_TRACE names a
path prefix, every Python process of the run (torchrun's workers included) records what reached
generation into ``<prefix>.<pid>.jsonl`` (tests/_gold_trace.py)."""
import os
import sys

if os.environ.get("MEMPO_TEST_GOLD_TRACE"):
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import _gold_trace

    _gold_trace.install(_gold_trace.write_sink(f"{os.environ['MEMPO_TEST_GOLD_TRACE']}.{os.getpid()}.jsonl"))
