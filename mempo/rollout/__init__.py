"""mempo.rollout: the agent loop and generation backends; it makes `mempo.records.trajectory.Trajectory`
records. Import from the modules:

* `mempo.rollout.chat`: `ChatFormat` (messages -> prompt ids with the tokenizer's chat template or a
  built-in ChatML one; the forced `<mem>` prefix; tool segments).
* `mempo.rollout.backends`: the backend interface and registry; `HFBackend` (transformers),
  `SGLangBackend` (SGLang offline engine), `SGLangServerBackend` (an SGLang server over HTTP),
  `ScriptedBackend` (replays ids); stop detection; `factory.build_backend` (from
  the config).
* `mempo.rollout.loop`: `RolloutEngine`, `RolloutTask`, `rollout` (G samples per question, full or
  memory context policy, concurrent tools), reading `mempo.config.RolloutConfig`.

No module of this package imports transformers or sglang at import time: a backend that needs one
imports it when it is built or used.
"""
