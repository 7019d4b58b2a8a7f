"""The typed sections of the configuration and `MempoConfig`, the tree of all of them.

`MempoConfig` has one section per concern: ``model``, ``data``, ``env``, ``rollout`` (the agent
loop reads it directly; evaluation derives its own from it and the ``eval`` section), ``scoring``,
``algorithm``, ``actor`` (optimiser and policy loss), ``trainer``, ``eval``, ``sft`` (a cold start on
data a user brings) and ``synthetic`` (the generated world, its oracle teacher and the demo's model).
Every field has a default, so no file is a valid configuration. Each section validates itself in
``__post_init__`` (types by `mempo.config.coerce.coerce_value`, ranges, choices, cross-field rules),
so no invalid section can be built, whichever way it is built; a problem raises `ConfigError`
naming the field's dotted path and what is allowed.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from mempo.config.coerce import ConfigError, build_section, coerce_value
from mempo.protocol.grammar import answer_template_text, check_answer_template
from mempo.protocol.memory import CONTEXT_POLICIES, DEFAULT_SYSTEM_PROMPT, MEM_PREFIX
from mempo.protocol.tags import ACTION_FORMATS
from mempo.utils.imports import is_import_path

__all__ = [
    "ModelConfig", "DataConfig", "EnvConfig", "RolloutConfig", "ScoringConfig", "AlgorithmConfig",
    "ActorConfig", "TrainerConfig", "EvalConfig", "SFTConfig", "SyntheticConfig", "MempoConfig",
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "ROLLOUT_IS_LEVELS", "MAX_MODEL_LAYERS", "MAX_TENSOR_BYTES",
    "MAX_WORLD_DOCUMENTS", "flash_attention_requested",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: the built-in tools `env.tools` names without an import path (`mempo.env.tools.BUILTIN_TOOLS`)
BUILTIN_TOOL_NAMES = ("search", "access")
#: the built-in outcome rewards `rollout.outcome_reward` names without an import path (`mempo.algo.outcome`)
BUILTIN_OUTCOME_REWARDS = ("em", "f1", "em_retrieved")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
#: The most decoder layers of a builtin-tiny model: each layer is built as a module (also on the meta
#: device, by `mempo plan`), about 1 ms a layer; published LLMs have fewer than 200.
MAX_MODEL_LAYERS = 10_000
#: torch's largest tensor in bytes (its sizes are int64): no weight of a builtin-tiny model may reach it.
MAX_TENSOR_BYTES = 1 << 63
#: The most documents a synthetic world may have (entities, distractors, chronicles): every command
#: generates and BM25-indexes them at start-up, about 100 s and 4 GB for 10^6 on one core.
MAX_WORLD_DOCUMENTS = 1_000_000
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: The fewest accounts a ledger has (`mempo.synthetic.ledger.MIN_ACCOUNTS`: each split holds a few).
MIN_LEDGER_ACCOUNTS = 40
#: The largest ledger amount (a number the agent copies digit by digit; a sum of many stays far below calc's bound).
MAX_LEDGER_AMOUNT = 10 ** 9
#: actor.rollout_is: "auto" (on where rollout and training differ), a level, or "off"
ROLLOUT_IS_LEVELS = ("auto", "token", "sequence", "off")


# ------------------------------------------------------------------------------------------------
# checks used by the sections' __post_init__
# ------------------------------------------------------------------------------------------------
def _require(condition: bool, field_name: str, reason: str) -> None:
    if not condition:
        raise ConfigError(field_name, reason)


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            _require(value > 0, name, f"must be > 0, got {value!r}")


def _non_negative(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            _require(value >= 0, name, f"must be >= 0, got {value!r}")


def _finite(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float):
            _require(math.isfinite(value), f.name, f"must be a finite number, got {value!r}")


def _check_types(obj: Any) -> None:
    """Convert every field of a section in place to its annotated type (raises ConfigError)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, coerce_value(getattr(obj, f.name), hints[f.name], f.name))


def flash_attention_requested(attn_implementation: Optional[str]) -> bool:
    """Whether `attn_implementation` is a flash-attention one (transformers' own test,
    ``utils.generic.is_flash_attention_requested``: "flash_attention_2", "flash_attention_3",
    kernels-community flash kernels all contain "flash"); these take varlen kwargs and need
    fp16/bf16 activations."""
    return attn_implementation is not None and "flash" in attn_implementation


# ------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------
@dataclass
class ModelConfig:
    """The policy model.

    path: a Hugging Face model id or local directory, or ``"builtin-tiny"``: a small random Qwen2
    built from the size fields below (no download; for tests and the demo). tokenizer: a tokenizer
    id/directory (None: the model's own; for builtin-tiny the trainer supplies one). vocab_size:
    builtin-tiny only (None: the tokenizer's size). dtype: parameter dtype of the loaded model.
    attn_implementation: passed to transformers ("sdpa", "eager", "flash_attention_2"). The size
    fields are bounded by what can be built: at most `MAX_MODEL_LAYERS` (10,000) layers, and no
    weight (``hidden_size`` by the widest of ``hidden_size``, ``intermediate_size`` and
    ``vocab_size``, in ``dtype``) of `MAX_TENSOR_BYTES` (2^63 bytes, torch's limit) or more.
    allow_pickle_weights: read a model directory's pickled weights (``pytorch_model.bin``) when it
    has no safetensors file (default false: such a directory is refused by name, since a pickle can
    run code; when true torch's weights-only unpickler reads them). It applies wherever a model is
    loaded from files: ``model.path`` (``mempo train`` / ``sft``) and ``--model`` (``mempo eval`` /
    ``serve`` / ``ask``). Repository code (``trust_remote_code``) is never run, whatever it says.

    A flash-attention implementation (`flash_attention_requested`) needs half-precision compute:
    flash-attn refuses fp32 ("FlashAttention only support fp16 and bf16"). So fp32 weights with it
    need ``actor.param_dtype`` bfloat16 / float16 (`MempoConfig`): FSDP2 mixed precision under
    torchrun, where the training forward, the rollout, teacher scoring and the periodic evaluation
    all run on weights gathered in that dtype (fp32 masters: the recommended layout); a single
    process, where nothing is gathered, is refused at start-up (`mempo.train.actor.Actor`).
    """

    path: str = "builtin-tiny"
    tokenizer: Optional[str] = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str = "sdpa"
    vocab_size: Optional[int] = None
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 8192
    allow_pickle_weights: bool = False

    def __post_init__(self):
        _check_types(self)
        _require(self.path.strip() != "", "path", "must be a model id, a directory or 'builtin-tiny'")
        _positive(self, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
        _require(self.hidden_size % self.num_attention_heads == 0, "hidden_size",
                 f"must be a multiple of num_attention_heads ({self.num_attention_heads}), got {self.hidden_size}")
        _require(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
                 f"must divide num_attention_heads ({self.num_attention_heads}), got {self.num_key_value_heads}")
        _require(self.num_hidden_layers <= MAX_MODEL_LAYERS, "num_hidden_layers",
                 f"must be at most {MAX_MODEL_LAYERS:,} (each layer is built as a module), got "
                 f"{self.num_hidden_layers}")
        widest, name = max((self.hidden_size, "hidden_size"), (self.intermediate_size, "intermediate_size"),
                           (self.vocab_size or 0, "vocab_size"))
        _require(self.hidden_size * widest * _DTYPE_BYTES[self.dtype] < MAX_TENSOR_BYTES, name,
                 f"a {self.hidden_size} x {widest} weight (hidden_size x {name}) in {self.dtype} would reach 2^63 "
                 "bytes, torch's largest tensor; give smaller sizes")


@dataclass
class DataConfig:
    """Training / evaluation questions.

    source: ``"synthetic"`` (the generated world the ``synthetic`` section describes,
    `mempo.synthetic`) or ``"files"`` (QA jsonl / parquet files, `mempo.env.data.load_qa`; questions
    from ``train_files``, the trainer's periodic evaluation and `mempo eval` from ``eval_files``,
    documents from ``env.corpus_path`` or the ``env.retriever: http`` server; `mempo eval` reports
    each dataset of ``eval_files`` apart). num_objectives: sub-questions per training episode (MEM1
    composition; the paper trains on 2), or a list for mixed k: episode i has ``num_objectives[i %
    len]`` (``[2, 4]``: every other episode k = 4; `mempo.env.data.compose_episodes`; a one-item list
    is that int). questions_per_step: questions per training step (B; each is
    rolled out `rollout.group_size` times). shuffle / seed: the order of the training questions and
    the seed of the questions drawn from a synthetic world. gold_field: where a QA record's reference
    answers are (what the outcome reward and teacher scoring read; `mempo.env.data.qa_record_from_json`):
    ``"auto"`` (the first of ``golden_answers``, ``answers``, ``answer``, ``reward_model.ground_truth.target``),
    a (dotted) field name, or null: the records have no reference answer (a task scored by a user's
    ``rollout.outcome_reward`` only; then the memory reward, which scores P(gold | memory), must be off:
    ``algorithm.memory_weight: 0``). The synthetic world's answers are its own (``"auto"`` only).
    """

    source: Literal["synthetic", "files"] = "synthetic"
    train_files: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    num_objectives: Union[int, list[int]] = 2
    questions_per_step: int = 8
    shuffle: bool = True
    seed: int = 0
    gold_field: Optional[str] = "auto"

    def __post_init__(self):
        _check_types(self)
        _positive(self, "questions_per_step")
        _require(self.source == "files" or self.gold_field == "auto", "gold_field",
                 f"the synthetic world brings its own answers: leave it 'auto' with source 'synthetic', "
                 f"got {self.gold_field!r}")
        counts = self.num_objectives if isinstance(self.num_objectives, list) else [self.num_objectives]
        _require(bool(counts), "num_objectives", "must be an int or a non-empty list of ints, got []")
        _require(all(k > 0 for k in counts), "num_objectives", f"must be > 0 (each), got {self.num_objectives!r}")
        if len(counts) == 1:
            self.num_objectives = counts[0]

    @property
    def objective_counts(self) -> tuple[int, ...]:
        """``num_objectives`` as a tuple: ``(2,)`` or the mixed-k cycle ``(2, 4)``."""
        return tuple(self.num_objectives) if isinstance(self.num_objectives, list) else (self.num_objectives,)
        # which files a source 'files' run needs is the command's to say: `mempo train` train_files
        # (`mempo.train.trainer`), `mempo eval` eval_files only (`mempo.eval.qa_eval_episodes`)


@dataclass
class EnvConfig:
    """The tool environment. tools: the agent's tools (`mempo.env.build.build_tools`), each the name of a
    built-in (``"search"``, ``"access"``: over the retriever) or the import path of a user's tool,
    ``"package.module:name"`` (`mempo.tools.load_tools`: a `mempo.tools.Tool`, a list of them, or a
    factory of either); tool_timeout: seconds a tool call may take before the agent reads an error
    instead; tool_result_chars: the longest observation text kept (a longer one is cut with a notice).
    retriever: ``"bm25"`` (in-process over the corpus) or ``"http"`` (a Search-R1 compatible server at
    `retriever_url`); read only when a built-in tool is configured. topk / doc_chars: search results and
    their cut; page_chars: access-tool page size."""

    tools: list[str] = field(default_factory=lambda: ["search", "access"])
    tool_timeout: float = 30.0
    tool_result_chars: int = 65536
    retriever: Literal["bm25", "http"] = "bm25"
    retriever_url: Optional[str] = None
    corpus_path: Optional[str] = None
    topk: int = 5
    doc_chars: int = 5000
    page_chars: int = 25000

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "topk", "doc_chars", "page_chars", "tool_timeout", "tool_result_chars")
        for i, spec in enumerate(self.tools):
            _require(spec in BUILTIN_TOOL_NAMES or is_import_path(spec), f"tools[{i}]",
                     f"must be a built-in tool {BUILTIN_TOOL_NAMES} or an import path 'package.module:name', "
                     f"got {spec!r}")
        repeated = sorted({t for t in self.tools if self.tools.count(t) > 1})
        _require(not repeated, "tools", f"lists {repeated} more than once")
        _require(self.retriever != "http" or bool(self.retriever_url), "retriever_url",
                 "must be set (e.g. 'http://127.0.0.1:8000') when retriever is 'http'")


@dataclass
class RolloutConfig:
    """Rollouts (ALGORITHM.md sections 1-2): the agent loop's settings (`mempo.rollout.loop.RolloutEngine`
    reads this record directly), and the backend and chat template that training, SFT example
    building, evaluation and the demo all use. Evaluation runs the loop with this section changed by
    the ``eval`` section (`mempo.eval.eval_rollout_config`: memory / full context per
    ``eval.policies``, one sample, ``eval.max_turns``, ``eval.temperature``, no response budget).

    group_size: samples per question (G). max_turns: round limit of training rollouts.
    max_new_tokens_per_round: generation limit of one round; max_response_tokens: limit of the
    whole response (generated + tool ids; None: no limit). context_policy: ``"full"`` (growing
    context, the reference's training rollouts) or ``"memory"`` (AgentMemory context).
    temperature / top_p / top_k: sampling (top_k 0 = off); the same temperature divides the
    logits when the actor computes log-probs, so a configuration needs it > 0 (0, greedy, only in
    the derived evaluation record). seed: the rollout sampling seed (training step s samples with
    `mempo.seeds.training_rollout_seed`).

    system_prompt: the system message of every episode. forced_prefix: the text every round starts
    with (``<mem>``); train_forced_prefix: whether its ids have loss mask 1 (the model learns to
    open every turn with ``<mem>`` itself). stop_token_ids: ids that end a round (None: the
    tokenizer's EOS, ``<|im_end|>``, ``<|endoftext|>``). tool_workers: threads running one step's
    tool calls. score_mode: how per-objective EM becomes the outcome score
    (`mempo.protocol.reward.compute_score`: ``"mean"``, ``"all"``, ``"sum"``). outcome_reward: the
    outcome reward (`mempo.algo.outcome`): ``"em"`` (exact match, the paper's), ``"f1"`` (token F1, per
    objective aggregated by score_mode), ``"em_retrieved"`` (EM, and 0 for an answer given while some
    objective's gold was in none of the tool results: `mempo.protocol.reward.response_retrieved_objectives`),
    or the import path of a user's function ``reward(answer, example) -> float``
    (``"package.module:function"``; the answer is the final ``<answer>`` text or
    None, the example a dict with the question(s), golds and the record's other fields); a response
    that breaks the format scores 0 whichever it is. action_format: how the agent calls its tools
    (`mempo.protocol.tags`): ``"tags"`` (one tag per tool, ``<search>q</search>``, answered in
    ``<information>``) or ``"json"`` (Hermes / Qwen ``<tool_call>{"name": ..., "arguments": ...}
    </tool_call>`` answered in ``<tool_response>``, the tools' JSON schemas in the system prompt).
    tool_schemas: in the json format, whether the system prompt carries the tools' schemas block
    (`mempo.tools.Toolset.system_prompt`: what a pretrained chat model reads to know its tools); false:
    ``system_prompt`` alone, for a model trained from scratch on one toolset, which learns the calls from
    its SFT data (the block is ~220 tokens in every round of configs/ledger.yaml's tokenizer); the json
    format only.

    backend (`mempo.rollout.backends.factory.build_backend`): ``"hf"`` (transformers generate,
    CPU or GPU) or ``"sglang"``: with sglang_url null an ``sglang.Engine`` in this process,
    colocated with the trainer (GPU; its memory, a sglang_mem_fraction share of the GPU, is
    released around the trainer's stages); with sglang_url an SGLang server at that URL (started
    with ``--skip-tokenizer-init``; weights reach it as checkpoints under ``<out>/sglang_weights``).
    dtype: the in-process SGLang engine's weight dtype (None: ``actor.param_dtype``, else
    ``model.dtype``): the generation copy, apart from the fp32 master weights; SGLang only.

    chat_template (`mempo.rollout.chat.ChatFormat`): ``"auto"`` (the tokenizer's own template,
    refused when it rewrites assistant turns; ChatML when the tokenizer has none), ``"builtin"``
    (ChatML) or the path of a Jinja template file.

    protocol_scaffold: generate training rollouts through
    `mempo.rollout.backends.scaffold.ProtocolScaffold` (tags forced, the answer a choice among
    strings of the agent's own context; for random models in tests and tiny demos; HF backend only).
    """

    group_size: int = 16
    max_turns: int = 8
    max_new_tokens_per_round: int = 1024
    max_response_tokens: Optional[int] = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    context_policy: Literal[CONTEXT_POLICIES] = "full"
    backend: Literal["hf", "sglang"] = "hf"
    sglang_url: Optional[str] = None
    sglang_mem_fraction: float = 0.5
    dtype: Optional[Literal["bfloat16", "float16", "float32"]] = None
    chat_template: str = "auto"
    protocol_scaffold: bool = False
    seed: int = 0
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    forced_prefix: str = MEM_PREFIX
    train_forced_prefix: bool = True
    stop_token_ids: Optional[list[int]] = None
    tool_workers: int = 4
    score_mode: Literal["mean", "all", "sum"] = "mean"
    action_format: Literal[ACTION_FORMATS] = "tags"
    tool_schemas: bool = True
    outcome_reward: str = "em"

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "group_size", "max_turns", "max_new_tokens_per_round",
                  "max_response_tokens", "tool_workers")
        _non_negative(self, "top_k", "temperature")  # 0: greedy (evaluation's); training needs > 0
        _require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        _require(0.0 < self.sglang_mem_fraction < 1.0, "sglang_mem_fraction",
                 f"must be in (0, 1), got {self.sglang_mem_fraction!r}")
        _require(self.sglang_url is None or self.sglang_url.startswith(("http://", "https://")), "sglang_url",
                 f"must be an http(s) URL such as 'http://127.0.0.1:30000', or null; got {self.sglang_url!r}")
        _require(self.sglang_url is None or self.backend == "sglang", "sglang_url",
                 "is only used with backend 'sglang'")
        _require(self.chat_template.strip() != "", "chat_template",
                 "must be 'auto', 'builtin' or the path of a Jinja template file")
        _require(not (self.protocol_scaffold and self.backend != "hf"), "protocol_scaffold",
                 "needs backend 'hf' (the scaffold is a transformers logits processor)")
        for i, token in enumerate(self.stop_token_ids or ()):
            _require(token >= 0, f"stop_token_ids[{i}]", f"must be a token id >= 0, got {token!r}")
        _require(self.tool_schemas or self.action_format == "json", "tool_schemas",
                 "says whether the json format's system prompt carries the tools' schemas, and action_format is "
                 "'tags' (no schemas block): leave it true")
        _require(self.outcome_reward in BUILTIN_OUTCOME_REWARDS or is_import_path(self.outcome_reward),
                 "outcome_reward", f"must be one of {BUILTIN_OUTCOME_REWARDS} or an import path "
                                   f"'package.module:function', got {self.outcome_reward!r}")


@dataclass
class ScoringConfig:
    """Memory-reward teacher scoring and the memory reward's definition (ALGORITHM.md section 4,
    `mempo.scoring`, `mempo.algo.memory_reward.compute_memory_rewards`).

    method: ``"auto"`` (default: "cached" on CPU, "packed" on other devices, "reference" for a model
    without a dense-mask path; `mempo.scoring.resolve_method`), ``"packed"``, ``"reference"`` or
    ``"cached"``. threshold: keep answer tokens with
    p > threshold (None: plain geometric mean). token_budget: token positions per scoring forward.

    The definition (defaults: the paper's, mem_reward = P(answer | mem_ctx) - P(answer | full_ctx)):
    comparator: the full context, ``"paper"`` (everything before the round's own output) or
    ``"history_mem"`` (everything through the round's ``</mem>``, so both contexts end in
    ``</mem>``). scored_objectives: ``"all"`` (one P over every objective's gold, the paper's) or
    ``"retrieved"`` (P per objective, the reward averaged over the objectives whose gold appeared in
    a tool result before the round; a round with none gets no memory reward) or ``"complete"`` (P per
    objective over every objective, only in the rounds before which every objective's gold appeared:
    a round with a question still to search gets no memory reward). reward: ``"prob"``
    (P_mem - P_cmp) or ``"log"`` (clip(mean log-prob_mem - mean log-prob_cmp, -log_clip, log_clip),
    which needs threshold null). log_clip: c of the ``"log"`` reward, in nats. objective_reduce:
    how the per-objective gaps of a round become its reward, ``"mean"`` (default) or ``"min"`` (the
    worst-kept retrieved fact; needs scored_objectives ``"retrieved"`` or ``"complete"``). answer_template: the answer
    round scored after each context (`mempo.protocol.grammar.answer_template_text`): ``"line"`` (default, the
    reference's `mempo.protocol.grammar.DEFAULT_ANSWER_TEMPLATE`: the answer on a line of its own),
    ``"spaced"`` (`SPACED_ANSWER_TEMPLATE`: ``<answer> {answer} </answer>``, where a BPE that marks words by
    their leading space writes the first answer as the memory and the search results write it), or a
    template text with ``{answer}`` once. The synthetic cold start's oracle answers in it
    (``synthetic.oracle_answer_template``).
    """

    method: Literal["auto", "packed", "reference", "cached"] = "auto"
    threshold: Optional[float] = 0.5
    token_budget: int = 16384
    comparator: Literal["paper", "history_mem"] = "paper"
    scored_objectives: Literal["all", "retrieved", "complete"] = "all"
    reward: Literal["prob", "log"] = "prob"
    log_clip: float = 1.0
    objective_reduce: Literal["mean", "min"] = "mean"
    answer_template: str = "line"

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "token_budget", "log_clip")
        _require(self.threshold is None or 0.0 < self.threshold <= 1.0, "threshold",
                 f"must be in (0, 1] or null, got {self.threshold!r}")
        _require(self.reward != "log" or self.threshold is None, "threshold",
                 f"must be null with reward 'log' (a mean log-prob over thresholded tokens is 0 when none "
                 f"passes), got {self.threshold!r}")
        try:
            check_answer_template(answer_template_text(self.answer_template))
        except ValueError as exc:
            raise ConfigError("answer_template", str(exc)) from None
        _require(self.objective_reduce == "mean" or self.scored_objectives != "all", "objective_reduce",
                 f"{self.objective_reduce!r} reduces per-objective gaps: it needs scored_objectives 'retrieved' or "
                 f"'complete', got {self.scored_objectives!r}")


@dataclass
class AlgorithmConfig:
    """Advantages (ALGORITHM.md section 5, `mempo.algo.advantages.token_advantages`).

    epsilon: added to the group std. norm_adv_by_std: divide by the std (False: Dr.GRPO centring).
    memory_weight: A = A_out + memory_weight * A_mem. skip_zero_variance_groups: drop the outcome
    part of groups whose scores are all equal from the policy loss (memory advantages still apply).
    memory_pooling: which scored rounds are z-scored together for the memory advantage
    (`mempo.algo.pooling`): ``"group"`` (default, the paper's: all rounds of a group), ``"group_round"``
    (per group and round index) or ``"group_seen"`` (per group and number of objectives whose gold
    was read before the round); the outcome advantage is per group whatever the choice.
    memory_std_floor: the memory z-score divides by max(std, memory_std_floor) + epsilon (default
    0.0: no floor, the paper's), so a pool whose rewards barely differ stays small.
    """

    epsilon: float = 1e-6
    norm_adv_by_std: bool = True
    memory_weight: float = 1.0
    skip_zero_variance_groups: bool = True
    memory_pooling: Literal["group", "group_round", "group_seen"] = "group"
    memory_std_floor: float = 0.0

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "epsilon")
        _non_negative(self, "memory_weight", "memory_std_floor")
        _require(self.memory_std_floor <= 3.4028234663852886e38, "memory_std_floor",
                 f"must be at most 3.4e38 (a float32), got {self.memory_std_floor!r}")


@dataclass
class ActorConfig:
    """The policy update (`mempo.train.actor.Actor`, `mempo.train.losses`).

    Optimiser: AdamW(lr, betas=(beta1, beta2), eps, weight_decay); grad_clip: max global grad norm
    (None: no clipping, the norm is still reported). Loss: PPO-clip with clip-higher (ratio clipped
    to [1 - clip_ratio_low, 1 + clip_ratio_high]) and dual-clip (clip_ratio_c > 1, None: off);
    loss_agg_mode: one of LOSS_AGG_MODES; loss_norm_length: the constant divisor of
    "seq-mean-token-sum-norm" (None: the padded length L of the update batch, which varies; set it to
    the rollout's max response length for Dr.GRPO's constant). KL to the
    reference policy: kl_coef * agg(kl_estimator(log_prob, ref_log_prob)) (kl_coef 0: no reference
    model needed). entropy_coef: bonus subtracted from the loss. ppo_epochs: passes over the batch;
    ppo_mini_batches: optimiser steps per pass. micro_batch_tokens: tokens per forward (padded:
    rows x padded length; packed: real tokens; None: the whole mini-batch). logprob_chunk_tokens:
    rows per lm_head chunk. gradient_checkpointing: recompute decoder layers in backward.
    param_dtype: FSDP2 mixed precision compute dtype (None: the model's dtype; gradients are reduced
    in float32).

    packing: how a micro-batch reaches the model (`compute_log_probs` and `update`). "padded": a
    ``[rows, L]`` batch with a padding mask. "packed": the rows' real tokens concatenated into one
    ``[1, N]`` sequence, each row keeping its own position ids; under a flash-attention
    implementation (``"flash" in attn_implementation``) attention runs through
    ``flash_attn_varlen_func`` with explicit ``cu_seqlens`` (cost ~ sum of squared row lengths, no
    padding), under "sdpa" / "eager" through transformers' block-diagonal causal mask built from the
    position ids (a dense ``N x N`` mask: exact, but attention costs N^2 instead of rows x L^2).
    "auto" (default): packed under flash attention, padded otherwise, because the dense packed
    mask makes SDPA/eager slower, not faster (SDPA computes every block of a dense mask, no causal
    skipping: bench/RESULTS.md, "Teacher scoring", measured it for packed scoring on CPU). The
    update's `config` argument may switch packing per call.

    Rollout correction (`mempo.train.losses.rollout_is_weights`, ALGORITHM.md section 6): the policy
    loss of each token is multiplied by the truncated importance weight
    ``min(pi_train / pi_rollout, rollout_is_cap)`` (detached), pi_train the trained policy before the
    update and pi_rollout the log-prob the generation backend reported for the sampled id.
    rollout_is: "token" (per-token weights), "sequence" (one weight per row: the product of its
    tokens' ratios, then truncated), "off", or "auto" (default): "token" where rollout and training
    are different computations (rollout.backend "sglang", or half-precision compute), a no-op where
    they are the same one (the HF backend generating with the actor's own float32 weights: the
    weights are 1 up to rounding and are not applied; the metrics are logged all the same).
    Forced-prefix ids were not sampled: they get weight 1 and stay out of the metrics.
    rollout_is_cap: the truncation (> 0; verl's default 2.0).
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: Optional[float] = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: Optional[float] = 3.0
    loss_agg_mode: Literal[LOSS_AGG_MODES] = "token-mean"
    loss_norm_length: Optional[int] = None
    kl_coef: float = 0.001
    kl_estimator: Literal[KL_ESTIMATORS] = "low_var_kl"
    entropy_coef: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batches: int = 1
    micro_batch_tokens: Optional[int] = 16384
    logprob_chunk_tokens: int = 1024
    gradient_checkpointing: bool = False
    param_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    packing: Literal["auto", "packed", "padded"] = "auto"
    rollout_is: Literal[ROLLOUT_IS_LEVELS] = "auto"
    rollout_is_cap: float = 2.0

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "lr", "eps", "grad_clip", "clip_ratio_low", "clip_ratio_high", "loss_norm_length",
                  "ppo_epochs", "ppo_mini_batches", "micro_batch_tokens", "logprob_chunk_tokens", "rollout_is_cap")
        _non_negative(self, "weight_decay", "kl_coef", "entropy_coef")
        _require(self.clip_ratio_low < 1.0, "clip_ratio_low", f"must be < 1 (ratio floor 1 - low > 0), "
                                                             f"got {self.clip_ratio_low!r}")
        for name in ("beta1", "beta2"):
            _require(0.0 <= getattr(self, name) < 1.0, name, f"must be in [0, 1), got {getattr(self, name)!r}")
        _require(self.clip_ratio_c is None or self.clip_ratio_c > 1.0, "clip_ratio_c",
                 f"must be > 1 (dual-clip bound) or null, got {self.clip_ratio_c!r}")


@dataclass
class TrainerConfig:
    """The run. total_steps: training steps; save_every / eval_every / log_every: in steps (0: never,
    except a final checkpoint); eval_every runs the ``eval`` section's evaluation after every
    eval_every-th step and logs it as ``eval/...`` metrics; keep_last: checkpoints kept (None:
    all). async_save: write each checkpoint's model and optimiser shards from a background thread
    while the next step runs (`mempo.train.checkpoint.start_checkpoint`: a CPU copy of the rank's
    shards is held until written; the checkpoint is published after that next step, the final one
    at once; `mempo sft` saves in the foreground). out_dir: checkpoints, metrics.jsonl, TensorBoard
    runs. resume: "never" (default: a new run; an out_dir that already holds checkpoints is
    refused, so an old run is never continued under a new config by accident), "auto"
    (``--resume``: the newest intact checkpoint in out_dir, a new run when there is none), or a
    checkpoint directory (that checkpoint, verified) (`mempo sft` uses save_every, keep_last and
    resume for its own checkpoints too). seed: python / numpy / torch seed (rank added per
    process). deterministic: deterministic torch algorithms
    (`mempo.train.trainer.configure_determinism`); None (default): on for CPU runs, off when CUDA
    is used (deterministic CUDA kernels cost speed); true on CUDA also sets
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before CUDA starts."""

    total_steps: int = 100
    save_every: int = 50
    eval_every: int = 0
    log_every: int = 1
    keep_last: Optional[int] = 3
    async_save: bool = False
    out_dir: str = "runs/mempo"
    seed: int = 0
    resume: str = "never"
    deterministic: Optional[bool] = None
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: Optional[str] = None
    progress: bool = True

    def __post_init__(self):
        _check_types(self)
        _positive(self, "total_steps", "log_every", "keep_last")
        _non_negative(self, "save_every", "eval_every")
        _require(self.out_dir.strip() != "", "out_dir", "must be a directory path")
        _require(self.resume.strip() != "", "resume", "must be 'auto', 'never' or a checkpoint directory")


@dataclass
class EvalConfig:
    """Multi-objective evaluation (`mempo eval` and the trainer's ``trainer.eval_every``).
    objectives: numbers of sub-questions per episode to evaluate; max_turns: round limit; policies:
    context policies to evaluate; episodes: per objective count; temperature: 0 is greedy;
    closed_book: also evaluate every policy with a search that finds nothing
    (`mempo.env.closed_book.ClosedBookRetriever`), rows of policy ``"<policy>-closed-book"``: how
    much of the EM comes from retrieval. The evaluation's rollouts run with the ``rollout`` section
    changed by these fields (`mempo.eval.eval_rollout_config`: one sample, no response budget).
    allow_failed_tools: when every tool call of a `mempo eval` run failed (the retriever is down or
    answers errors), the command still writes its report but exits with code 2 and a line saying
    so, unless this is true (then it exits 0; the failed calls are counted in every row either
    way).
    batch_episodes: episodes generated together (one ``generate`` call per round holds that many
    rows; also the progress bar's granularity). Greedy results do not depend on it (tested); more
    rows a call mean fewer calls: on the CPU demo 128 instead of 16 halved the evaluation's time
    (docs/experiments/D07-demo-retrieved-min-c10.md), for a larger KV cache.
    split / validation_episodes (the synthetic world only; `mempo.eval.eval_episodes`): which held-out
    episodes an evaluation reads. ``"test"``: ``episodes`` per k drawn with
    `mempo.seeds.eval_question_seed` (the split results are reported on). ``"validation"``:
    ``validation_episodes`` per k of ``objectives``, drawn with `mempo.seeds.validation_question_seed`
    and asking about no entity a test episode asks about (`mempo.eval.validation_episodes`), for every
    choice a result must not be tuned on (SFT seed, reward definition, steps). With
    ``validation_episodes`` > 0 the validation subjects are held out of SFT and RL data as the test
    subjects are (`mempo.eval.held_out_of_training`); 0 (the default) leaves every draw as it was. `mempo
    eval`, the demo, the trainer's periodic evaluation and the benchmarks (bench/bench_signal.py,
    bench/bench_learning.py, tools/sft_seeds.py) all read ``split``."""

    objectives: list[int] = field(default_factory=lambda: [2, 4, 6, 8, 10])
    max_turns: int = 64
    policies: list[Literal[CONTEXT_POLICIES]] = field(default_factory=lambda: ["memory"])
    episodes: int = 64
    temperature: float = 0.0
    allow_failed_tools: bool = False
    closed_book: bool = False
    batch_episodes: int = 16
    split: Literal["test", "validation"] = "test"
    validation_episodes: int = 0

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "max_turns", "episodes", "batch_episodes")
        _non_negative(self, "temperature", "validation_episodes")
        _require(self.split == "test" or self.validation_episodes > 0, "split",
                 "'validation' reads the validation episodes, and validation_episodes is 0 (none are held out): "
                 "set eval.validation_episodes (per k), or evaluate the 'test' split")
        _require(len(self.objectives) > 0, "objectives", "must list at least one number of objectives")
        for i, k in enumerate(self.objectives):
            _require(k >= 1, f"objectives[{i}]", f"must be >= 1, got {k!r}")
        _require(len(self.policies) > 0, "policies", "must list at least one of 'full', 'memory'")


@dataclass
class SFTConfig:
    """The SFT cold start (`mempo.train.sft.run_sft`): `mempo sft` and the demo's sft stage. The
    `mempo sft` flags are shorthands for these fields (``--trajectories``, ``--steps``,
    ``--epochs``, ``--lr``, ``--batch-tokens``); its checkpoints follow ``trainer.save_every`` /
    ``keep_last`` / ``resume``.

    Data. trajectories: a jsonl of trajectories or ``{"messages": [...]}`` chats
    (`mempo.train.sft.load_sft_records`); null: the synthetic world's oracle makes them (the
    ``synthetic`` section's ``oracle_*`` fields).

    Optimisation. steps / epochs: optimiser steps / passes over the data (both null: one epoch);
    max_seconds: a wall-time bound (null: none); with steps or epochs set it is a safety net (the
    schedule follows the steps) and a run it cuts short says so (`run_sft`'s ``time_bound``). lr:
    AdamW's learning rate (betas, weight decay and grad clip from the ``actor`` section).
    batch_tokens: padded tokens per batch. schedule: ``"constant"`` or ``"cosine"`` (linear warm-up
    over the first ``warmup`` fraction of the run, then cosine decay to lr / 10).
    prompt_loss_weight: the loss also models the prompt tokens (question, previous round, search
    results) with this weight (0: assistant tokens only); a model from scratch learns to copy names
    from its context much sooner.
    """

    trajectories: Optional[str] = None
    steps: Optional[int] = None
    epochs: Optional[float] = None
    max_seconds: Optional[float] = None
    lr: float = 1e-4
    batch_tokens: int = 4096
    schedule: Literal["constant", "cosine"] = "constant"
    warmup: float = 0.05
    prompt_loss_weight: float = 0.0

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _positive(self, "steps", "epochs", "max_seconds", "lr", "batch_tokens")
        _non_negative(self, "prompt_loss_weight")
        _require(0.0 <= self.warmup < 1.0, "warmup", f"must be in [0, 1), got {self.warmup!r}")
        _require(self.trajectories is None or self.trajectories.strip() != "", "trajectories",
                 "must be the path of a jsonl file, or null (the oracle makes the data)")


@dataclass
class SyntheticConfig:
    """The synthetic world and what is built on it (`mempo.synthetic`): the world, its oracle teacher,
    the oracle's cold-start data, the copy warm-up and the demo's tokenizer and model. Every command
    that builds the world (`mempo train`, `eval`, `sft`, `demo` with ``data.source: synthetic``)
    reads this section, so they agree on it.

    task: the synthetic task (`mempo.apps.tasks`): ``"search"`` (default: the world below, k questions an
    episode, the built-in search / access tools) or ``"ledger"`` (`mempo.synthetic.ledger`: accounts whose
    amounts sit on ledger pages, one question an episode over k accounts, the task's own ``lookup`` and
    ``calc`` tools as JSON tool calls; `mempo demo` only: the other commands build the search world and
    refuse it). Under ``"ledger"`` the config needs ``rollout.action_format: json``, ``env.tools: []`` and
    ``data.source: synthetic``; the fields only the other task reads stay at their defaults (a ConfigError
    names one that does not): the world_* size and shape fields, oracle_memory_style, oracle_query_style
    and the scoring_* records under the ledger, the ledger_* fields under the search world. world_seed,
    world_prompt_style (the ledger's: ``"tools"``, the default, or ``"bare"``), the oracle_* fields the
    ledger's teacher reads (objectives, episodes, keep, think, drop_fact_prob, drop_seed, lost_line,
    answer_template, rename), the copy warm-up and the model fields serve both.

    Ledger (`mempo.synthetic.ledger.Ledger.generate`, seed world_seed): ledger_accounts accounts (at least
    `MIN_LEDGER_ACCOUNTS`; 20 % of them test, 10 % validation, the rest train), ledger_page_entries entries
    a page lists (the account looked up and the distractors beside it), ledger_amounts ``[least, most]``
    the range of an account's amount.

    World (`mempo.synthetic.world.World.generate`; every default leaves the world as it was).
    world_seed / world_entities: the seed and the size in entities; world_documents: when set, the
    world has exactly this many documents instead (entities follow); article_fillers: ``[least,
    most]`` filler sentences per entity article (None: 2 to 5; fewer give shorter search results).
    A world has at most `MAX_WORLD_DOCUMENTS` (10^6) documents: world_documents, or world_entities
    times ``1 + world_distractor_ratio`` without it (the world is generated and indexed at every
    start). The world's own rules (known relation names, hops in 1..4, enough documents for the
    entities) are checked when a command starts, before anything is built
    (`mempo.synthetic.build.check_world_config`).
    For small worlds (small models): world_relations (the relations the world has, None: all),
    world_names (``"default"`` or ``"short"``: one-word names), world_article_style (``"full"`` or
    ``"facts"``: fact sentences only), world_chronicles (False: no chronicle documents, every fact in
    its entity's article), world_distractor_ratio (distractor documents per entity),
    world_question_hops (the hops of a question, e.g. [1]; None: 2) and world_prompt_style (the
    episode prompt's layout, None: ``"numbered"``; ``"compact"``: a short instruction paragraph;
    ``"bare"``: none).

    Oracle cold start (`mempo.synthetic.cold_start`), when ``sft.trajectories`` is null. With
    oracle_objectives null (`mempo sft`'s default) the oracle plays the first oracle_episodes
    training episodes under ``rollout.context_policy`` and ``rollout.max_turns``, every trajectory
    kept. With oracle_objectives a list (the demo's way): oracle_episodes episodes of each number of
    objectives, drawn with `mempo.seeds.sft_question_seed`, none asking about an entity an
    evaluation question asks about (`mempo.synthetic.heldout`), under the memory context;
    oracle_keep ``"correct"`` keeps only the correct ones (score 1; all of them when none is),
    ``"all"`` every one. The teacher (`mempo.synthetic.oracle.OracleAgent`): oracle_think its think
    style (``"full"`` sentences, ``"short"`` one line, ``"minimal"`` the question number and the
    action); oracle_memory_style (``"labels"``, ``"facts"``: the found sentences copied, or
    ``"listed"``: facts with a ``Qn: ?`` line for every question from step 1); oracle_query_style
    (``"words"`` or ``"question"``: the question itself is the first query); oracle_drop_fact_prob:
    the teacher's ``<mem>`` loses a fact a later round needs with this probability (the episode then
    fails for it, so a cold-started agent fails the way the memory reward exists to fix);
    oracle_drop_seed: the seed of those draws; oracle_lost_line: how such a lost question's line
    reads (``"bare"``: ``Q<n>: done``; ``"subject"``: ``Q<n>: <subject> done``, so keeping and
    dropping part after the subject both lines write; ``"value"``: the fact sentence with
    ``unknown`` for its value: `mempo.synthetic.oracle_memory.LOST_LINES`); oracle_answer_template:
    the answer round is exactly the teacher-scoring template (``scoring.answer_template``), so
    P(answer | context) is scored on text the model was taught. oracle_rename: every entity name of
    each kept trajectory replaced, consistently within it, by a random name of the same kind that no
    evaluation question asks about (`mempo.synthetic.rename`): SFT cannot learn facts or subjects by
    heart and learns to copy names from the question and the results (the oracle_objectives way
    only). oracle_rename_pool: the names it draws from: ``"not_held_out"`` (those of entities no
    evaluation question asks about) or ``"all"`` (every entity's of the kind: a held-out name then
    stands in a renamed trajectory with facts that are not its own, so SFT writes every name while
    the held-out entities' facts and questions stay out of it; docs/experiments/E9-ablation-execution-9.md).

    Copy warm-up (`mempo.synthetic.copy_warmup`, the demo before SFT): copy_warmup_steps steps on
    random sequences of the world's name ids (0: none) at learning rate copy_warmup_lr.
    copy_warmup_until_loss: stop the warm-up once the mean copy loss of its last 50 steps is at most
    this (the copy head has formed; null: always copy_warmup_steps steps, then the most).
    copy_sft_examples: chat records of the copy task (repeat a random sequence of the world's names,
    held-out ones too: a name carries no fact) added to the cold start's SFT data
    (`mempo.synthetic.copy_warmup.copy_records`; 0: none), so SFT keeps every name trained.
    scoring_sft_examples: records of the teacher-scoring layout added to the cold start's SFT data
    (`mempo.synthetic.scoring_records.scoring_layout_records`; 0: none): the question, a later
    round's ``<mem>`` as untrained context, and the answer that memory alone gives in the scoring
    template, so P(answer | mem_ctx) is measured on a layout the model was taught.
    scoring_records_layout: where those records put the memory: ``"question"`` right after the question
    (teacher scoring's mem_ctx), ``"later_round"`` after an empty assistant turn and an empty user
    turn, a later round's place (round 1 never answers: docs/experiments/T10-blank-layout-records.md measured both).
    scoring_records_memories: which memories those records hold: ``"any"`` or ``"complete"`` (only
    those with a value for every question, so no record answers ``unknown``).

    The demo's tokenizer and model (`mempo demo`). vocab_size: the tokenizer's size.
    tokenizer_documents: documents the tokenizer is trained on (plus every oracle text).
    model_size: a `mempo.model.builtin.SIZES` name; model_layers: its number of layers instead of the
    size's (null: the size's). max_position_embeddings: the model's context.
    tie_embeddings: share the input embedding and the output head (`tiny_model`): the head row of a
    name the SFT targets never contain is then that name's input embedding (trained wherever the
    name is read) rather than a row only ever pushed down, which helps copying names from the
    context. torch_threads: torch intra-op threads (0: the CPUs other processes leave idle, from
    /proc/stat sampled over half a second, at least 1). model_seed: the model's initialisation, the
    copy warm-up's and the SFT data order's seed.
    """

    task: Literal["search", "ledger"] = "search"
    world_seed: int = 0
    world_entities: int = 200
    world_documents: Optional[int] = None
    article_fillers: Optional[list[int]] = None
    world_relations: Optional[list[str]] = None
    world_names: Literal["default", "short"] = "default"
    world_article_style: Literal["full", "facts"] = "full"
    world_chronicles: bool = True
    world_distractor_ratio: float = 1.0
    world_question_hops: Optional[list[int]] = None
    world_prompt_style: Optional[Literal["numbered", "joined", "compact", "bare"]] = None
    oracle_objectives: Optional[list[int]] = None
    oracle_episodes: int = 16
    oracle_keep: Literal["correct", "all"] = "correct"
    oracle_think: Literal["full", "short", "minimal"] = "full"
    oracle_memory_style: Literal["labels", "facts", "listed"] = "labels"
    oracle_query_style: Literal["words", "question"] = "words"
    oracle_drop_fact_prob: float = 0.0
    oracle_drop_seed: int = 0
    oracle_lost_line: Literal["bare", "subject", "value"] = "bare"
    oracle_answer_template: bool = False
    oracle_rename: bool = False
    oracle_rename_pool: Literal["not_held_out", "all"] = "not_held_out"
    copy_warmup_steps: int = 1000
    copy_warmup_lr: float = 1e-3
    copy_warmup_until_loss: Optional[float] = None
    copy_sft_examples: int = 0
    scoring_sft_examples: int = 0
    scoring_records_layout: Literal["question", "later_round"] = "question"
    scoring_records_memories: Literal["any", "complete"] = "any"
    vocab_size: int = 4096
    tokenizer_documents: int = 2000
    model_size: Literal["tiny", "mini", "small"] = "mini"
    model_layers: Optional[int] = None
    max_position_embeddings: int = 2048
    tie_embeddings: bool = True
    torch_threads: int = 0
    model_seed: int = 0
    ledger_accounts: int = 1000
    ledger_page_entries: int = 4
    ledger_amounts: list[int] = field(default_factory=lambda: [1, 9])

    def __post_init__(self):
        _check_types(self)
        _finite(self)
        _non_negative(self, "world_distractor_ratio", "torch_threads", "copy_warmup_steps", "copy_sft_examples",
                       "scoring_sft_examples")
        _positive(self, "oracle_episodes", "vocab_size", "tokenizer_documents", "max_position_embeddings",
                  "copy_warmup_lr", "copy_warmup_until_loss")
        _require(self.world_relations is None or len(self.world_relations) > 0, "world_relations",
                 "must list at least one relation, or be null (all)")
        _require(self.world_question_hops is None or (len(self.world_question_hops) > 0
                                                      and all(h >= 1 for h in self.world_question_hops)),
                 "world_question_hops",
                 f"must be a non-empty list of hops >= 1, or null; got {self.world_question_hops}")
        _require(not self.oracle_rename or self.oracle_objectives is not None, "oracle_rename",
                 "renames the cold start drawn per oracle_objectives, which is null: set oracle_objectives")
        _require(self.oracle_rename_pool == "not_held_out" or self.oracle_rename, "oracle_rename_pool",
                 "says which names oracle_rename draws from, and oracle_rename is false: set it, or leave the pool "
                 "'not_held_out'")
        _require(not self.copy_sft_examples or self.oracle_objectives is not None, "copy_sft_examples",
                 "adds to the cold start drawn per oracle_objectives, which is null: set oracle_objectives")
        _require(not self.scoring_sft_examples or self.oracle_objectives is not None, "scoring_sft_examples",
                 "adds to the cold start drawn per oracle_objectives, which is null: set oracle_objectives")
        _require(self.scoring_records_layout == "question" or self.scoring_sft_examples > 0, "scoring_records_layout",
                 "places the scoring-layout records, and scoring_sft_examples is 0: set it, or leave the layout "
                 "'question'")
        _require(self.scoring_records_memories == "any" or self.scoring_sft_examples > 0, "scoring_records_memories",
                 "selects the scoring-layout records, and scoring_sft_examples is 0: set it, or leave it 'any'")
        _require(self.oracle_lost_line == "bare" or self.oracle_drop_fact_prob > 0, "oracle_lost_line",
                 "says how a lost question reads, and oracle_drop_fact_prob is 0 (no question is lost): "
                 "set it, or leave the line 'bare'")
        _require(self.model_layers is None or self.model_layers >= 1, "model_layers",
                 f"must be a number of layers >= 1, or null (the size's); got {self.model_layers}")
        _require(self.world_entities >= 20, "world_entities",
                 f"must be >= 20 (the synthetic world's smallest size), got {self.world_entities}")
        _require(self.world_documents is None or self.world_documents > 0, "world_documents",
                 f"must be a positive number of documents or null, got {self.world_documents}")
        _require(self.world_entities <= MAX_WORLD_DOCUMENTS, "world_entities",
                 f"must be at most {MAX_WORLD_DOCUMENTS:,} (a world's documents are generated and indexed at "
                 f"every start), got {self.world_entities}")
        _require(self.world_documents is None or self.world_documents <= MAX_WORLD_DOCUMENTS, "world_documents",
                 f"must be at most {MAX_WORLD_DOCUMENTS:,} (generated and indexed at every start), got "
                 f"{self.world_documents}")
        documents = self.world_entities * (1.0 + self.world_distractor_ratio)
        _require(self.world_documents is not None or documents <= MAX_WORLD_DOCUMENTS, "world_distractor_ratio",
                 f"{self.world_distractor_ratio!r} distractors for each of {self.world_entities} entities make "
                 f"{documents:,.0f} documents, more than {MAX_WORLD_DOCUMENTS:,} (generated and indexed at every "
                 "start); lower it or set world_documents")
        fillers = self.article_fillers
        _require(fillers is None or (len(fillers) == 2 and 0 <= fillers[0] <= fillers[1]), "article_fillers",
                 f"must be [least, most] with 0 <= least <= most, or null; got {fillers}")
        _require(0.0 <= self.oracle_drop_fact_prob <= 1.0, "oracle_drop_fact_prob",
                 f"must be in [0, 1], got {self.oracle_drop_fact_prob!r}")
        if self.oracle_objectives is not None:
            _require(len(self.oracle_objectives) > 0, "oracle_objectives",
                     "must list at least one number of objectives, or be null")
            for i, k in enumerate(self.oracle_objectives):
                _require(k >= 1, f"oracle_objectives[{i}]", f"must be >= 1, got {k!r}")
        _require(MIN_LEDGER_ACCOUNTS <= self.ledger_accounts <= MAX_WORLD_DOCUMENTS, "ledger_accounts",
                 f"must be in [{MIN_LEDGER_ACCOUNTS}, {MAX_WORLD_DOCUMENTS:,}] (each split holds some; generated at "
                 f"every start), got {self.ledger_accounts}")
        _require(self.ledger_page_entries >= 1, "ledger_page_entries",
                 f"must be >= 1 (entries a page lists), got {self.ledger_page_entries}")
        amounts = self.ledger_amounts
        _require(len(amounts) == 2 and 1 <= amounts[0] < amounts[1] <= MAX_LEDGER_AMOUNT, "ledger_amounts",
                 f"must be [least, most] with 1 <= least < most <= {MAX_LEDGER_AMOUNT:,}, got {amounts}")
        other_task = _SEARCH_ONLY_FIELDS if self.task == "ledger" else _LEDGER_ONLY_FIELDS
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self)}
        for name in other_task:
            _require(getattr(self, name) == defaults[name], name,
                     f"describes the {'search' if self.task == 'ledger' else 'ledger'} task's world or teacher, and "
                     f"task is {self.task!r}: leave it at its default ({defaults[name]!r})")
        _require(self.task != "ledger" or self.world_prompt_style in (None, "tools", "bare"), "world_prompt_style",
                 f"the ledger's prompts are 'tools' (default) or 'bare'; {self.world_prompt_style!r} names the search "
                 "tools")


#: ``synthetic`` fields only the search world and its teacher read (`SyntheticConfig`: left at their defaults
#: under ``task: ledger``) and only the ledger reads (left at theirs under ``task: search``).
_SEARCH_ONLY_FIELDS = ("world_entities", "world_documents", "article_fillers", "world_relations", "world_names",
                       "world_article_style", "world_chronicles", "world_distractor_ratio", "world_question_hops",
                       "oracle_memory_style", "oracle_query_style", "scoring_sft_examples", "scoring_records_layout",
                       "scoring_records_memories")
_LEDGER_ONLY_FIELDS = ("ledger_accounts", "ledger_page_entries", "ledger_amounts")


@dataclass
class MempoConfig:
    """The whole configuration: one field per section, every field with a default (so no file at all
    is a valid configuration), each section validated when built (a `ConfigError` names the field)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, hints[f.name]):
                setattr(self, f.name, build_section(hints[f.name], value, f.name))
        _require(not (flash_attention_requested(self.model.attn_implementation) and self.model.dtype == "float32"
                      and self.actor.param_dtype not in ("bfloat16", "float16")), "model.dtype",
                 f"must be 'bfloat16' or 'float16' with attn_implementation={self.model.attn_implementation!r} "
                 "(flash attention has no fp32 kernels), unless actor.param_dtype is bfloat16 or float16 (fp32 "
                 "master weights, half-precision compute under torchrun); or use model.attn_implementation=sdpa")
        _require(self.rollout.dtype is None or self.rollout.backend == "sglang", "rollout.dtype",
                 f"sets the SGLang engine's weight dtype; rollout.backend={self.rollout.backend!r} generates with "
                 "the actor's own weights (model.dtype; actor.param_dtype under torchrun): leave it null")
        _require(self.rollout.temperature > 0, "rollout.temperature",
                 f"must be > 0, got {self.rollout.temperature!r} (training samples with it and divides the "
                 "logits by it; evaluation's is eval.temperature, 0 for greedy)")
        _require(not self.eval.closed_book or set(self.env.tools) <= set(BUILTIN_TOOL_NAMES), "eval.closed_book",
                 "runs the built-in search over a retriever that finds nothing; with a user's tools in env.tools "
                 "a closed book is not defined: set it false")
        if self.synthetic.task == "ledger":  # the ledger brings its tools and its teacher writes JSON calls
            _require(self.data.source == "synthetic", "synthetic.task",
                     f"'ledger' is a synthetic world, and data.source is {self.data.source!r}: set data.source "
                     "synthetic, or leave the task 'search'")
            _require(not self.env.tools, "env.tools",
                     f"must be [] with synthetic.task 'ledger' (its tools, lookup and calc, come with the ledger: "
                     f"mempo.synthetic.ledger_tools), got {self.env.tools}")
            _require(self.rollout.action_format == "json", "rollout.action_format",
                     "must be 'json' with synthetic.task 'ledger' (its teacher writes JSON tool calls)")
        if self.data.gold_field is None:  # no reference answers: nothing may need one
            _require(is_import_path(self.rollout.outcome_reward), "rollout.outcome_reward",
                     f"{self.rollout.outcome_reward!r} compares the answer with reference answers, and "
                     "data.gold_field is null (the records have none): name your reward function "
                     "'package.module:function'")
            _require(self.algorithm.memory_weight == 0, "algorithm.memory_weight",
                     "must be 0 when data.gold_field is null: the memory reward scores P(reference answer | "
                     "memory), and the records have no reference answer (train with the outcome reward only)")
            _require(self.algorithm.memory_pooling != "group_seen", "algorithm.memory_pooling",
                     "'group_seen' counts the reference answers read, and data.gold_field is null")
        _require(self.data.source == "synthetic" or self.eval.split == "test", "eval.split",
                 "'validation' is a split of the synthetic world (disjoint by entity from its test episodes); "
                 "with data.source 'files' the evaluation reads data.eval_files: leave it 'test'")
        _require(self.data.source == "synthetic" or self.eval.validation_episodes == 0, "eval.validation_episodes",
                 "holds out validation episodes of the synthetic world; with data.source 'files' there is no such "
                 "split: leave it 0")
        _require(not (self.trainer.eval_every and self.data.source == "files" and not self.data.eval_files),
                 "data.eval_files", "must list at least one QA file when data.source is 'files' and "
                                    "trainer.eval_every > 0 (the periodic evaluation's questions)")
