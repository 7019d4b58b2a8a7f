"""Config overrides of a small learnable world (the demo's kind, 200 entities): tests/env/test_build.py,
tests/train/test_sft_cold_start.py."""

SMALL = ["data.world_entities=200", "data.world_relations=[birthplace,alma_mater]", "data.world_names=short",
         "data.world_article_style=facts", "data.article_fillers=[0,0]", "data.world_chronicles=false",
         "data.world_distractor_ratio=0", "data.world_question_hops=[1]", "data.world_prompt_style=compact"]
