"""`python -m mempo.apps.quickstart`: the numeric core of MemPO end to end on a toy batch, on a CPU.

1. trains a small byte-level BPE tokenizer (the tags are *not* special tokens) on protocol text;
2. tokenises a group of agent trajectories round by round (model tokens mask 1, tool tokens 0);
3. finds every `<mem>` span with the C++ scanner (`find_spans`);
4. teacher-scores the gold answer after full_ctx[r] and after mem_ctx[r] for every round r >= 2
   with a small randomly initialised Qwen2-architecture model (`mempo.scoring.score_reference`,
   fused from the hidden states; threshold None: with random weights no token would pass 0.5) and
   takes the memory rewards (`mempo.algo.memory_reward`);
5. computes the MemPO token advantages (`mempo_advantage`) and prints them per round.

The model is untrained, so the memory rewards are tiny; the point is the data flow and the shapes.
Needs the `test` extra (tokenizers, transformers). Runs in well under a minute on 2 cores.
"""
from __future__ import annotations

import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM

from mempo.algo.memory_reward import memory_rewards
from mempo.ops import find_spans, mempo_advantage
from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.scoring import score_reference

QUESTION = "Which river flows through the capital of Veloria?"
GOLD = "Amber River"
SYSTEM = "You are a research agent. Open every turn with <mem>, then <think>, then one action."
ANSWER_TEMPLATE = "<think>I know it now.</think><answer>{}</answer>"


def _trajectory(rng: random.Random, correct: bool) -> list[tuple[str, bool]]:
    """One trajectory as (text, is_model_text) segments: 3 rounds, tool results in between."""
    city = "Lumen" if rng.random() < 0.8 else "Lumenport"
    answer = GOLD if correct else rng.choice(["Lumen Canal", "Grey River"])
    return [
        ("<mem></mem><think>Find the capital first.</think><search>capital of Veloria</search>", True),
        (f"<information>Doc 1: The capital of Veloria is {city}.</information>", False),
        (f"<mem>Capital of Veloria: {city}.</mem><think>Now the river.</think><search>river {city}</search>", True),
        (f"<information>Doc 2: The {GOLD} flows through {city}.</information>", False),
        (f"<mem>Capital {city}; river {answer}.</mem><think>Done.</think><answer>{answer}</answer>", True),
    ]


def _tokenizer(corpus: list[str]):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


def _model(vocab_size: int):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    return Qwen2ForCausalLM(config).eval()


def main(group_size: int = 4, seed: int = 0) -> dict:
    rng = random.Random(seed)
    trajectories = [_trajectory(rng, correct=(i % 2 == 0)) for i in range(group_size)]
    corpus = [SYSTEM, QUESTION, GOLD] + [text for traj in trajectories for text, _ in traj] * 20
    tok = _tokenizer(corpus)
    prompt_ids = tok.encode(SYSTEM + "\n" + QUESTION + "\n").ids

    # Token-in/token-out: each segment is tokenised on its own and concatenated (never re-tokenised).
    responses, masks = [], []
    for traj in trajectories:
        ids, mask = [], []
        for text, is_model in traj:
            piece = tok.encode(text).ids
            ids += piece
            mask += [int(is_model)] * len(piece)
        responses.append(ids)
        masks.append(mask)
    spans = find_spans(responses, tok).select("mem")

    # Teacher scoring of every round r >= 2 (0-based round >= 1) with a closed <mem>.
    prefix, gold_text, suffix = ANSWER_TEMPLATE.partition("{}")
    answer_ids = tok.encode(prefix).ids + tok.encode(GOLD).ids + tok.encode(suffix).ids
    answer_mask = ([0] * len(tok.encode(prefix).ids) + [1] * len(tok.encode(GOLD).ids)
                   + [0] * len(tok.encode(suffix).ids))
    model = _model(tok.get_vocab_size())
    requests, round_rows, mem_spans, report = [], [], [], []
    for b, ids in enumerate(responses):
        rounds = []
        for span in spans.spans_of(b):
            if span.round < 1 or not span.closed:
                continue
            # full_ctx[r]: everything before the round's first token; mem_ctx[r]: prompt + round's <mem>.
            rounds.append(ScoredRound(full_end=len(prompt_ids) + span.start,
                                      mem_ctx_ids=prompt_ids + ids[span.start:span.end]))
            round_rows.append(b)
            mem_spans.append((span.start, span.end))
            report.append((b, span.round, rounds[-1].full_end, len(rounds[-1].mem_ctx_ids)))
        requests.append(ScoringRequest(prompt_ids + ids, rounds, answer_ids, answer_mask))
    results = score_reference(model, requests, threshold=None)
    mem_rewards = [reward for result in results for reward in memory_rewards(result)]
    p_values = [pair for result in results for pair in zip(result.p_full, result.p_mem)]  # round order, as report

    scores = torch.tensor([1.0 if i % 2 == 0 else 0.0 for i in range(group_size)])
    width = max(len(r) for r in responses)
    response_mask = torch.zeros(group_size, width, dtype=torch.long)
    for b, mask in enumerate(masks):
        response_mask[b, :len(mask)] = torch.tensor(mask)
    offsets = torch.zeros(group_size + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.bincount(torch.tensor(round_rows), minlength=group_size), 0)
    advantages, _ = mempo_advantage(scores, ["q0"] * group_size, response_mask, torch.tensor(mem_rewards), offsets,
                                    torch.tensor(mem_spans))

    print(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens (tags are not special tokens)")
    print(f"group of {group_size} trajectories, response lengths {[len(r) for r in responses]}")
    print("traj round  full_ctx  mem_ctx   P(full)     P(mem)      mem_reward  adv on <mem>  adv elsewhere")
    for (b, rnd, n_full, n_mem), (p_full, p_mem), (start, end) in zip(report, p_values, mem_spans):
        on_mem = float(advantages[b, start])
        off = float(advantages[b, masks[b].index(1)])
        print(f"{b:>4} {rnd + 1:>5} {n_full:>9} {n_mem:>8}  {p_full:.3e}  {p_mem:.3e}  {p_mem - p_full:+.3e}"
              f"  {on_mem:+.4f}      {off:+.4f}")
    tool_tokens = int((response_mask == 0).sum()) - sum(width - len(m) for m in masks)
    print(f"tool tokens carry advantage 0: {bool((advantages[response_mask == 0] == 0).all())} "
          f"({tool_tokens} tool tokens)")
    return {"advantages": advantages, "mem_rewards": mem_rewards, "spans": mem_spans}


if __name__ == "__main__":
    main()
