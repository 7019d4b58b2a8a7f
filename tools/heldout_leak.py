"""How much of the held-out evaluation the SFT data still shows: per evaluated k, the share of the
evaluation's questions whose subject's article (its document id) or whose answer fact (the support
sentence) is in the prompt of some SFT example (with ``sft.prompt_loss_weight`` > 0 a language-modelling
target). Subjects are held out of the SFT questions (`mempo.synthetic.heldout`); their articles can
still come back as search results of other questions.

    .venv-test/bin/python tools/heldout_leak.py [--config configs/demo.yaml] [--nothing-held-out] [key=value ...]

--nothing-held-out: the SFT data drawn with no subject held out (a reference: what the split removes).
"""
from __future__ import annotations

import argparse
import re
import sys

from mempo.config import load_config, split_overrides
from mempo.env.build import build_tools
from mempo.eval import eval_episodes, held_out_of_training
from mempo.synthetic.build import build_world
from mempo.synthetic.cold_start import oracle_cold_start

DOC_ID = re.compile(r"\(ID: ([^,\s]+),")


def main(argv=None) -> int:
    overrides, rest = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--nothing-held-out", action="store_true")
    args = parser.parse_args(rest)
    cfg = load_config(args.config, overrides)
    env = build_world(cfg)
    evaluated = eval_episodes(env.world, cfg)  # the split eval.split names
    held = held_out_of_training(env.world, cfg)  # both splits' subjects
    cold = oracle_cold_start(env.world, build_tools(cfg, env.retriever), cfg,
                             frozenset() if args.nothing_held_out else held)
    prompts = [m["content"] for t in cold.trajectories for r in t.rounds for m in r.messages]
    shown_ids = {doc_id for text in prompts for doc_id in DOC_ID.findall(text)}
    shown_text = "\n".join(prompts)
    print(f"{len(held)} held-out subjects; {len(cold.trajectories)} SFT trajectories; sft.prompt_loss_weight "
          f"{cfg.sft.prompt_loss_weight}; {len(shown_ids)} distinct documents in SFT prompts")
    for k, episodes in evaluated.items():
        records = [r for e in episodes for r in e.metadata["records"]]
        article = sum(all(s["doc_id"] in shown_ids for s in r["support"]) for r in records)
        fact = sum(all(s["sentence"] in shown_text for s in r["support"]) for r in records)
        print(f"k={k}: {len(records)} questions; subject's article in an SFT prompt: {article} "
              f"({article / len(records):.1%}); the answer's fact sentence in an SFT prompt: {fact} "
              f"({fact / len(records):.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
