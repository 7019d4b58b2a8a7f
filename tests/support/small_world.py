"""Config overrides of a small learnable world (the demo's kind, 200 entities): tests/synthetic/test_build.py,
tests/synthetic/test_cold_start.py."""

SMALL = ["synthetic.world_entities=200", "synthetic.world_relations=[birthplace,alma_mater]",
         "synthetic.world_names=short", "synthetic.world_article_style=facts", "synthetic.article_fillers=[0,0]",
         "synthetic.world_chronicles=false", "synthetic.world_distractor_ratio=0", "synthetic.world_question_hops=[1]",
         "synthetic.world_prompt_style=compact"]
