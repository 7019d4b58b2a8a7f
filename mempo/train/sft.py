"""SFT cold start on agent trajectories: next-token cross-entropy on the assistant tokens (and, with
``sft.prompt_loss_weight`` > 0, on the prompt tokens too) of every trajectory it is given, correct or
not: which are kept is the data's choice (``synthetic.oracle_keep``; the demo's ``all`` keeps the
teacher's failed episodes too).

Conventions: one training sequence per assistant turn, tokenised exactly as the rollout builds a
round; ids are int64, the loss mask bool (1 on assistant ids). Steps are optimiser steps; the data
position is (epoch, batch index), a pure function of the seed, so a resumed run ends where an
uninterrupted one does.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

import torch

from mempo.config import MempoConfig
from mempo.env.data import DataError
from mempo.model.adapter import SelectiveLogits
from mempo.protocol.memory import MEM_PREFIX
from mempo.rollout.chat import ChatFormat
from mempo.train.checkpoint import apply_optimizer_defaults, load_checkpoint, save_checkpoint
from mempo.train.metric_names import SFT_LOSS
from mempo.utils.jsonl import iter_jsonl_records

__all__ = ["SFTExample", "examples_from_trajectories", "load_sft_records", "run_sft"]


class SFTExample(NamedTuple):
    """One training sequence: ids, the 0/1 loss mask (1 on the trained assistant ids) and the 0/1
    mask of the ids the prompt's language-modelling loss (``sft.prompt_loss_weight``) may cover
    (None: every id outside the loss mask; 0 on an assistant message's untrained ``context``)."""

    input_ids: list[int]
    loss_mask: list[int]
    lm_mask: Optional[list[int]] = None


def _turns(record: Any) -> Iterable[tuple[list[dict], str, str]]:
    """``(messages before, untrained context, assistant text)`` per assistant turn of a trajectory
    (``episode_id`` and ``rounds`` of ``messages`` and ``assistant``, as
    `mempo.synthetic.oracle.OracleTrajectory` or its jsonl; context "") or of a chat record
    ``{"messages": [{"role", "content"}, ...]}`` (a user's jsonl), whose assistant message may carry a
    ``"context"`` string: text the turn starts with that is read, not trained (e.g. a ``<mem>``)."""
    if hasattr(record, "rounds") and hasattr(record, "episode_id"):  # OracleTrajectory
        for round_ in record.rounds:
            yield [dict(m) for m in round_.messages], "", round_.assistant
        return
    if isinstance(record, dict) and "rounds" in record and "episode_id" in record:
        for round_ in record["rounds"]:
            yield [dict(m) for m in round_["messages"]], "", round_["assistant"]
        return
    messages = record["messages"] if isinstance(record, dict) else record
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            yield ([dict(m) for m in messages[:i]], str(message.get("context", "")),
                   str(message.get("content", "")))


def examples_from_trajectories(records: Iterable[Any], tokenizer: Any, *,
                               chat_template: str = "auto") -> list[SFTExample]:
    """One `SFTExample` per assistant turn, built as the rollout builds a round (`ChatFormat` with
    `chat_template`, the template rollouts and evaluation use): ``prompt_ids(messages)`` (chat
    rendering with the generation prompt, no forced prefix) + the forced prefix ids (``<mem>``,
    encoded alone) + the ids of the assistant text after its leading ``<mem>`` (a turn not starting
    with ``<mem>`` is encoded whole after the prefix-less prompt). No end-of-turn token: rollout
    rounds end at the action's closing tag. ``loss_mask`` is 1 exactly on the assistant ids (prefix
    included, as the rollout trains the forced prefix by default), 0 on the prompt.

    A chat record's assistant ``context`` (`_turns`) comes first, encoded alone (after the forced
    prefix when it starts with ``<mem>``), then the content, encoded alone: as teacher scoring builds
    mem_ctx + answer (`mempo.algo.contexts`). The context ids are in neither loss: ``loss_mask`` and
    ``lm_mask`` are 0 there."""
    chat = ChatFormat(tokenizer, forced_prefix=MEM_PREFIX, template=chat_template)

    def encode_turn(text: str) -> list[int]:
        text_after = text.lstrip()
        if text_after.startswith(MEM_PREFIX):
            return list(chat.prefix_ids) + chat.encode(text_after[len(MEM_PREFIX):])
        return chat.encode(text)

    examples = []
    for record in records:
        for messages, context, assistant in _turns(record):
            prompt = chat.prompt_ids(messages)
            if context:
                read, own = encode_turn(context), chat.encode(assistant)
            else:
                read, own = [], encode_turn(assistant)
            if not own:
                continue
            lm_mask = None if not read else [1] * len(prompt) + [0] * (len(read) + len(own))
            examples.append(SFTExample(prompt + read + own, [0] * (len(prompt) + len(read)) + [1] * len(own), lm_mask))
    return examples


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
            and isinstance(m.get("context", ""), str) for m in messages):
        raise DataError(f"{where}: expected a list of {{'role': str, 'content': str}} messages "
                        "('context', when present, a str)")


def _check_record(obj: Any, number: int) -> Any:
    if isinstance(obj, dict) and "rounds" in obj and "episode_id" in obj:
        rounds = obj["rounds"]
        if not isinstance(rounds, list):
            raise DataError("'rounds' must be a list")
        for i, round_ in enumerate(rounds):
            if not isinstance(round_, dict) or not isinstance(round_.get("assistant"), str):
                raise DataError(f"rounds[{i}]: expected an object with 'messages' and an 'assistant' string")
            _check_messages(round_.get("messages"), f"rounds[{i}].messages")
        return obj
    if isinstance(obj, dict) and "messages" in obj:
        _check_messages(obj["messages"], "messages")
        return obj
    raise DataError("expected an oracle trajectory (episode_id, rounds) or a {'messages': [...]} object")


def load_sft_records(path: Union[str, Path]) -> list[Any]:
    """Records of a jsonl file: oracle trajectories or ``{"messages": [...]}`` chats (read with
    `mempo.utils.jsonl.iter_jsonl_records`). DataError naming the file (and the line) for a missing file,
    bad UTF-8 or JSON, a record of neither shape, and a file without any assistant turn."""
    records = list(iter_jsonl_records(path, _check_record, DataError, missing="SFT file not found"))
    if not records:
        raise DataError(f"{path}: no records (an empty file)")
    if not any(True for record in records for _ in _turns(record)):
        raise DataError(f"{path}: no assistant turns to train on (no message with role 'assistant')")
    return records


def _batches(order: Sequence[int], examples: Sequence[SFTExample], batch_tokens: int,
             rng: Optional[random.Random] = None, bucket: int = 32) -> list[list[int]]:
    """Consecutive sequences of `order` grouped into batches of at most `batch_tokens` padded tokens
    (rows x longest). With `rng`: length-bucketed, so a batch pads little."""
    if rng is not None and bucket > 1:  # length buckets: sort chunks of the shuffled order, shuffle the batches
        chunks = [sorted(order[i:i + bucket], key=lambda j: len(examples[j].input_ids))
                  for i in range(0, len(order), bucket)]
        batches = [b for chunk in chunks for b in _batches(chunk, examples, batch_tokens)]
        rng.shuffle(batches)
        return batches
    batches, current, longest = [], [], 0
    for i in order:
        n = len(examples[i].input_ids)
        if current and (len(current) + 1) * max(longest, n) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def _epoch_batches(examples: Sequence[SFTExample], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of epoch `epoch`, in training order: the shuffled order cut into chunks of 32
    sequences, each sorted by length, then the batches shuffled again; both shuffles use
    ``random.Random(f"mempo-sft/{seed}/{epoch}")``, so the batches are a pure function of
    (examples, batch_tokens, seed, epoch)."""
    rng = random.Random(f"mempo-sft/{seed}/{epoch}")
    order = list(range(len(examples)))
    rng.shuffle(order)
    return _batches(order, examples, batch_tokens, rng)


def _resume_position(state: Any, seed: int, num_examples: int) -> dict[str, Any]:
    """The data_state of an SFT checkpoint, checked against this run's data: a checkpoint of other
    data (another seed or number of training sequences) is a DataError."""
    data, extra = state.data_state, state.extra or {}
    if not isinstance(data, dict) or data.get("kind") != "sft":
        raise DataError(f"{state.path} is not an SFT checkpoint (its data_state is {data!r})")
    if extra.get("seed") != seed or extra.get("examples") != num_examples:
        raise DataError(f"{state.path} was saved with seed {extra.get('seed')} and {extra.get('examples')} training "
                         f"sequences; this run has seed {seed} and {num_examples}: resume with the same data, "
                         f"tokenizer and seed")
    return data


def run_sft(cfg: MempoConfig, model: Any, tokenizer: Any, trajectories: Sequence[Any], *, seed: int = 0,
            logger: Any = None, checkpoint_root: Union[str, Path, None] = None,
            resume_from: Union[str, Path, None] = None, max_steps: Optional[int] = None) -> dict[str, Any]:
    """Fine-tune `model` in place on the assistant tokens of `trajectories` with the settings of
    ``cfg``: the ``sft`` section (``steps``, ``epochs``, ``max_seconds``, ``lr``, ``batch_tokens``,
    ``schedule``, ``warmup``, ``prompt_loss_weight``), the ``actor`` optimiser fields,
    ``rollout.chat_template``, ``trainer.save_every`` / ``keep_last``.

    Loop: plain AdamW (``sft.lr``, ``actor.weight_decay``, betas from ``actor``), grad-norm clip
    ``actor.grad_clip``. ``steps`` (optimiser steps) or ``epochs`` bounds the run, and
    ``max_seconds`` (wall time) too when given: with ``steps`` or ``epochs`` set it is a safety net,
    and a run it cut says so (``time_bound``: the model then depends on the machine's speed).

    trajectories: trajectories or chat records (`_turns`); every assistant message is a target.
    seed: the data order's seed. logger: a `MetricsLogger` (``sft/loss`` per step).
    checkpoint_root: where checkpoints go (None: none; `mempo.train.checkpoint`, atomic): every
    ``trainer.save_every`` steps (0: none on the way) and at the end: model, optimiser (state and
    learning rate), RNG states, ``data_state = {"kind": "sft", "step", "epoch", "batch", "tokens",
    "seconds"}`` (the next batch to train and the totals so far), ``extra = {"seed", "examples"}``.
    resume_from: a checkpoint or a root (its latest); restores all of it (the optimiser's betas and
    weight_decay then set from ``actor`` again, the lr from the schedule) and continues: the
    schedule's position is the step (and, with ``max_seconds``, the wall time spent before, carried
    in ``seconds``); ``steps`` / ``epochs`` / ``max_seconds`` bound the whole run, not this call,
    so an interrupted run resumed with the same arguments ends with the same parameters as an
    uninterrupted one (exactly so unless a ``"cosine"`` schedule follows ``max_seconds``).
    max_steps: stop after this many steps in this call (an interruption, for
    tests; the schedule is unchanged). Returns {"losses": [...] (this call's), "first_loss",
    "last_loss", "steps" (total), "tokens" (total), "examples", "epochs", "seconds" (total),
    "time_bound" (True when ``max_seconds`` ended the run before ``steps`` / ``epochs`` did), "resumed_from"
    (the step, or None), "checkpoint" (the last one written, or None)}.
    """
    s = cfg.sft
    steps, epochs, lr, batch_tokens = s.steps, s.epochs, s.lr, s.batch_tokens
    max_seconds, schedule, warmup, prompt_loss_weight = s.max_seconds, s.schedule, s.warmup, s.prompt_loss_weight
    save_every, keep_last = cfg.trainer.save_every, cfg.trainer.keep_last

    examples = examples_from_trajectories(trajectories, tokenizer, chat_template=cfg.rollout.chat_template)
    if not examples:
        raise DataError("no assistant turns to train on (the SFT records hold no non-empty assistant message)")
    actor_cfg = cfg.actor
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr,
        betas=(actor_cfg.beta1, actor_cfg.beta2), weight_decay=actor_cfg.weight_decay)
    grad_clip = actor_cfg.grad_clip
    device = next(model.parameters()).device
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    step_limit = steps if steps is not None else math.inf
    max_epochs = epochs if epochs is not None else (math.inf if steps is not None else 1)
    # logits at the loss positions only (`mempo.model.adapter`: the output head on the selected rows
    # of the hidden states): projecting every prompt position would cost a layer of a small model
    lm = SelectiveLogits(model)
    if schedule == "cosine" and steps is None and max_seconds is None:
        per_epoch = len(_batches(list(range(len(examples))), examples, batch_tokens))
        total_for_schedule = max(1, int(per_epoch * max_epochs))
    else:
        total_for_schedule = steps

    step, epoch, batch_index, tokens, seconds_before, resumed_from = 0, 0, 0, 0, 0.0, None
    if resume_from is not None:
        state = load_checkpoint(resume_from, model, optimizer)
        apply_optimizer_defaults(optimizer)  # betas and weight_decay as configured now (lr: `lr_now` per step)
        position = _resume_position(state, seed, len(examples))
        step, epoch, batch_index = int(position["step"]), int(position["epoch"]), int(position["batch"])
        tokens, seconds_before, resumed_from = int(position["tokens"]), float(position["seconds"]), step
    began = time.perf_counter() - seconds_before  # the wall time of the whole run, across resumes
    last_step = min(step_limit, math.inf if max_steps is None else step + max_steps)  # of this call

    def progress_now() -> float:
        """The run's progress in [0, 1]: steps done / ``steps`` (or / the steps of ``epochs``);
        seconds spent / ``max_seconds`` only when neither is set, so a run bounded by steps has a
        schedule that does not depend on the machine's speed."""
        if total_for_schedule:  # steps (or epochs) bound the run: the time bound is a safety net only
            done = step / total_for_schedule
        elif max_seconds:
            done = (time.perf_counter() - began) / max_seconds
        else:
            done = 0.0
        return min(done, 1.0)

    def lr_now() -> float:
        """"constant": ``lr`` throughout. "cosine": linear warm-up over the first ``warmup`` fraction
        (at least 2% of ``lr``), then cosine decay from ``lr`` to ``lr / 10``."""
        if schedule == "constant":
            return lr
        done = progress_now()
        if warmup > 0 and done < warmup:
            return lr * max(done / warmup, 0.02)
        rest = (done - warmup) / max(1e-9, 1.0 - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(rest, 1.0))))

    def out_of_time() -> bool:
        return max_seconds is not None and time.perf_counter() - began >= max_seconds

    def save() -> Path:
        return save_checkpoint(
            checkpoint_root, step, model, optimizer, keep_last=keep_last,
            extra={"seed": seed, "examples": len(examples)},
            data_state={"kind": "sft", "step": step, "epoch": epoch, "batch": batch_index, "tokens": tokens,
                        "seconds": time.perf_counter() - began})

    losses: list[float] = []
    checkpoint, saved_step = None, resumed_from
    model.train()
    while step < last_step and epoch < max_epochs and not out_of_time():
        batches = _epoch_batches(examples, batch_tokens, seed, epoch)
        if epoch + 1 > max_epochs:  # fractional last epoch
            batches = batches[:max(1, int(len(batches) * (max_epochs - epoch)))]
        while batch_index < len(batches) and step < last_step and not out_of_time():
            rows = batches[batch_index]
            width = max(len(examples[i].input_ids) for i in rows)
            ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
            attention = torch.zeros_like(ids)
            mask = torch.zeros_like(ids, dtype=torch.bool)
            lm_ok = torch.zeros_like(ids, dtype=torch.bool)  # where the prompt loss may apply
            for r, i in enumerate(rows):
                n = len(examples[i].input_ids)
                ids[r, :n] = torch.tensor(examples[i].input_ids)
                attention[r, :n] = 1
                mask[r, :n] = torch.tensor(examples[i].loss_mask, dtype=torch.bool)
                lm_ok[r, :n] = (True if examples[i].lm_mask is None
                                else torch.tensor(examples[i].lm_mask, dtype=torch.bool))
            ids, attention, mask = ids.to(device), attention.to(device), mask.to(device)
            targets, target_mask = ids[:, 1:], mask[:, 1:]
            states = lm.states(ids, attention)[:, :-1]
            # mean token cross-entropy over the batch's assistant tokens; logits [n_masked, V]
            loss = torch.nn.functional.cross_entropy(lm.logits(states, target_mask), targets[target_mask])
            if prompt_loss_weight:
                context = attention[:, 1:].bool() & ~target_mask & lm_ok[:, 1:].to(device)
                if bool(context.any()):
                    loss = loss + float(prompt_loss_weight) * torch.nn.functional.cross_entropy(
                        lm.logits(states, context), targets[context])
            for group in optimizer.param_groups:
                group["lr"] = lr_now()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            step += 1
            batch_index += 1
            tokens += int(target_mask.sum())
            losses.append(float(loss.detach()))
            if logger is not None:
                logger.log(step, {SFT_LOSS: losses[-1], "sft/tokens": int(target_mask.sum()), "sft/epoch": epoch,
                                  "sft/lr": optimizer.param_groups[0]["lr"]})
            if checkpoint_root is not None and save_every and step % save_every == 0:
                checkpoint, saved_step = save(), step  # batch == len(batches) resumes at the next epoch
        if batch_index == len(batches):
            epoch, batch_index = epoch + 1, 0
    time_bound = out_of_time() and step < last_step and epoch < max_epochs  # stopped by max_seconds alone
    if checkpoint_root is not None and saved_step != step:
        checkpoint = save()
    model.eval()
    return {"losses": losses, "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "steps": step, "tokens": tokens, "examples": len(examples), "epochs": epoch + (1 if batch_index else 0),
            "seconds": time.perf_counter() - began, "time_bound": time_bound, "resumed_from": resumed_from,
            "checkpoint": checkpoint}
