"""mempo.algo: MemPO's decisions as typed pure functions (stdlib, torch, numpy, `mempo.ops`,
`mempo.protocol` and the `mempo.rollout.trajectory` records only).

* `rounds`: which rounds are scored, and the `<mem>` span of a round.
* `contexts`: full_ctx / mem_ctx of a scored round, the answer template and answer_mask, and the
  records teacher scoring takes and returns (`ScoringRequest`, `ScoredRound`, `ScoringResult`).
* `memory_reward`: mem_reward = P(mem_ctx) - P(full_ctx), attached to the trajectories.
* `advantages`: the CSR advantage inputs and the token advantages with the zero-variance policy.

Importing this package imports none of its modules.
"""
