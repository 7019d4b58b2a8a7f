"""The synthetic world and what is built on it, configured by the ``synthetic`` section
(`mempo.config.SyntheticConfig`); the library's training and evaluation work without it on data a
user brings.

- `mempo.synthetic.world`: `World`, generated from a seed (`grammar`, `entities`, `facts`,
  `documents`, `questions`: its relations and question grammar, names, facts, documents, questions).
- `mempo.synthetic.build`: the world the configuration describes, and its retriever.
- `mempo.synthetic.oracle`: the rule-based agent that solves the world's episodes by the protocol
  (its memory format: `oracle_memory`); `mempo.synthetic.backend`: the agent as a generation backend.
- `mempo.synthetic.cold_start`: the oracle's SFT data from the configuration.
- `mempo.synthetic.copy_warmup`: the copy warm-up of a model trained from scratch.
- `mempo.synthetic.ledger`: the ledger, a second task where memory is the bottleneck (accounts on ledger
  pages, one question over k of them); its tools `mempo.synthetic.ledger_tools` (``lookup``, ``calc``) and
  its teacher `mempo.synthetic.ledger_oracle` (the demo chooses the task: `mempo.apps.tasks`).

Import the modules directly (importing this package imports nothing else).
"""
