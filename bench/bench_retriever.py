"""Retrieval benchmarks: BM25 index build, index size on disk, and queries/s at top-5 through the server.

Run: pytest bench/bench_retriever.py --benchmark-only      (about 2-3 minutes on 2 CPU cores)
     MEMPO_BENCH_RETRIEVAL_DOCS=5000 pytest bench/bench_retriever.py --benchmark-only   (quick check)

Corpus: `synthetic_corpus(100_000, seed=0)`: the documents of `mempo.synthetic.world.World.generate(seed=0,
num_documents=100_000)`: about 50,000 entity articles (people, cities, companies ... with their fact
sentences), 60 long chronicles of 3 or more 25,000-character access pages, and news / namesake
distractors; 47 MB of text.
Queries: 4,000 deterministic queries, each an entity name plus two words of a random document.

Measured:
- index build (tokenise + bm25s index, in memory) and save; extra_info: index bytes on disk (bm25s
  arrays, documents), corpus jsonl bytes.
- the server as a separate process (`python -m mempo.apps.cli serve-retriever --index-dir ... --port 0`,
  so client and server do not share a GIL), loading the saved index (memory-mapped): its startup
  time and resident memory, then queries/s at top-5 from one client (one query per request), one
  client sending batches of 16 queries per request (Search-R1 style), and 16 concurrent clients
  (threads, one query per request), all with `HTTPRetriever` over loopback.
- in-process search queries/s (no HTTP) as the baseline.
queries/s is in each benchmark's extra_info ("qps"); the timed unit is one round of requests.
"""
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mempo.env.bm25 import BM25Retriever
from mempo.env.client import HTTPRetriever
from mempo.env.corpus import Document, write_corpus
from mempo.synthetic.world import World

NUM_DOCS = int(os.environ.get("MEMPO_BENCH_RETRIEVAL_DOCS", "100000"))  # smaller for a quick check
NUM_QUERIES = 4_000
TOPK = 5
CLIENTS = 16
REPO_ROOT = Path(__file__).resolve().parents[1]


def synthetic_corpus(num_docs: int, seed: int = 0) -> list[Document]:
    """The documents of a synthetic world with exactly `num_docs` documents (see the module docstring)."""
    return list(World.generate(seed=seed, num_documents=num_docs).documents())


def synthetic_queries(docs: list[Document], num_queries: int, seed: int = 1) -> list[str]:
    """Entity name of a random document plus two of its words."""
    rng = random.Random(seed)
    queries = []
    for _ in range(num_queries):
        doc = docs[rng.randrange(len(docs))]
        words = doc.text.split()
        queries.append(doc.title.split(" (")[0] + " " + " ".join(rng.sample(words, 2)))
    return queries


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@pytest.fixture(scope="module")
def corpus():
    started = time.perf_counter()
    docs = synthetic_corpus(NUM_DOCS, seed=0)
    print(f"\ngenerated {len(docs)} documents in {time.perf_counter() - started:.1f} s")
    return docs


@pytest.fixture(scope="module")
def queries(corpus):
    return synthetic_queries(corpus, NUM_QUERIES)


@pytest.fixture(scope="module")
def index_dir(corpus, tmp_path_factory):
    """The corpus written as jsonl and indexed once into a saved index directory."""
    root = tmp_path_factory.mktemp("bench_retriever")
    write_corpus(root / "corpus.jsonl", corpus)
    with BM25Retriever.build(corpus) as retriever:
        retriever.save(root / "index")
    return root / "index"


@pytest.fixture(scope="module")
def server(index_dir):
    """`mempo serve-retriever` in its own process, loading the saved index; yields (url, info, pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "mempo.apps.cli", "serve-retriever", "--index-dir", str(index_dir),
                             "--port", "0", "--topk-max", "100"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = proc.stdout.readline()
        assert line.startswith("mempo-retriever ready"), line
        fields = dict(part.split("=", 1) for part in line.split()[2:])
        info = {"startup_s": float(fields["startup_s"]), "rss_mib_after_load": round(_rss_mib(proc.pid), 1)}
        yield fields["url"], info, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _machine() -> dict:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "num_docs": NUM_DOCS, "topk": TOPK}


def test_index_build(benchmark, corpus, index_dir):
    benchmark.extra_info.update(_machine())
    built = benchmark.pedantic(lambda: BM25Retriever.build(corpus), rounds=1, iterations=1)
    save_dir = index_dir.parent / "index-timed"
    started = time.perf_counter()
    built.save(save_dir)
    built.close()
    benchmark.extra_info.update(
        save_s=round(time.perf_counter() - started, 2),
        index_mib=round(_dir_bytes(save_dir) / 2**20, 1),
        bm25_arrays_mib=round(_dir_bytes(save_dir / "bm25s") / 2**20, 1),
        documents_mib=round((save_dir / "documents.jsonl").stat().st_size / 2**20, 1),
        corpus_jsonl_mib=round((index_dir.parent / "corpus.jsonl").stat().st_size / 2**20, 1),
    )


def test_search_in_process(benchmark, index_dir, queries):
    batch = queries[:1000]
    with BM25Retriever.load(index_dir) as retriever:
        benchmark.pedantic(lambda: [retriever.search([q], TOPK) for q in batch], rounds=3, warmup_rounds=1)
    benchmark.extra_info.update({**_machine(), "path": "in-process, memory-mapped index, one query per call",
                                 "qps": round(len(batch) / benchmark.stats.stats.mean, 1)})


def test_server_one_client(benchmark, server, queries):
    url, info, _ = server
    client = HTTPRetriever(url, timeout=30, retries=0)
    batch = queries[1000:1400]
    benchmark.pedantic(lambda: [client.search([q], TOPK) for q in batch], rounds=3, warmup_rounds=1)
    benchmark.extra_info.update({**_machine(), **info, "path": "HTTP, 1 client, 1 query per request",
                                 "qps": round(len(batch) / benchmark.stats.stats.mean, 1)})


def test_server_one_client_batched(benchmark, server, queries):
    url, info, _ = server
    client = HTTPRetriever(url, timeout=30, retries=0)
    batch = queries[1400:2200]
    requests = [batch[i:i + 16] for i in range(0, len(batch), 16)]
    benchmark.pedantic(lambda: [client.search(r, TOPK) for r in requests], rounds=3, warmup_rounds=1)
    benchmark.extra_info.update({**_machine(), **info, "path": "HTTP, 1 client, 16 queries per request",
                                 "qps": round(len(batch) / benchmark.stats.stats.mean, 1)})


def test_server_concurrent_clients(benchmark, server, queries):
    url, info, pid = server
    clients = [HTTPRetriever(url, timeout=60, retries=0) for _ in range(CLIENTS)]
    batch = queries[2200:3000]
    shares = [batch[i::CLIENTS] for i in range(CLIENTS)]

    def one_round():
        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(lambda pair: [pair[0].search([q], TOPK) for q in pair[1]], zip(clients, shares)))

    benchmark.pedantic(one_round, rounds=3, warmup_rounds=1)
    info = dict(info, rss_mib_after_bench=round(_rss_mib(pid), 1))
    benchmark.extra_info.update({**_machine(), **info,
                                 "path": f"HTTP, {CLIENTS} concurrent clients (threads), 1 query per request",
                                 "qps": round(len(batch) / benchmark.stats.stats.mean, 1)})
