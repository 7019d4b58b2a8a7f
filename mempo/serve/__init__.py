"""The trained agent in use: `mempo serve` (an OpenAI-compatible endpoint) and `mempo ask`.

* `mempo.serve.agent`: `AgentService`, the memory loop as a service (questions in at any time,
  batched round by round across requests on one model thread, rounds out as they finish), with the
  evaluation's settings (`serving_rollout_config`); `AgentOptions`, `AgentRound`, `AgentAnswer`.
* `mempo.serve.openai_api`: the FastAPI app (`create_app`: ``/v1/chat/completions`` with streaming,
  ``/v1/models``, ``/health``), `AgentServer` (background thread) and `serve_agent`.
* `mempo.serve.load`: `load_agent`, the model directory, retriever and backend as `mempo eval` builds them.
* `mempo.serve.defaults`: the server's default bounds.

This package module imports nothing, so the `mempo serve` parser reads the defaults without torch.
"""
