"""Prompt tokens of the demo's teacher under the memory context against the full context, per k.

The oracle (`mempo.synthetic.oracle`) acts the same under both context policies, so running each
episode under both gives the same rounds with the two prompts: the memory-context tokens an agent
that solves the task as the teacher does would spend, against the full context of the same
rounds. This is the token economy of a well-behaved episode, the one docs/experiments/D04-token-ratio-k4.md compares the
demo's measured ratio with.

    python tools/oracle_token_ratio.py DEMO_OUT [--ks 2 4 6] [--episodes 64] [overrides ...]

DEMO_OUT: a `mempo demo` output directory (its config.yaml and model_sft tokenizer are used);
overrides: dotted config overrides (e.g. synthetic.world_prompt_style=compact). The teacher is the
demo's with ``synthetic.oracle_drop_fact_prob=0`` unless overridden.
"""
import argparse
import sys
from pathlib import Path

from mempo.apps.demo import load_demo_config
from mempo.config import split_overrides
from mempo.env.build import build_retriever, build_tools
from mempo.model.loading import pretrained_tokenizer
from mempo.synthetic.build import synthetic_world
from mempo.synthetic.oracle import run_oracle
from mempo.rollout.chat import ChatFormat
from mempo.synthetic.cold_start import oracle_agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("demo_out")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("overrides", nargs="*", help="dotted config overrides (key=value), anywhere on the line")
    overrides, rest = split_overrides(sys.argv[1:])
    args = parser.parse_args(rest)
    args.overrides = overrides
    out = Path(args.demo_out)
    cfg = load_demo_config(out / "config.yaml", ["synthetic.oracle_drop_fact_prob=0"] + args.overrides)
    chat = ChatFormat(pretrained_tokenizer(out / "model_sft"), template=cfg.rollout.chat_template)
    world = synthetic_world(cfg)
    tools = build_tools(cfg, build_retriever(cfg, world))
    agent = oracle_agent(cfg)
    print("| k | episodes | rounds / episode | EM | memory tokens / episode | full tokens / episode | ratio |")
    print("|---|---|---|---|---|---|---|")
    for k in args.ks:
        episodes = world.episodes(k, args.episodes, seed=10_000 + k)
        rounds = memory = full = em = 0.0
        for episode in episodes:
            runs = {policy: run_oracle(episode, tools, policy=policy, agent=agent,
                                       system_prompt=cfg.rollout.system_prompt) for policy in ("memory", "full")}
            assert [r.assistant for r in runs["memory"].rounds] == [r.assistant for r in runs["full"].rounds]
            memory += sum(len(chat.prompt_ids(r.messages)) for r in runs["memory"].rounds)
            full += sum(len(chat.prompt_ids(r.messages)) for r in runs["full"].rounds)
            rounds += len(runs["memory"].rounds)
            em += runs["memory"].score["em"]
        n = len(episodes)
        print(f"| {k} | {n} | {rounds / n:.2f} | {em / n:.3f} | {memory / n:.0f} | {full / n:.0f} "
              f"| {memory / full:.3f} |")


if __name__ == "__main__":
    main()
