"""Stand-ins for what the verl agent-loop tests cannot run on CPU: the inference server and TransferQueue.

* `HFServer`: verl's ``LLMServerClient.generate(request_id, *, prompt_ids, sampling_params)`` over a
  Hugging Face causal LM (tiny random Qwen2), token ids in and out, returning verl's `TokenOutput`.
  It honours ``max_tokens``, ``stop_token_ids`` (the stop id is kept, as vLLM keeps it),
  ``temperature`` (0: greedy), ``logprobs`` (the sampled ids' log-probs at the sampling temperature,
  verl's ``logprobs_mode: processed_logprobs``) and ``prompt_logprobs=0`` (from the raw logits, as
  vLLM computes prompt log-probs) in verl's layout (vLLM's
  ``extract_prompt_logprobs``: one row per prompt id, row k = [log p(prompt[k+1] | prompt[:k+1])],
  the last a dummy [0.0]; ``extra_fields["prompt_ids"]`` the matching ids). ``script(request_id,
  prompt_ids)`` may return the ids a policy "generates" instead of sampling (still cut by
  max_tokens and stop ids). Every request is recorded (``requests``).
* `FakeTQ`: the two TransferQueue calls the V1 trainer makes, over a dict of rows (1-D tensors come
  back as jagged nested tensors, other values as a NonTensorStack, as verl's trainer reads them).
* `verl_config(...)`: verl 0.9.1's full default trainer config (its generated YAML) with test lengths
  and ``trainer.v1.trainer_mode=mempo_sync``.
* `dummy_worker(...)`: an `AgentLoopWorker` without Ray (``object.__new__``), as verl's own CPU tests
  build one, so its real ``generate_sequences`` / ``_agent_loop_postprocess`` / ``_postprocess`` run;
  its reward loop is verl's real `RewardLoopWorker` behind `RewardHandle` (the actor-handle call
  ``handle.compute_score.remote(data)``), or none (``reward=False``: a colocated reward model, whose
  scores the trainer writes later).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch


class HFServer:
    def __init__(self, model, *, script: Optional[Callable[[str, list[int]], Optional[list[int]]]] = None,
                 seed: int = 0) -> None:
        self.model = model
        self.script = script
        self.seed = seed
        self.requests: list[dict] = []

    @torch.no_grad()
    def _prompt_logprobs(self, prompt_ids: list[int]) -> tuple[list[list[float]], list[list[int]]]:
        logits = self.model(input_ids=torch.tensor([prompt_ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(prompt_ids[1:])
        rows = logp[:-1].gather(1, targets[:, None])[:, 0].tolist()
        return [[v] for v in rows] + [[0.0]], [[t] for t in prompt_ids[1:]] + [[0]]

    @torch.no_grad()
    def _sample(self, request_id: str, prompt_ids: list[int], max_tokens: int, stops: set, temperature: float):
        generator = torch.Generator().manual_seed(self.seed + len(self.requests))
        out = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        past, ids = out.past_key_values, []
        for _ in range(max_tokens):
            logits = out.logits[0, -1].float()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                token = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))
            ids.append(token)
            if token in stops:
                break
            out = self.model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
        return ids

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       **kwargs):
        with torch.no_grad():
            return self._generate(request_id, list(prompt_ids), dict(sampling_params))

    def _generate(self, request_id: str, prompt_ids: list[int], params: dict):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": params})
        if params.get("top_p", 1.0) != 1.0 or params.get("top_k", -1) not in (-1, 0):
            raise NotImplementedError("the stand-in server samples with temperature only")
        max_tokens = int(params.get("max_tokens", 1))
        assert max_tokens >= 1
        stops = set(int(t) for t in params.get("stop_token_ids") or ())
        extra = {}
        if params.get("prompt_logprobs") is not None:
            extra["prompt_logprobs"], extra["prompt_ids"] = self._prompt_logprobs(list(prompt_ids))
        scripted = self.script(request_id, list(prompt_ids)) if self.script and "prompt_logprobs" not in params \
            else None
        if scripted is not None:
            ids = []
            for token in scripted[:max_tokens]:
                ids.append(int(token))
                if token in stops:
                    break
        else:
            ids = self._sample(request_id, list(prompt_ids), max_tokens, stops, float(params.get("temperature", 1.0)))
        log_probs = None
        if params.get("logprobs"):  # the returned ids' log-probs under the sampling temperature, as vLLM reports
            full = list(prompt_ids) + ids  # them with verl's logprobs_mode "processed_logprobs" (0: the raw ones)
            temperature = float(params.get("temperature", 1.0)) or 1.0
            logp = torch.log_softmax(self.model(input_ids=torch.tensor([full])).logits[0].float() / temperature, -1)
            start = len(prompt_ids)
            log_probs = [float(logp[start - 1 + j, t]) for j, t in enumerate(ids)]
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed", extra_fields=extra)


class FakeTQ:
    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def put_rows(self, keys: list[str], rows: list[dict]) -> None:
        for key, row in zip(keys, rows):
            self.rows[key] = dict(row)

    def kv_batch_get(self, keys, partition_id=None, select_fields=None):
        from tensordict import TensorDict
        from tensordict.tensorclass import NonTensorStack

        fields = {}
        for name in select_fields:
            values = [self.rows[k][name] for k in keys if name in self.rows[k]]
            if not values:
                continue  # a field no row has is left out (verl's trainer checks `in`)
            if len(values) != len(keys):
                raise ValueError(f"field {name!r} is empty for some keys")  # what TransferQueue raises
            if all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in values):
                fields[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                fields[name] = NonTensorStack(*values)
        return TensorDict(fields, batch_size=[len(keys)])

    async def async_kv_batch_put(self, keys, fields=None, tags=None, partition_id=None):
        """What `AgentLoopWorkerTQ._agent_loop_postprocess` calls: one row per key from a TensorDict."""
        for i, key in enumerate(keys):
            row = {}
            for name in fields.keys():
                value = fields.get(name)
                if isinstance(value, torch.Tensor):
                    row[name] = value.unbind()[i] if value.is_nested else value[i]
                else:
                    row[name] = fields[name][i]
            self.rows[key] = row
        self.tags = dict(getattr(self, "tags", {}), **dict(zip(keys, tags or [{}] * len(keys))))

    def kv_batch_put(self, keys, partition_id=None, fields=None, tags=None):
        from transfer_queue import KVBatchMeta

        for i, key in enumerate(keys):
            for name, value in fields.items():
                self.rows[key][name] = value[i] if not value.is_nested else value.unbind()[i]
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)


def verl_config(agents_yaml: Path, *, prompt_length: int, response_length: int, n: int = 4,
                trainer_mode: str = "mempo_sync"):
    from omegaconf import OmegaConf, open_dict
    import verl

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    with open_dict(config):
        rollout = config.actor_rollout_ref.rollout
        rollout.name = "vllm"  # mandatory ("???"); no server is started in these tests
        rollout.prompt_length, rollout.response_length, rollout.n = prompt_length, response_length, n
        rollout.max_model_len = prompt_length + response_length
        rollout.agent.agent_loop_config_path = str(agents_yaml)
        rollout.agent.default_agent_loop = "mempo_agent"
        config.data.max_prompt_length, config.data.max_response_length = prompt_length, response_length
        config.algorithm.adv_estimator = "grpo"
        config.trainer.v1.trainer_mode = trainer_mode  # the trainer that reads the mempo loops' rows
    return config


class RewardHandle:
    """verl's `RewardLoopWorker` (built from the run's config, one per event loop: its reward manager
    binds the loop it was built in) behind the Ray actor-handle call the agent-loop worker makes,
    ``await handle.compute_score.remote(data)``. ``calls``: how many trajectories it scored."""

    def __init__(self, config) -> None:
        import types

        self.config = config
        self.calls = 0
        self._workers: dict = {}
        self.compute_score = types.SimpleNamespace(remote=self._compute_score)

    async def _compute_score(self, data):
        import asyncio

        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        loop = asyncio.get_running_loop()
        if loop not in self._workers:
            self._workers[loop] = RewardLoopWorker(self.config)
        self.calls += 1
        return await self._workers[loop].compute_score(data)


def dummy_worker(config, tokenizer, server, *, reward: bool = True):
    """An `AgentLoopWorker` with the attributes its real methods read, built without Ray or a model;
    with `reward`, verl's reward loop through `RewardHandle` (the tokenizer is saved to a temporary
    folder, ``actor_rollout_ref.model.tokenizer_path``, which the reward worker loads)."""
    import atexit
    import shutil
    import tempfile

    from omegaconf import OmegaConf, open_dict
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import RLHFDataset

    worker = object.__new__(AgentLoopWorker)
    worker.config = config
    worker.llm_client = server
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    if reward:
        folder = tempfile.mkdtemp(prefix="verl_tok_")
        atexit.register(shutil.rmtree, folder, True)
        tokenizer.save_pretrained(folder)
        with open_dict(config):
            config.actor_rollout_ref.model.tokenizer_path = folder
        worker.reward_loop_worker_handles = [RewardHandle(config)]
    worker.rollout_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    worker.dataset_cls = RLHFDataset
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = "qwen2"
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    multi_turn = config.actor_rollout_ref.rollout.multi_turn  # verl's tools, loaded as AgentLoopWorker does
    worker.tools = load_all_tools(tool_config_path=multi_turn.tool_config_path,
                                  function_tool_path=multi_turn.function_tool_path)
    for entry in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        _agent_loop_registry[entry.name] = entry  # what AgentLoopWorker.__init__ does with the YAML
    return worker


def needle_script(tokenizer, first_variant: int = 0) -> Callable[[str, list[int]], list[int]]:
    """A scripted policy over the needle corpus (`support.rollout_fixtures.needle_scripts`): the k-th
    generation request of a trajectory (its request id) gets round k; trajectories take the four
    variants (correct or not, one or two searches) in turn, so a group has distinct memories and
    outcomes (``first_variant``: the variant of the first trajectory; 2 and 3 search twice)."""
    import itertools
    import re

    from support.rollout_fixtures import needle_scripts

    rounds: dict[str, int] = {}
    variants: dict[str, int] = {}
    turn = itertools.count(first_variant)

    def script(request_id: str, prompt_ids: list[int]) -> list[int]:
        k = rounds.get(request_id, 0)
        rounds[request_id] = k + 1
        variant = variants.setdefault(request_id, next(turn) % 4)
        needle = int(re.search(r"zebulon(\d+)", tokenizer.decode(prompt_ids)).group(1))
        texts = needle_scripts(needle, correct=variant % 2 == 0, extra_search=variant >= 2)
        return tokenizer.encode(texts[min(k, len(texts) - 1)], add_special_tokens=False)

    return script


def rounds_script(tokenizer, variants: list[list[str]]) -> Callable[[str, list[int]], list[int]]:
    """A scripted policy: trajectory i (in the order of its first request id) takes ``variants[i %
    len(variants)]``, its k-th generation request round k of it (the last round repeated)."""
    import itertools

    rounds: dict[str, int] = {}
    chosen: dict[str, int] = {}
    turn = itertools.count()

    def script(request_id: str, prompt_ids: list[int]) -> list[int]:
        k = rounds.get(request_id, 0)
        rounds[request_id] = k + 1
        texts = variants[chosen.setdefault(request_id, next(turn) % len(variants))]
        return tokenizer.encode(texts[min(k, len(texts) - 1)], add_special_tokens=False)

    return script


def write_agents_yaml(path: Path, corpus: Optional[Path], *, rollout: str = "", scoring: str = "{threshold: null}",
                      options: str = "", env: Optional[str] = None, max_turns: int = 4,
                      max_new_tokens: int = 64, eval_rollout: str = "") -> Path:
    """An agent-loop YAML like the shipped one, over an in-process BM25 index of `corpus` (`options`:
    more top-level keys of the ``mempo_agent`` entry, YAML lines; `env`: the entries' env section
    instead, a YAML flow mapping; max_turns / max_new_tokens: the entries' round limits;
    `eval_rollout`: more rollout keys of the ``mempo_agent_eval`` entry)."""
    env = env or f"{{retriever: bm25, corpus_path: {corpus}, topk: 2, doc_chars: 120}}"
    base = f"max_turns: {max_turns}, max_new_tokens_per_round: {max_new_tokens}, chat_template: builtin"
    path.write_text(
        f"- name: mempo_agent\n  _target_: mempo.integrations.verl.agent_loop.MemPOAgentLoop\n"
        f"  rollout: {{{base}{', ' + rollout if rollout else ''}}}\n  env: {env}\n  scoring: {scoring}\n"
        + "".join(f"  {line}\n" for line in options.splitlines()) +
        f"- name: mempo_agent_eval\n  _target_: mempo.integrations.verl.agent_loop.MemPOEvalAgentLoop\n"
        f"  rollout: {{{base}, context_policy: memory{', ' + eval_rollout if eval_rollout else ''}}}\n"
        f"  env: {env}\n")
    return path


def question_batch(question: str, golds, n: int, agent_name: str = "mempo_agent", uid: str = "q0",
                   system: Optional[str] = None, extra_info: Optional[dict] = None, tools_kwargs=None):
    """A verl `DataProto` of one question repeated n times (what the trainer hands the agent-loop
    workers: raw_prompt, reward_model.ground_truth, uid, agent_name, ...), extra_info.row = the row
    (`extra_info`: more of its fields); `system`: a system message before the question;
    `tools_kwargs`: the per-sample tool options verl's dataset reads from extra_info."""
    import numpy as np
    from verl import DataProto

    def column(values):
        array = np.empty(n, dtype=object)
        array[:] = values
        return array

    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": question}]
    extra = {"tools_kwargs": column([tools_kwargs] * n)} if tools_kwargs is not None else {}
    return DataProto.from_dict(non_tensors={
        **extra, "raw_prompt": column([list(messages) for _ in range(n)]),
        "reward_model": column([{"ground_truth": golds, "style": "rule"} for _ in range(n)]),
        "uid": column([uid] * n), "agent_name": column([agent_name] * n), "data_source": column(["needle"] * n),
        "extra_info": column([{"row": i, **(extra_info or {})} for i in range(n)]),
        "index": np.zeros(n, dtype=np.int64)})


def run_worker(worker, batch):
    """verl's own `AgentLoopWorker.generate_sequences` on the dummy worker: (DataProto, {row: (loop,
    output)}) with each mempo loop instance and what its ``run`` returned, by the row it ran for."""
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from mempo.integrations.verl.agent_loop import MemPOAgentLoop

    seen = {}
    original = MemPOAgentLoop.run

    async def recording(self, sampling_params, **kwargs):
        output = await original(self, sampling_params, **kwargs)
        seen[kwargs["extra_info"]["row"]] = (self, output)
        return output

    MemPOAgentLoop.run = recording
    try:
        data = asyncio.run(AgentLoopWorker.generate_sequences(worker, batch))
    finally:
        MemPOAgentLoop.run = original
    return data, seen
