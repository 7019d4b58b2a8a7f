"""Helpers shared by the tests (and by bench/), no tests here. `tests/` is on the import path
(pyproject.toml ``pythonpath``; `support.paths.python_path_env` for subprocesses), so they import
as ``support.<module>``.

* `paths`: the repository, tests and support directories; the environment that lets a subprocess
  import `support`.
* `corpus`: the 300-document test corpus (needles, long documents; the `corpus` / `bm25` fixtures).
* `toy_tokenizers`: byte-level BPE and other tokenizers trained on protocol-like text; random texts.
* `rollout_fixtures`: the chat tokenizer, a tiny random Qwen2, needle tasks and scripts, a
  hand-made `Trajectory`.
* `triton_kernels`: every Triton kernel object of `mempo.kernels`.
* `host_reads`: `HostTraffic`, a TorchFunctionMode counting a call's reads of tensor values to the
  host (each a synchronisation on CUDA) and its tensors made from host data.
* `demo_smoke`: the overrides of the smallest demo run.
* `dist`: a free port and a torchrun launch of a worker script (gloo, 2 ranks).
* `dist_worker`, `dist_export_worker`, `dist_packing_worker`: the distributed workers (also
  importable: their ``run`` is the 1-process reference).
* `sglang_standin`: stand-ins for SGLang's engine and server (CPU).
* `gold_trace`, `gold_trace_site/`: instrumentation of generation for the no-gold checks (the site
  directory's ``sitecustomize`` installs it in every process of a run).
"""
