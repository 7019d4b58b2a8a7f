"""Stand-ins for SGLang, which cannot run here (it needs a CUDA GPU and is not installed on CPU
machines): `StandInEngine` has the methods and replies of ``sglang.Engine`` that mempo calls,
`StandInServer` the HTTP endpoints of SGLang's server, both as read in SGLang's source (the files
are cited in mempo/rollout/backends/sglang.py). They generate with a real HF model (the tiny Qwen2
of the test, through `HFBackend`), so weights that reach them change what they generate.

What they enforce, as SGLang does:
* ``update_weights_from_tensor`` outside a ``begin_weight_update()`` / ``end_weight_update()``
  session answers ``(False, "update_weights_from_tensor must run between ...")``; a second
  ``begin`` or an ``end`` without ``begin`` answer ``(False, ...)`` (weight_updater.py);
* ``release_memory_occupation(tags)`` frees the tagged memory (the weights are lost: the stand-in
  scrambles them) and ``resume_memory_occupation(tags)`` re-allocates it; generating while the
  KV cache or the weights are released fails;
* the server's ``/update_weights_from_disk`` answers ``{"success", "message",
  "num_paused_requests"}``, HTTP 400 on failure; ``/generate`` takes ``input_ids``,
  ``sampling_params`` and ``return_logprob`` and answers one ``{"output_ids", "meta_info"}`` per
  request;
* ``return_logprob=True`` adds ``meta_info["output_token_logprobs"]``: one ``(logprob, id, None)`` per
  output id (no text under skip_tokenizer_init), the log-prob after temperature scaling (SGLang's
  default, without ``SGLANG_RETURN_ORIGINAL_LOGPROB``).
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

import torch

from mempo.rollout.backends import GenerationRequest, HFBackend, SamplingParams
from mempo.rollout.backends.hf import load_weights_into

NO_SESSION = "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"


class StandInEngine:
    """``sglang.Engine`` as mempo uses it (module docstring). ``events`` records every call."""

    def __init__(self, model: Any, tokenizer: Any, *, session_api: bool = True, fail_update: Optional[str] = None,
                 fail_begin: Optional[str] = None, fail_end: Optional[str] = None):
        self.model = model
        self.hf = HFBackend(model, tokenizer)
        self.events: list[tuple] = []
        self.session_open = False
        self.released: set[str] = set()
        self.fail_update, self.fail_begin, self.fail_end = fail_update, fail_begin, fail_end
        self.last_sampling_params: list[dict] = []
        if not session_api:  # an SGLang build before the session API: no such methods
            self.begin_weight_update = None
            self.end_weight_update = None

    def generate(self, input_ids, sampling_params, return_logprob=False):
        self.events.append(("generate", len(input_ids)))
        if self.released:
            raise RuntimeError(f"stand-in: generate while {sorted(self.released)} are released")
        self.last_sampling_params = list(sampling_params)
        self.last_return_logprob = return_logprob
        results = []
        for ids, params in zip(input_ids, sampling_params):
            request = GenerationRequest(list(ids), params["max_new_tokens"], 0, tuple(params["stop_token_ids"]))
            sampling = SamplingParams(params["temperature"], params["top_p"], max(params["top_k"], 0))
            (output,) = self.hf.generate([request], sampling)
            ids = output.token_ids
            stop = ids[-1] if ids and ids[-1] in params["stop_token_ids"] else None
            finish = {"type": "stop", "matched": stop} if stop is not None else {"type": "length", "length": len(ids)}
            meta = {"finish_reason": finish, "id": "x"}
            if return_logprob:  # one (logprob, id, text) per output id; no text without a tokenizer
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(output.logprobs, ids)]
            results.append({"output_ids": output.token_ids, "meta_info": meta})
        return results

    def begin_weight_update(self):  # replaced by None when session_api is False
        self.events.append(("begin_weight_update",))
        if self.fail_begin:
            return False, self.fail_begin
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    def end_weight_update(self):
        self.events.append(("end_weight_update",))
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        if self.fail_end:
            return False, self.fail_end
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.events.append(("update_weights_from_tensor", [n for n, _ in named_tensors], flush_cache))
        if self.begin_weight_update is not None and not self.session_open:
            return False, NO_SESSION
        if "weights" in self.released:
            return False, "stand-in: the weights' memory is released"
        if self.fail_update:
            return False, self.fail_update
        load_weights_into(self.model, named_tensors)
        return True, "Success"

    def release_memory_occupation(self, tags=None):
        tags = list(tags or ["kv_cache", "weights"])
        self.events.append(("release_memory_occupation", tuple(tags)))
        self.released.update(tags)
        if "weights" in tags:  # released weights are not kept
            with torch.no_grad():
                for p in self.model.parameters():
                    p.normal_()

    def resume_memory_occupation(self, tags=None):
        tags = list(tags or ["kv_cache", "weights"])
        self.events.append(("resume_memory_occupation", tuple(tags)))
        missing = [t for t in tags if t not in self.released]
        if missing:
            raise KeyError(f"stand-in: {missing} were not released")  # SGLang: offload_tags.remove(tag)
        self.released.difference_update(tags)

    def shutdown(self):
        self.events.append(("shutdown",))


class StandInServer:
    """SGLang's HTTP server (the endpoints mempo uses) on a loopback port, over a `StandInEngine`
    without the session API (the disk path is not session-gated)."""

    def __init__(self, model: Any, tokenizer: Any):
        from transformers import AutoModelForCausalLM

        self.engine = StandInEngine(model, tokenizer, session_api=False)
        self.requests: list[tuple[str, Any]] = []
        self.fail_disk: Optional[str] = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                server.requests.append((self.path, None))
                if self.path == "/get_model_info":
                    self._reply(200, {"model_path": "stand-in", "is_generation": True})
                else:
                    self._reply(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
                server.requests.append((self.path, body))
                if self.path == "/generate":
                    self._reply(200, server.engine.generate(body["input_ids"], body["sampling_params"],
                                                            bool(body.get("return_logprob", False))))
                elif self.path == "/update_weights_from_disk":
                    path = Path(body["model_path"])
                    if server.fail_disk or not (path / "config.json").is_file():
                        message = server.fail_disk or f"Failed to get weights iterator: {path} has no checkpoint"
                        self._reply(400, {"success": False, "message": message, "num_paused_requests": 0})
                        return
                    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
                    load_weights_into(server.engine.model, loaded.state_dict())
                    self._reply(200, {"success": True, "message": "Succeeded to update model weights.",
                                      "num_paused_requests": 0})
                else:
                    self._reply(404, {"detail": "Not Found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
