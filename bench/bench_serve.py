"""Load benchmark of `mempo serve`: 1, 8 and 32 concurrent clients (the real `openai` client,
``AsyncOpenAI``, ``max_retries=0``) against the server as a separate process.

Run (after the demo, whose output holds a trained model and its configuration):

    nice -n 19 python bench/bench_serve.py --model demo_out/model_sft --config demo_out/config.yaml \\
        --out bench_serve_out

Without --model it serves a tiny random model (`mempo.model.builtin`) over a small synthetic world
(episodes of one malformed round: it measures the server, not an agent). Options: --clients (default
1 8 32), --requests (per client, default 2), --max-turns, --max-tokens (per request: rounds and
tokens per round; default the config's eval.max_turns / rollout.max_new_tokens_per_round), --threads
(the server's torch threads, default 1), and dotted config overrides for the server (``key=value``).

The questions are the configuration's evaluation episodes (`mempo.eval.eval_episodes`, k of
``eval.objectives[0]``), sent as the user message; every client sends its requests one after the
other, all clients at once. Measured per level: requests/s and rounds/s over the level's wall time,
latency p50 / p99 (client side, request to full answer), errors by class (0 expected), the mean
generation batch size (the server's ``/health`` counters: rounds generated / backend calls during the
level), and the server's resident memory (VmRSS of its process) after startup and after each level.
Writes ``<out>/results.json`` and ``<out>/results.md`` (the table for bench/RESULTS.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_OVERRIDES = ["synthetic.world_entities=30", "eval.objectives=[1]", "eval.max_turns=2",
                  "rollout.max_new_tokens_per_round=24"]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as response:
        return json.loads(response.read())


def _tiny_model_dir(path: Path, overrides: list[str]) -> Path:
    from mempo.config import load_config
    from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
    from mempo.synthetic.build import synthetic_world

    world = synthetic_world(load_config(None, overrides))
    tok = train_tokenizer(default_corpus_texts(world), vocab_size=768)
    tiny_model(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _questions(config: str | None, overrides: list[str], count: int) -> list[str]:
    from mempo.config import load_config
    from mempo.eval import eval_episodes
    from mempo.synthetic.build import synthetic_world

    cfg = load_config(config, overrides)
    k = cfg.eval.objectives[0]
    episodes = eval_episodes(synthetic_world(cfg), cfg, num_episodes=count, objectives=[k])[k]
    return [episode.prompt for episode in episodes]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


async def _level(url: str, model: str, questions: list[str], clients: int, per_client: int, extra: dict) -> dict:
    import openai

    latencies, errors, rounds = [], {}, 0
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=900) as client:
        async def one_client(c: int) -> None:
            nonlocal rounds
            for r in range(per_client):
                question = questions[(c * per_client + r) % len(questions)]
                began = time.perf_counter()
                try:
                    done = await client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": question}], temperature=0,
                        extra_body=extra)
                except Exception as error:  # counted by class, the level goes on
                    errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - began)
                rounds += done.model_extra["agent"]["turns"]

        began = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in range(clients)))
        wall = time.perf_counter() - began
    return {"clients": clients, "requests": clients * per_client, "answered": len(latencies), "errors": errors,
            "wall_s": wall, "requests_per_s": len(latencies) / wall, "rounds_per_s": rounds / wall,
            "rounds": rounds, "p50_s": _percentile(latencies, 50) if latencies else None,
            "p99_s": _percentile(latencies, 99) if latencies else None}


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    overrides = list(args.overrides)
    if args.model is None:
        overrides = TINY_OVERRIDES + overrides
        model_dir = _tiny_model_dir(work / "model", overrides)
    else:
        model_dir = Path(args.model)
    questions = _questions(args.config, overrides, max(args.clients) * args.requests)
    command = [sys.executable, "-m", "mempo.apps.cli", "serve", *overrides, "--model", str(model_dir), "--port", "0",
               "--model-name", "bench", "--max-in-flight", str(max(args.clients) * 2)]
    if args.config:
        command += ["--config", args.config]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO))
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline()
        if "mempo-agent ready" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        startup = time.perf_counter() - started
        url = line.split("url=", 1)[1].split()[0]
        rss_start = _rss_mib(server.pid)
        extra = {key: value for key, value in (("max_turns", args.max_turns), ("max_tokens", args.max_tokens))
                 if value is not None}
        levels = []
        for clients in args.clients:
            before = _health(url)
            result = asyncio.run(_level(url, "bench", questions, clients, args.requests, extra))
            after = _health(url)
            batches = after["generation_batches"] - before["generation_batches"]
            result["mean_batch"] = (after["generated_rounds"] - before["generated_rounds"]) / max(1, batches)
            result["rss_mib_after"] = _rss_mib(server.pid)
            levels.append(result)
            print(_row(result), flush=True)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"model": str(model_dir), "config": args.config, "overrides": overrides, "startup_s": startup,
            "rss_mib_start": rss_start, "levels": levels, "per_client": args.requests, "extra_body": extra,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "load_average_start": os.getloadavg()}}


def _row(level: dict) -> str:
    errors = sum(level["errors"].values())
    detail = ", ".join(f"{k} {v}" for k, v in level["errors"].items())
    return (f"| {level['clients']} | {level['requests']} | {level['requests_per_s']:.2f} | {level['rounds_per_s']:.1f} "
            f"| {level['p50_s']:.2f} | {level['p99_s']:.2f} | {level['mean_batch']:.1f} | "
            f"{errors}{' (' + detail + ')' if detail else ''} | {level['rss_mib_after']:.0f} |")


def markdown(results: dict) -> str:
    lines = [f"Server start to readiness: {results['startup_s']:.1f} s, RSS {results['rss_mib_start']:.0f} MiB.", "",
             "| clients | requests | requests/s | rounds/s | p50 s | p99 s | mean batch | errors | RSS after, MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(level) for level in results["levels"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a saved model directory (default: a tiny random model)")
    parser.add_argument("--config", default=None, help="its configuration (e.g. demo_out/config.yaml)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=2, help="requests per client per level (default 2)")
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads (default 1)")
    parser.add_argument("--out", default="bench_serve_out")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for the server")
    args = parser.parse_args(argv)
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))
    return 0 if all(not level["errors"] for level in results["levels"]) else 1


if __name__ == "__main__":
    sys.exit(main())
