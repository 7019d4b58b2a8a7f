"""A copy warm-up for a model trained from scratch: next-token loss on ``s + s`` for random id
sequences ``s``, which makes the model learn to copy from its context (an induction head) before
it learns an agent's turns, most of which are copies (names from the question into a query, a
found fact into ``<mem>``, the ``<mem>`` into the next one and into the answer).

Conventions
-----------
* Rows: ``rows`` sequences a step, all of one length ``L`` drawn uniformly from
  ``[min_len, max_len]`` (a varying length, so the copy cannot be learned by position alone), each
  ``s`` of ``L`` ids drawn uniformly with replacement from ``token_ids``; the input is ``s + s``
  (``2L`` ids) and the loss the mean cross-entropy of the second half's ids (positions ``L-1 ..
  2L-2`` predict ids ``L .. 2L-1``); the first half cannot be predicted and is not trained on.
* Optimiser: AdamW (``lr``, no weight decay), linear warm-up of the learning rate over the first
  ``warmup_steps`` steps, constant after, grad-norm clip ``grad_clip``. The learning rate decides
  whether the copy head forms at all (measurements: ``docs/experiments/D01-learnable-task.md``,
  ``docs/experiments/T01-copy-warmup-2000.md``).
* Randomness: ``random.Random(f"mempo-copy-warmup/{seed}")`` draws every row, so a run is a pure
  function of (model, token_ids, arguments).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

__all__ = ["CopyWarmup", "LOSS_WINDOW", "copy_records", "copy_warmup"]

#: Steps whose mean copy loss `until_loss` is compared with.
LOSS_WINDOW = 50


@dataclass
class CopyWarmup:
    """`copy_warmup`'s result: steps done, wall seconds, the loss per step (``losses[i]``: step
    i's mean cross-entropy in nats, a float) and its first / last values; ``reached_loss``: True when
    ``until_loss`` ended the warm-up, False when it was given and the steps ran out first, None
    without it."""

    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    reached_loss: Optional[bool] = None

    @property
    def first_loss(self) -> float:
        return self.losses[0] if self.losses else float("nan")

    @property
    def last_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


def copy_warmup(model: Any, token_ids: Sequence[int], *, steps: int, lr: float = 1e-3, rows: int = 32,
                min_len: int = 8, max_len: int = 24, warmup_steps: int = 50, grad_clip: float = 1.0,
                seed: int = 0, until_loss: Optional[float] = None, window: int = LOSS_WINDOW) -> CopyWarmup:
    """Train `model` (a causal LM: ``model(input_ids=[rows, T]).logits`` is ``[rows, T, V]``) in place
    on the copy task for `steps` steps: each step ``rows`` rows ``s + s``, ``s`` of one length drawn
    from ``[min_len, max_len]``, the loss on the second half only; returns a `CopyWarmup`.

    token_ids: the ids the sequences are drawn from (e.g. the ids of the names a world uses), at
    least 2 distinct; an id listed n times is drawn n times as often (the ledger weights its digits).
    until_loss: stop once the mean loss of the last `window` steps is at most this (the copy head has
    formed); `steps` is then the most. A run that stops there is the same as the first steps of a
    longer one (the rows and the schedule do not depend on `steps`).
    ValueError on an empty pool, steps < 0, lengths out of order, until_loss <= 0 or window < 1."""
    pool = sorted(int(t) for t in token_ids)
    if len(set(pool)) < 2:
        raise ValueError(f"copy_warmup needs at least 2 distinct token ids, got {len(set(pool))}")
    if steps < 0 or rows < 1 or not 1 <= min_len <= max_len or lr <= 0:
        raise ValueError(f"copy_warmup: need steps >= 0, rows >= 1, 1 <= min_len <= max_len and lr > 0; got "
                         f"steps={steps}, rows={rows}, min_len={min_len}, max_len={max_len}, lr={lr}")
    if until_loss is not None and (not until_loss > 0 or window < 1):
        raise ValueError(f"copy_warmup: need until_loss > 0 and window >= 1; got until_loss={until_loss}, "
                         f"window={window}")
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if pool[-1] >= vocab or pool[0] < 0:
        raise ValueError(f"copy_warmup: token ids must be in [0, {vocab}), got {pool[0]}..{pool[-1]}")
    rng = random.Random(f"mempo-copy-warmup/{seed}")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    was_training = model.training
    model.train()
    losses: list[float] = []
    reached = None if until_loss is None else False
    began = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:  # linear warm-up, then constant
            group["lr"] = lr * min(1.0, (step + 1) / max(1, warmup_steps))
        length = rng.randint(min_len, max_len)
        halves = [[rng.choice(pool) for _ in range(length)] for _ in range(rows)]
        ids = torch.tensor([h + h for h in halves], device=device)
        logits = model(input_ids=ids).logits
        # positions L-1 .. 2L-2 predict the second half, ids L .. 2L-1
        loss = torch.nn.functional.cross_entropy(logits[:, length - 1:-1].float().reshape(-1, logits.shape[-1]),
                                                 ids[:, length:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
        if until_loss is not None and len(losses) >= window and sum(losses[-window:]) / window <= until_loss:
            reached = True
            break
    model.train(was_training)
    return CopyWarmup(steps=len(losses), seconds=time.perf_counter() - began, losses=losses, reached_loss=reached)


def copy_records(names: Sequence[str], count: int, *, seed: int = 0, system_prompt: str = "", min_len: int = 8,
                 max_len: int = 24) -> list[dict]:
    """`count` chat records of the copy task for SFT: the user message ``"Repeat: " + s``, the assistant
    message ``s``, for ``s`` a random sequence of `names` (length uniform in ``[min_len, max_len]``,
    drawn with replacement, space-separated) after a system message `system_prompt`. Mixed into SFT
    they keep training every name (as input and as target, the held-out ones too: a name carries no
    fact) and the copy skill: a name SFT never shows otherwise drifts under the optimiser.
    Randomness: ``random.Random(f"mempo-copy-records/{seed}")``. ValueError on an empty `names`."""
    pool = sorted(set(names))
    if not pool or count < 0 or not 1 <= min_len <= max_len:
        raise ValueError(f"copy_records needs names, count >= 0 and 1 <= min_len <= max_len; got {len(pool)} names, "
                         f"count={count}, min_len={min_len}, max_len={max_len}")
    rng = random.Random(f"mempo-copy-records/{seed}")
    records = []
    for _ in range(count):
        text = " ".join(rng.choice(pool) for _ in range(rng.randint(min_len, max_len)))
        records.append({"messages": [{"role": "system", "content": system_prompt},
                                     {"role": "user", "content": "Repeat: " + text},
                                     {"role": "assistant", "content": text}]})
    return records
