"""mempo.rollout: the agent loop, generation backends and the `Trajectory` record.

* `mempo.rollout.trajectory`: `Trajectory`, `Round` (offsets into the response, not copies),
  `round_training_inputs`, jsonl I/O.
* `mempo.rollout.chat`: `ChatFormat` (messages -> prompt ids with the tokenizer's chat template or a
  built-in ChatML one; the forced `<mem>` prefix; tool segments).
* `mempo.rollout.backends`: the backend interface and registry; `HFBackend` (transformers),
  `SGLangBackend` (SGLang offline engine), `SGLangServerBackend` (an SGLang server over HTTP),
  `ScriptedBackend` (replays ids); stop detection; `factory.build_backend` (from the config).
* `mempo.rollout.loop`: `RolloutEngine`, `rollout` (G samples per question, full or memory context
  policy, concurrent tools), reading `mempo.config.RolloutConfig` (re-exported here).

Importing this package is light: names load on first access, and transformers / sglang only when a
backend that needs them is built or used.
"""
from __future__ import annotations

from mempo._lazy import lazy_exports

_EXPORTS = {
    "Trajectory": "trajectory", "Round": "trajectory", "RoundInput": "trajectory", "POLICIES": "trajectory",
    "FINISH_REASONS": "trajectory", "round_training_inputs": "trajectory",
    "write_trajectories_jsonl": "trajectory", "read_trajectories_jsonl": "trajectory",
    "iter_trajectories_jsonl": "trajectory",
    "ChatFormat": "chat", "ToolSegment": "chat", "render_builtin": "chat", "default_stop_token_ids": "chat",
    "GenerationBackend": "backends", "GenerationRequest": "backends", "GenerationOutput": "backends",
    "SamplingParams": "backends", "RequestKey": "backends", "make_backend": "backends",
    "register_backend": "backends", "available_backends": "backends", "HFBackend": "backends",
    "SGLangBackend": "backends", "SGLangServerBackend": "backends", "ScriptedBackend": "backends",
    "round_script": "backends", "cut_round": "backends", "ActionStopScanner": "backends",
    "RolloutConfig": "loop", "RolloutEngine": "loop", "RolloutTask": "loop", "RolloutStats": "loop",
    "rollout": "loop",
}

__all__, __getattr__, __dir__ = lazy_exports('mempo.rollout', _EXPORTS, globals())
