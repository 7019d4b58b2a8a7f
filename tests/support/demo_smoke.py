"""The overrides of the smallest `mempo demo` run (every stage, tiny sizes; tests/apps/test_demo.py,
tests/test_no_gold.py)."""

SMOKE = [
    # no filler sentences: a 400-id tokenizer keeps the names as single ids only without their words
    "data.world_documents=120", "data.article_fillers=[0,0]", "demo.vocab_size=400", "demo.tokenizer_documents=60", "demo.model_size=tiny",
    "demo.copy_warmup_steps=2",
    "demo.max_position_embeddings=2048", "sft.objectives=[1]", "sft.episodes=2", "sft.steps=1",
    "sft.batch_tokens=2048", "demo.torch_threads=1",
    "trainer.total_steps=1", "data.questions_per_step=1", "rollout.group_size=2", "rollout.max_turns=2",
    "rollout.max_new_tokens_per_round=16", "rollout.max_response_tokens=512",
    "eval.objectives=[2,4]", "eval.episodes=2", "eval.max_turns=2",
]
