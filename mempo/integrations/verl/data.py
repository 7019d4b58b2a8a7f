"""Search-R1-style QA files -> verl's RL parquet for the mempo agent loops.

    python -m mempo.integrations.verl.data --train nq_train.jsonl --val nq_dev.jsonl --out data/ \\
        [--objectives 1] [--train-episodes N] [--val-episodes N] [--seed 0] [--prompt-style numbered]

Reads QA records (`mempo.env.data.load_qa`: jsonl or parquet of ``{"id", "question",
"golden_answers"}``), composes episodes of ``--objectives`` questions (`compose_episodes`; 1: one
question each, the prompt `make_episode_prompt`'s in ``--prompt-style``: "numbered", whose
instructions name the built-in search and access, or "tools", which names no tool: for loops with your
own tools or the json action format), and writes ``train.parquet`` / ``val.parquet``
with one row per episode, the columns verl's ``RLHFDataset`` and the agent loops read::

    data_source   the QA file's dataset name
    agent_name    "mempo_agent" (train) / "mempo_agent_eval" (val): verl picks the loop per row
    prompt        [{"role": "user", "content": <episode prompt>}]  (the system prompt is the loop's)
    reward_model  {"style": "rule", "ground_truth": <aliases> or <one alias list per objective>}
    extra_info    {"index", "split", "id"}

The golds sit only in ``reward_model`` (verl hands them to the loop, which uses them for the outcome
and the scoring requests only). Without ``--train-episodes`` every record is used once per split;
given, it is at least 1. ``--out`` is a folder (made when absent; a file there, or a folder named
``train.parquet`` / ``val.parquet`` in it, is refused before anything is read); the two files are
replaced atomically. Every user error, a file that cannot be written included, is one line on stderr
and exit code 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from mempo.env.data import PROMPT_STYLES, QARecord, compose_episodes, dataset_name, load_qa, make_episode_prompt
from mempo.errors import MempoError
from mempo.utils.atomic import check_output_folder

__all__ = ["TRAIN_AGENT", "VAL_AGENT", "verl_rows", "write_parquet", "main"]

TRAIN_AGENT, VAL_AGENT = "mempo_agent", "mempo_agent_eval"


def verl_rows(records: Sequence[QARecord], *, split: str, agent_name: str, objectives: int = 1,
              episodes: Optional[int] = None, seed: int = 0, source: str = "qa",
              prompt_style: str = "numbered") -> list[dict[str, Any]]:
    """One verl row per episode (module docstring). ``episodes`` None: one per record (objectives 1)
    or ``len(records) // objectives`` disjoint episodes. prompt_style: `make_episode_prompt`'s."""
    if objectives < 1:
        raise ValueError(f"--objectives must be >= 1, got {objectives}")
    if episodes is None:
        episodes = len(records) // objectives
        reuse = False
    else:
        reuse = True
    by_id = {record.id: record for record in records}
    rows = []
    for i, episode in enumerate(compose_episodes(list(records), objectives, episodes, seed, reuse_questions=reuse,
                                                 id_prefix=split)):
        golds = episode.golds[0] if objectives == 1 else episode.golds
        prompt = make_episode_prompt(episode.questions, prompt_style)
        first = by_id.get(episode.source_ids[0]) if episode.source_ids else None
        rows.append({
            "data_source": dataset_name(first, source) if first is not None else source,
            "agent_name": agent_name,
            "prompt": [{"role": "user", "content": prompt}],
            "reward_model": {"style": "rule", "ground_truth": golds},
            "extra_info": {"index": i, "split": split, "id": episode.id},
        })
    return rows


def write_parquet(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Write `rows` with pyarrow (atomically: a temporary file renamed into place)."""
    import pyarrow as pa  # reason: optional dependency ([verl] extra)
    import pyarrow.parquet as pq  # reason: as above

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    pq.write_table(pa.Table.from_pylist(list(rows)), partial)
    partial.replace(path)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mempo.integrations.verl.data", description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True, help="QA file (jsonl or parquet) for train.parquet")
    parser.add_argument("--val", required=True, help="QA file for val.parquet")
    parser.add_argument("--out", required=True, help="output folder (made if absent; train.parquet and "
                                                     "val.parquet in it are replaced)")
    parser.add_argument("--objectives", type=int, default=1, help="questions per episode (MEM1-style k)")
    parser.add_argument("--train-episodes", type=int, default=None, help="train episodes, >= 1 (default: every "
                                                                         "record once)")
    parser.add_argument("--val-episodes", type=int, default=None, help="val episodes, >= 1 (default: every "
                                                                       "record once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-style", choices=PROMPT_STYLES, default="numbered",
                        help="the episode prompt's layout: numbered (instructions naming search and access; "
                             "default) or tools (naming no tool: your tools, the json format); see "
                             "mempo.env.data.make_episode_prompt")
    args = parser.parse_args(argv)
    try:
        for flag, count in (("--train-episodes", args.train_episodes), ("--val-episodes", args.val_episodes)):
            if count is not None and count < 1:  # no episodes would be a parquet without rows or columns
                raise MempoError(f"{flag}: must be a number of episodes >= 1 (or left out: every record once), "
                                 f"got {count}")
        # before anything is read: a folder (or none yet) whose two parquet names are not folders
        out = check_output_folder(args.out, "--out", [f"{split}.parquet" for split in ("train", "val")])
        for split, source, agent, episodes in (("train", args.train, TRAIN_AGENT, args.train_episodes),
                                               ("val", args.val, VAL_AGENT, args.val_episodes)):
            records = load_qa(source)
            if len(records) < args.objectives:
                raise MempoError(f"--{split}: {source} has {len(records)} questions, fewer than "
                                 f"--objectives={args.objectives}")
            rows = verl_rows(records, split=split, agent_name=agent, objectives=args.objectives, episodes=episodes,
                             seed=args.seed, source=Path(source).stem, prompt_style=args.prompt_style)
            path = write_parquet(rows, out / f"{split}.parquet")
            print(f"mempo: {len(rows)} {split} rows -> {path}")
    except (MempoError, ValueError) as error:
        print(f"mempo verl data: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the output folder or a file in it cannot be written (read-only, full, ...)
        print(f"mempo verl data: cannot write {error.filename or args.out}: {error.strerror or error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
