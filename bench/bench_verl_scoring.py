"""The cost of teacher scoring under verl, measured on the CPU stand-in: requests, prefill tokens and
seconds per step, by kind of request.

One verl step here is one batch through verl 0.9.1's own `AgentLoopWorker.generate_sequences` (a
worker built without Ray, as the tests build it: tests/support/verl_standin.py) with the mempo loop
from an agent-loop YAML, against `HFServer`, an HF-backed stand-in of verl's inference server (a
random 2-layer, 64-wide Qwen2; a scripted oracle-like policy for well-formed rounds: one or two
searches, then an answer; in-process BM25 over the tests' 60-document corpus). Shape: 2 questions x
4 samples = 8 trajectories per step, teacher scoring on (``mempo_agent``), verl's default
``calculate_log_probs`` (so the forced ``<mem>`` ids' log-probs are requested too), context policies
"full" and "memory", and "full" with ``forced_logprobs: exclude`` (no forced-id requests).

Requests by kind (every one the loop sent, read off the stand-in's log):

* ``generate``: one per round (no ``prompt_logprobs``). Prefill tokens: the prompt's ids, and
  "uncached" the ids not already seen by the same trajectory's earlier requests (what an engine with
  prefix caching would compute: vLLM and SGLang both reuse the prefix of a generation request);
* ``scoring``: two per scored round (full_ctx + answer, mem_ctx + answer), ``prompt_logprobs=0``;
* ``forced``: the forced ids' log-probs, ``prompt_logprobs=0`` (one per trajectory under "full", one
  per round under "memory").
A ``prompt_logprobs`` request reuses no cached prefix in either engine (vLLM sets
``skip_reading_prefix_cache``; SGLang caps the radix match at ``logprob_start_len`` = 0), so all its
prompt ids are prefill. Seconds: time inside the stand-in server per kind (a tiny model on 2 CPU
cores: the shares, not the absolute numbers, carry over to a GPU engine).

Run: .venv/bin/python bench/bench_verl_scoring.py      (about a minute; prints a table and JSON)
"""
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.corpus import make_corpus  # noqa: E402
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2  # noqa: E402
from support.verl_standin import (HFServer, dummy_worker, needle_script, question_batch, run_worker,  # noqa: E402
                                  verl_config, write_agents_yaml)

QUESTIONS = [("Which document mentions zebulon3? Give its title.", ["Needle 3"]),
             ("Which document mentions zebulon7? Give its title.", ["Needle 7"])]
SAMPLES = 4
MACHINE = "this workplace's CPU machine: Intel Xeon (model 167), 2 cores, Python 3.11, torch 2.13 CPU"


class TimedServer(HFServer):
    """`HFServer` that records the seconds each request took and the ids it returned (``seconds``,
    ``outputs``, in request order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds, self.outputs = [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        began = time.perf_counter()
        output = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        self.seconds.append(time.perf_counter() - began)
        self.outputs.append(list(output.token_ids))
        return output


def _common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def measure(policy: str, tmp: Path, corpus: Path, tok, model, options: str = "") -> dict:
    """One step of 2 questions x SAMPLES trajectories: per kind, requests, prompt ids, uncached prefill
    ids, seconds; and the step's wall seconds (`options`: more keys of the mempo_agent entry)."""
    torch.manual_seed(0)
    rollout = "context_policy: memory" if policy == "memory" else ""
    agents = write_agents_yaml(tmp / f"agents_{policy}{len(options)}.yaml", corpus, rollout=rollout, options=options)
    config = verl_config(agents, prompt_length=512, response_length=1024, n=SAMPLES)
    server = TimedServer(model, script=needle_script(tok))
    forced_prefix = tok.encode("<mem>", add_special_tokens=False)
    began = time.perf_counter()
    trajectories = 0
    for i, (question, golds) in enumerate(QUESTIONS):
        if policy == "memory":  # one output per round needs verl's V1 path (session ids): run the loop directly
            from hydra.utils import instantiate
            from omegaconf import OmegaConf
            from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
            from verl.utils.dataset.rl_dataset import RLHFDataset

            async def run_all():
                loops = [instantiate(OmegaConf.load(agents)[0], trainer_config=DictConfigWrap(config),
                                     server_manager=server, tokenizer=tok, processor=None, hf_model_type="qwen2",
                                     dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                                     tools=ToolListWrap([])) for _ in range(SAMPLES)]
                sample = {"raw_prompt": [{"role": "user", "content": question}],
                          "reward_model": {"ground_truth": golds}, "uid": f"q{i}", "extra_info": {}}
                return await asyncio.gather(*(loop.run({"temperature": 1.0, "logprobs": True}, session_id=s,
                                                       global_steps=1, **sample) for s, loop in enumerate(loops)))
            asyncio.run(run_all())
        else:
            run_worker(dummy_worker(config, tok, server), question_batch(question, golds, SAMPLES, uid=f"q{i}"))
        trajectories += SAMPLES
    wall = time.perf_counter() - began
    kinds = defaultdict(lambda: {"requests": 0, "prompt_tokens": 0, "prefill_tokens": 0, "seconds": 0.0})
    seen: dict[str, list[list[int]]] = defaultdict(list)  # per trajectory (request id): ids already computed
    for request, seconds, output in zip(server.requests, server.seconds, server.outputs):
        ids, params = request["prompt_ids"], request["sampling_params"]
        if params.get("prompt_logprobs") is None:
            kind = "generate"
            cached = max((_common_prefix(ids, earlier) for earlier in seen[request["request_id"]]), default=0)
            seen[request["request_id"]].append(list(ids) + output)  # its prompt and output stay in the cache
            prefill = len(ids) - cached
        else:
            kind = "forced" if ids[-len(forced_prefix):] == forced_prefix else "scoring"
            prefill = len(ids)
        row = kinds[kind]
        row["requests"] += 1
        row["prompt_tokens"] += len(ids)
        row["prefill_tokens"] += prefill
        row["seconds"] += seconds
    return {"policy": policy + (f" ({options})" if options else ""), "trajectories": trajectories, "wall_seconds": wall,
            "kinds": {k: dict(v) for k, v in sorted(kinds.items())}}


def main() -> None:
    torch.set_num_threads(2)
    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok))
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        corpus = tmp / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(d.to_json()) + "\n" for d in make_corpus(60)))
        results = [measure(policy, tmp, corpus, tok, model) for policy in ("full", "memory")]
        results.append(measure("full", tmp, corpus, tok, model, options="forced_logprobs: exclude"))
    print(f"machine: {MACHINE}")
    print("| policy | kind | requests / traj. | prompt ids / traj. | prefill ids / traj. | s / step "
          "| share of server s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        n = result["trajectories"]
        total = sum(row["seconds"] for row in result["kinds"].values())
        for kind, row in result["kinds"].items():
            print(f"| {result['policy']} | {kind} | {row['requests'] / n:.2f} | {row['prompt_tokens'] / n:.0f} | "
                  f"{row['prefill_tokens'] / n:.0f} | {row['seconds']:.2f} | {row['seconds'] / total:.0%} |")
        print(f"| {result['policy']} | step wall | {n} trajectories | | | {result['wall_seconds']:.2f} | |")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
