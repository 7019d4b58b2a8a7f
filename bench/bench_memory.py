"""Token economy of the memory context policy (`mempo.protocol.memory`): prompt tokens per episode, memory vs
full context.

Run: .venv/bin/pytest bench/bench_memory.py --benchmark-only -s    (about 1 minute on 2 cores)
     .venv/bin/python bench/bench_memory.py                         (same, prints the table)
     MEMPO_BENCH_TOKEN_EPISODES=5 ... (quick check)

Setup: a synthetic world (`World.generate(seed=0, num_documents=20_000)`), BM25 over its corpus,
the search tool at its defaults (top-5, 5,000 characters per document). For k = 2, 4, 6, 8, 10
objectives, 20 episodes of k two-hop questions each (`world.episodes(k, 20, seed=k)`, search only,
no chronicle access), solved by the oracle agent (`mempo.synthetic.oracle.run_oracle`) twice: under the
memory policy and under the full policy (`AgentMemory.messages(policy=...)`, default short-text
policy). The oracle takes the same decisions under both, so both runs have the same rounds; only
the prompts differ.

Token counting: a byte-level BPE tokenizer (HF `tokenizers`, vocabulary 8,192, Qwen2's pre-split
regex, no special tokens) trained here on the world's documents and the episode prompts. A prompt's
tokens = sum over its chat messages of (content tokens + 4), the 4 standing for a chat template's
per-message framing (ChatML: ``<|im_start|>``, the role, a newline, ``<|im_end|>``); the generation
header is not counted. Per episode: *total* = sum over rounds of the prompt tokens of that round,
*peak* = the largest prompt of any round. Ratios are memory / full over all episodes' sums (totals)
and over the means (peaks).

Recorded in each benchmark's extra_info (and printed as a markdown table): rounds, oracle score
under both policies, mean total and peak prompt tokens per episode under both, the ratios, and the
mean size in tokens of the final `<mem>` block, of a search result and of the first prompt
(system + question). The timed unit (one pass of both policies over the 20 episodes, counting
included) is not the point; nothing is asserted about speed.
"""
from __future__ import annotations

import os
import sys
import time
from statistics import mean
from typing import Optional

import pytest

from mempo.synthetic.oracle import run_oracle
from mempo.env.bm25 import BM25Retriever
from mempo.env.tools import make_tools
from mempo.synthetic.world import World
from mempo.protocol.grammar import parse_round

OBJECTIVES = (2, 4, 6, 8, 10)
NUM_EPISODES = int(os.environ.get("MEMPO_BENCH_TOKEN_EPISODES", "20"))
NUM_DOCUMENTS = int(os.environ.get("MEMPO_BENCH_TOKEN_DOCS", "20000"))
VOCAB_SIZE = 8192
PER_MESSAGE_OVERHEAD = 4
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(texts):
    """Byte-level BPE (Qwen2-style pre-split) trained on `texts`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


class TokenCounter:
    """Content tokens of strings, cached (prompts repeat the same messages round after round)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[str, int] = {}

    def text(self, text: str) -> int:
        count = self.cache.get(text)
        if count is None:
            count = self.cache[text] = len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return count

    def prompt(self, messages) -> int:
        return sum(self.text(m["content"]) + PER_MESSAGE_OVERHEAD for m in messages)


class Setup:
    """World, retriever, tools and tokenizer, built once."""

    def __init__(self, num_documents: int = NUM_DOCUMENTS):
        started = time.perf_counter()
        self.world = World.generate(seed=0, num_documents=num_documents)
        documents = list(self.world.documents())
        self.retriever = BM25Retriever.build(documents)
        self.tools = make_tools(self.retriever)
        self.episodes = {k: self.world.episodes(k, NUM_EPISODES, seed=k) for k in OBJECTIVES}
        prompts = [e.prompt for episodes in self.episodes.values() for e in episodes]
        self.counter = TokenCounter(train_tokenizer([d.title + "\n" + d.text for d in documents] + prompts))
        self.setup_s = time.perf_counter() - started

    def close(self) -> None:
        self.retriever.close()


def measure(setup: Setup, k: int) -> dict:
    """Run the oracle on the k-objective episodes under both policies and count prompt tokens."""
    counter = setup.counter
    per_policy = {}
    for policy in ("memory", "full"):
        totals, peaks, scores, rounds, mem_tokens, tool_tokens, first_prompts = [], [], [], [], [], [], []
        for episode in setup.episodes[k]:
            trajectory = run_oracle(episode, setup.tools, policy=policy)
            prompt_tokens = [counter.prompt(r.messages) for r in trajectory.rounds]
            totals.append(sum(prompt_tokens))
            peaks.append(max(prompt_tokens))
            scores.append(trajectory.score["score"])
            rounds.append(trajectory.num_rounds)
            mem_tokens.append(counter.text(parse_round(trajectory.rounds[-1].assistant).mem or ""))
            tool_tokens.extend(counter.text(r.tool_text) for r in trajectory.rounds if r.tool_text is not None)
            first_prompts.append(prompt_tokens[0])
        per_policy[policy] = {"totals": totals, "peaks": peaks, "scores": scores, "rounds": rounds,
                              "mem_tokens": mem_tokens, "tool_tokens": tool_tokens, "first_prompts": first_prompts}
    memory, full = per_policy["memory"], per_policy["full"]
    return {
        "objectives": k,
        "episodes": len(setup.episodes[k]),
        "rounds_mean": round(mean(memory["rounds"]), 2),
        "same_rounds_both_policies": memory["rounds"] == full["rounds"],
        "score_memory": round(mean(memory["scores"]), 4),
        "score_full": round(mean(full["scores"]), 4),
        "total_tokens_memory": round(mean(memory["totals"])),
        "total_tokens_full": round(mean(full["totals"])),
        "total_ratio": round(sum(memory["totals"]) / sum(full["totals"]), 4),
        "peak_tokens_memory": round(mean(memory["peaks"])),
        "peak_tokens_full": round(mean(full["peaks"])),
        "peak_ratio": round(mean(memory["peaks"]) / mean(full["peaks"]), 4),
        "final_mem_tokens": round(mean(memory["mem_tokens"])),
        "search_result_tokens": round(mean(memory["tool_tokens"])),
        "first_prompt_tokens": round(mean(memory["first_prompts"])),
    }


def markdown_table(rows: list[dict]) -> str:
    lines = ["| objectives | rounds (mean) | score memory / full | total prompt tokens per episode: memory / full "
             "| total ratio | peak prompt tokens: memory / full | peak ratio | final `<mem>` tokens "
             "| search result tokens | first prompt tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['objectives']} | {row['rounds_mean']} | {row['score_memory']:.2f} / {row['score_full']:.2f} "
            f"| {row['total_tokens_memory']:,} / {row['total_tokens_full']:,} | **{row['total_ratio']:.3f}** "
            f"| {row['peak_tokens_memory']:,} / {row['peak_tokens_full']:,} | {row['peak_ratio']:.3f} "
            f"| {row['final_mem_tokens']} | {row['search_result_tokens']:,} | {row['first_prompt_tokens']} |")
    return "\n".join(lines)


_ROWS: dict[int, dict] = {}


@pytest.fixture(scope="module")
def setup():
    built = Setup()
    yield built
    built.close()
    if _ROWS:
        print("\n" + markdown_table([_ROWS[k] for k in sorted(_ROWS)]))


def _machine() -> dict:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "num_documents": NUM_DOCUMENTS,
            "vocab_size": VOCAB_SIZE, "per_message_overhead": PER_MESSAGE_OVERHEAD}


@pytest.mark.parametrize("k", OBJECTIVES)
def test_token_economy(benchmark, setup, k):
    row: Optional[dict] = benchmark.pedantic(lambda: measure(setup, k), rounds=1, iterations=1)
    _ROWS[k] = row
    benchmark.extra_info.update({**_machine(), **row, "setup_s": round(setup.setup_s, 1)})


if __name__ == "__main__":
    built = Setup()
    print(f"setup (world, BM25, tokenizer): {built.setup_s:.1f} s")
    rows = []
    for objectives in OBJECTIVES:
        started = time.perf_counter()
        rows.append(measure(built, objectives))
        print(f"k={objectives}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    built.close()
    print(markdown_table(rows))
