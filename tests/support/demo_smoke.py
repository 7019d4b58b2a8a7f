"""The overrides of the smallest `mempo demo` runs (every stage, tiny sizes; tests/apps/test_demo.py,
tests/test_no_gold.py): `SMOKE` for configs/demo.yaml, `LEDGER_SMOKE` for configs/ledger.yaml."""

SMOKE = [
    # no filler sentences: a 400-id tokenizer keeps the names as single ids only without their words
    "synthetic.world_documents=120", "synthetic.article_fillers=[0,0]", "synthetic.vocab_size=400",
    "synthetic.tokenizer_documents=60", "synthetic.model_size=tiny",
    "synthetic.copy_warmup_steps=2",
    "synthetic.max_position_embeddings=2048", "synthetic.oracle_objectives=[1]", "synthetic.oracle_episodes=2",
    "sft.steps=1", "sft.batch_tokens=2048", "synthetic.torch_threads=1",
    "trainer.total_steps=1", "data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
    "rollout.max_new_tokens_per_round=16", "rollout.max_response_tokens=512",
    "eval.objectives=[2,4]", "eval.episodes=2", "eval.max_turns=2",
]

#: configs/ledger.yaml's smallest run: 40 accounts (8 test, 4 validation, 28 train), a 400-id tokenizer, a tiny model
LEDGER_SMOKE = [
    "synthetic.ledger_accounts=40", "synthetic.vocab_size=400", "synthetic.tokenizer_documents=10",
    "synthetic.model_size=tiny", "synthetic.copy_warmup_steps=2", "synthetic.oracle_objectives=[1,2]",
    "synthetic.oracle_episodes=2", "sft.steps=1", "synthetic.torch_threads=1",
    "trainer.total_steps=1", "data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
    "rollout.max_new_tokens_per_round=16", "rollout.max_response_tokens=512",
    "eval.objectives=[2,4]", "eval.episodes=2", "eval.max_turns=2",
]
