"""mempo.records: the records one batch carries from rollout to update, below every stage that uses
them (they import only `mempo.protocol` and `mempo.utils`). Import from the modules:

* `trajectory`: `Trajectory`, `Round` (offsets into the response, not copies), `round_training_inputs`,
  jsonl I/O.
* `rounds`: which rounds are scored, and the `<mem>` span of a round.
* `scoring`: what teacher scoring takes and returns (`ScoringRequest`, `ScoredRound`, `ScoringResult`).

Importing this package imports none of its modules.
"""
