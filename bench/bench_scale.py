"""Scaling of `mempo train` over gloo ranks (issue 22): per-rank model-state memory, peak RSS, step
time, checkpoint save and load time, for 1, 2 and 4 ranks on a ~104 M-parameter Qwen2.

Run:  python bench/bench_scale.py [--ranks 1 2 4] [--out bench/scale_results.json] [--rerun]

Each world size runs `mempo train` twice under torchrun (gloo, CPU), through `mempo.apps.cli.main`
in this file's worker mode: a first run of one step (checkpoint saved at step 1), then ``--resume``
for a second step (the checkpoint loaded, another saved). Model: builtin Qwen2, hidden 768,
intermediate 3072, 12 layers, 12 heads (4 KV), the builtin tokenizer's 1,024-word vocabulary
(103.9 M parameters); one question per rank, G = 2, one round of 8 new tokens (the rollout is not
what is measured). Per rank the worker records:

* model state: the bytes of the distinct storages under the actor's parameters, gradients and
  AdamW moments as torch holds them on the rank (FSDP2's padding included), at the first save;
* peak RSS: ``ru_maxrss`` of the rank's process at the end of the resumed run (start-up, rollout,
  update, save and load included);
* step time: ``time/step`` of the resumed run's step (metrics.jsonl, the slowest rank's);
* checkpoint save / load: wall seconds of the save (`start_checkpoint` to the end of its
  `publish`: shards, digests, manifest; first run) and of `load_checkpoint` (resumed run) on the
  rank, digests included.

Each world size is written to ``--out`` as it finishes (with the machine's load average then), and
a rerun measures only the world sizes missing there (``--rerun``: all again).

Nothing is asserted; the table goes to bench/RESULTS.md ("Scaling over ranks").
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = ["model.hidden_size=768", "model.intermediate_size=3072", "model.num_hidden_layers=12",
         "model.num_attention_heads=12", "model.num_key_value_heads=4", "model.max_position_embeddings=2048"]
RUN = ["rollout.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens_per_round=8",
       "rollout.max_response_tokens=null", "synthetic.world_entities=20", "trainer.tensorboard=false",
       "trainer.progress=false", "trainer.save_every=1", "actor.kl_coef=0", "actor.micro_batch_tokens=null",
       "algorithm.skip_zero_variance_groups=false"]  # a random model scores 0: still update (the cost is measured)


def _storages(tensors) -> int:
    seen = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(seen.values())


def worker(out: Path, record: Path, argv: list[str]) -> None:
    """One rank of `mempo train` (`mempo.apps.cli.main(argv)`), with the checkpoint save and
    `load_checkpoint` timed and the model state counted at the first save; appends this rank's
    numbers to `record`."""
    import torch
    import torch.distributed as dist

    import mempo.train.trainer as trainer
    from mempo.apps.cli import main

    numbers: dict = {}
    real_start, real_load = trainer.start_checkpoint, trainer.load_checkpoint

    class TimedPending:  # the save is timed from start_checkpoint to the end of its publish()
        def __init__(self, pending, began):
            self.pending, self.began = pending, began

        def publish(self):
            path = self.pending.publish()
            numbers.setdefault("save_seconds", time.perf_counter() - self.began)
            return path

        def abandon(self):
            self.pending.abandon()

    def timed_start(root, step, model, optimizer, **kwargs):
        if "model_state_bytes" not in numbers:
            params = list(model.parameters())
            numbers["model_state_bytes"] = (_storages(params)
                                            + _storages([p.grad for p in params if p.grad is not None])
                                            + _storages([v for s in optimizer.state.values() for v in s.values()
                                                         if torch.is_tensor(v) and v.dim() > 0]))
        began = time.perf_counter()
        return TimedPending(real_start(root, step, model, optimizer, **kwargs), began)

    def timed_load(*args, **kwargs):
        began = time.perf_counter()
        result = real_load(*args, **kwargs)
        numbers["load_seconds"] = time.perf_counter() - began
        return result

    trainer.start_checkpoint, trainer.load_checkpoint = timed_start, timed_load
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    code = main(argv)
    numbers.update(rank=rank, exit_code=code, peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    with open(record, "a") as handle:
        handle.write(json.dumps(numbers) + "\n")
    del dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(ranks: int, out: Path, record: Path, extra: list[str]) -> None:
    argv = ["train", "--config", str(REPO / "configs" / "tiny.yaml"), "--out", str(out), "--threads", "1",
            *MODEL, *RUN, f"data.questions_per_step={ranks}", *extra]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", __file__, "--worker", str(out), str(record),
           "--", *argv]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def measure(ranks: int, scratch: Path) -> dict:
    out, first, second = scratch / f"run{ranks}", scratch / f"first{ranks}.jsonl", scratch / f"second{ranks}.jsonl"
    _launch(ranks, out, first, ["trainer.total_steps=1"])
    _launch(ranks, out, second, ["trainer.total_steps=2", "--resume"])
    saved = [json.loads(line) for line in first.read_text().splitlines()]
    resumed = [json.loads(line) for line in second.read_text().splitlines()]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step = next(r for r in rows if r["step"] == 2)
    by_rank = {r["rank"]: r for r in saved}
    return {"ranks": ranks, "step_seconds": step["time/step"],
            "per_rank": [{"rank": r["rank"], "model_state_bytes": by_rank[r["rank"]]["model_state_bytes"],
                          "save_seconds": by_rank[r["rank"]]["save_seconds"], "load_seconds": r["load_seconds"],
                          "peak_rss_bytes": max(r["peak_rss_bytes"], by_rank[r["rank"]]["peak_rss_bytes"])}
                         for r in sorted(resumed, key=lambda r: r["rank"])]}


def table(results: list[dict]) -> str:
    single = next((r for r in results if r["ranks"] == 1), None)
    lines = ["| ranks | model state / rank (MiB) | vs 1 process | peak RSS / rank (MiB, max) | step (s) | "
             "save (s, max) | load (s, max) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        state = max(p["model_state_bytes"] for p in r["per_rank"])
        ratio = f"{state / max(p['model_state_bytes'] for p in single['per_rank']):.2f}" if single else "-"
        lines.append(f"| {r['ranks']} | {state / 2 ** 20:,.0f} | {ratio} | "
                     f"{max(p['peak_rss_bytes'] for p in r['per_rank']) / 2 ** 20:,.0f} | {r['step_seconds']:.1f} | "
                     f"{max(p['save_seconds'] for p in r['per_rank']):.2f} | "
                     f"{max(p['load_seconds'] for p in r['per_rank']):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", default=str(REPO / "bench" / "scale_results.json"))
    parser.add_argument("--rerun", action="store_true", help="measure again the world sizes --out already holds")
    args = parser.parse_args()
    out = Path(args.out)
    # each world size is written as it finishes: an interrupted run keeps them, a rerun measures the rest
    done = {r["ranks"]: r for r in json.loads(out.read_text())} if out.is_file() and not args.rerun else {}
    with tempfile.TemporaryDirectory(prefix="mempo-scale-") as scratch:
        for ranks in args.ranks:
            if ranks in done:
                print(f"{ranks} rank(s): measured before ({out}), kept", file=sys.stderr, flush=True)
                continue
            began = time.perf_counter()
            done[ranks] = dict(measure(ranks, Path(scratch)), load_average=os.getloadavg()[0])
            out.write_text(json.dumps([done[k] for k in sorted(done)], indent=1) + "\n")
            print(f"{ranks} rank(s): {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    print(table([done[k] for k in sorted(done)]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        split = sys.argv.index("--")
        worker(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[split + 1:])
    else:
        main()
