"""Generation backends behind one interface (:mod:`mempo.rollout.backends.base`).

* ``"hf"`` — :class:`HFBackend`: transformers ``generate`` (CPU and GPU), the default.
* ``"sglang"`` — :class:`SGLangBackend`: SGLang's offline engine, token ids in/out (GPU machines);
  :class:`SGLangServerBackend`: an SGLang server over HTTP.
* ``"scripted"`` — :class:`ScriptedBackend`: replays given token sequences (tests, demos).
* The rule-based oracle agent as a policy: `mempo.synthetic.backend.OracleBackend` (the synthetic
  world's upper bound; tests). `scaffold.ProtocolScaffold`: the opt-in answer-blind logits
  processor of the HF backend (imported from its module: it needs torch).

``make_backend(name, ...)`` builds one by name; the trainer and ``mempo eval`` build theirs from
the config with :func:`mempo.rollout.backends.factory.build_backend`. Importing this package
imports neither transformers nor sglang; each backend imports its library when it is built or
first used.
"""
from mempo.rollout.backends.base import (
    BACKENDS, GenerationBackend, GenerationOutput, GenerationRequest, RequestKey, SamplingParams,
    available_backends, make_backend, named_tensors, register_backend,
)
from mempo.rollout.backends.hf import HFBackend
from mempo.rollout.backends.scripted import ScriptedBackend, round_script
from mempo.rollout.backends.sglang import SGLangBackend, SGLangServerBackend
from mempo.rollout.backends.stopping import (
    STOP_ACTION, STOP_EOS, STOP_LENGTH, ActionStopScanner, RoundCut, TokenBytes, action_closing_token_ids, cut_round,
)

__all__ = [
    "BACKENDS", "GenerationBackend", "GenerationOutput", "GenerationRequest", "RequestKey", "SamplingParams",
    "available_backends", "make_backend", "named_tensors", "register_backend", "HFBackend",
    "SGLangBackend",
    "SGLangServerBackend", "ScriptedBackend", "round_script", "STOP_ACTION", "STOP_EOS", "STOP_LENGTH",
    "ActionStopScanner", "RoundCut",
    "TokenBytes", "action_closing_token_ids", "cut_round",
]
