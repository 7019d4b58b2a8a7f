"""mempo.algo: MemPO's decisions as typed pure functions (stdlib, torch, numpy, `mempo.ops`,
`mempo.protocol` and the `mempo.records` records only).

* `outcome`: the outcome reward (``compute_score`` of the rollout's protocol text), as scored copies.
* `contexts`: full_ctx / mem_ctx of a scored round, the answer template and answer_mask, as
  `mempo.records.scoring.ScoringRequest`s.
* `memory_reward`: mem_reward = P(mem_ctx) - P(full_ctx), one list per trajectory.
* `advantages`: the CSR advantage inputs and the token advantages with the zero-variance policy.

Importing this package imports none of its modules.
"""
