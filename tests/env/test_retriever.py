"""The retriever registry (every registered name builds through `make_retriever`) and the import
weight of `mempo.env`.
"""
import subprocess
import sys

import pytest

from mempo.env.bm25 import BM25Retriever
from mempo.env.build import available_retrievers, make_retriever

# ------------------------------------------------------------------------------------------------
# registry and import weight
# ------------------------------------------------------------------------------------------------

def test_registry(corpus):
    assert {"bm25", "http", "dense"} <= set(available_retrievers())
    retriever = make_retriever("bm25", documents=corpus[:20])
    assert isinstance(retriever, BM25Retriever) and retriever.num_docs == 20
    client = make_retriever("http", base_url="http://127.0.0.1:9", retries=0)
    assert client.base_url == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="unknown retriever 'nope'"):
        make_retriever("nope")


def test_import_mempo_env_stays_light():
    code = ("import sys, mempo.env, mempo.apps.cli\n"
            "mempo.apps.cli.build_parser()\n"
            "heavy = [m for m in ('fastapi', 'uvicorn', 'starlette', 'pydantic', 'bm25s', 'numpy', 'transformers', "
            "'sentence_transformers', 'faiss', 'torch') if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import mempo.env pulled in: {out.stdout.strip()}"
