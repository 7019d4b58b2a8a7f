"""mempo.synthetic.copy_warmup: the copy task is learned; bad arguments are refused."""
import math

import pytest
import torch

from mempo.model.builtin import tiny_model, train_tokenizer
from mempo.synthetic.copy_warmup import copy_records, copy_warmup


def test_copy_warmup_teaches_copying():
    tokenizer = train_tokenizer(["alpha beta gamma delta " * 20], vocab_size=300)
    model = tiny_model(tokenizer, "tiny", seed=0, hidden_size=64, num_hidden_layers=2)
    pool = list(range(40, 80))
    torch.manual_seed(0)
    result = copy_warmup(model, pool, steps=120, lr=3e-3, rows=16, min_len=6, max_len=6, seed=0)
    assert result.steps == 120 and len(result.losses) == 120
    assert math.isfinite(result.last_loss)
    # a fixed length: copying by position is learned within the run (chance is ln 40 = 3.7 nats)
    assert sum(result.losses[:10]) / 10 > 3.0 and sum(result.losses[-10:]) / 10 < 1.5, result.losses[::10]
    with pytest.raises(ValueError, match="at least 2 distinct"):
        copy_warmup(model, [5], steps=1)
    with pytest.raises(ValueError, match="token ids must be in"):
        copy_warmup(model, [1, 10 ** 6], steps=1)
    with pytest.raises(ValueError, match="min_len"):
        copy_warmup(model, pool, steps=1, min_len=5, max_len=4)


def test_copy_records_repeat_random_name_sequences():
    names = ["Vefa", "Kido", "Sufun", "Tamor"]
    records = copy_records(names, 50, seed=3, system_prompt="Be brief.", min_len=2, max_len=5)
    assert len(records) == 50 and records == copy_records(names, 50, seed=3, system_prompt="Be brief.",
                                                          min_len=2, max_len=5)
    assert records != copy_records(names, 50, seed=4, system_prompt="Be brief.", min_len=2, max_len=5)
    lengths = set()
    for record in records:
        system, user, assistant = record["messages"]
        assert system == {"role": "system", "content": "Be brief."}
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert user["content"] == "Repeat: " + assistant["content"]
        words = assistant["content"].split(" ")
        assert set(words) <= set(names)
        lengths.add(len(words))
    assert lengths == {2, 3, 4, 5}
    assert copy_records(names, 0) == []
    with pytest.raises(ValueError, match="copy_records"):
        copy_records([], 3)
    with pytest.raises(ValueError, match="copy_records"):
        copy_records(names, 3, min_len=4, max_len=2)


def test_copy_warmup_until_loss_stops_where_a_longer_run_passes_the_target():
    tokenizer = train_tokenizer(["alpha beta gamma delta " * 20], vocab_size=300)
    pool = list(range(40, 80))

    def run(**kwargs):
        model = tiny_model(tokenizer, "tiny", seed=0, hidden_size=64, num_hidden_layers=2)
        return model, copy_warmup(model, pool, lr=3e-3, rows=16, min_len=6, max_len=6, seed=0, **kwargs)

    _, full = run(steps=120)
    target = 1.5
    # the first step at which the mean of the last 10 losses of the full run is at most the target
    first = next(i + 1 for i in range(9, 120) if sum(full.losses[i - 9:i + 1]) / 10 <= target)
    assert first < 120
    model, stopped = run(steps=120, until_loss=target, window=10)
    assert stopped.reached_loss is True and stopped.steps == first == len(stopped.losses)
    assert stopped.losses == full.losses[:first]  # the same run, cut where the target is met
    _, short = run(steps=first - 1, until_loss=target, window=10)
    assert short.reached_loss is False and short.steps == first - 1
    assert full.reached_loss is None
    with pytest.raises(ValueError, match="until_loss"):
        copy_warmup(model, pool, steps=1, until_loss=0.0)
    with pytest.raises(ValueError, match="window"):
        copy_warmup(model, pool, steps=1, until_loss=1.0, window=0)
