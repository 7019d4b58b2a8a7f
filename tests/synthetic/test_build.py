"""mempo.synthetic.build: the small-world options of the config reach the world; bad ones name their field."""
import pytest

from mempo.config import ConfigError, load_config
from mempo.synthetic.build import synthetic_world
from support.small_world import SMALL


def test_world_options_reach_the_world():
    world = synthetic_world(load_config(None, SMALL))
    assert {e.kind for e in world.entities} == {"person", "city", "university"}
    assert all(" " not in e.name for e in world.entities)  # one-word names
    assert world.num_documents == len(world.entities)  # no chronicles, no distractors
    episode = world.episodes(2, 1, seed=0)[0]
    assert "Give all 2 answers in one <answer>" in episode.prompt  # the compact prompt
    assert all(len(q.split()) <= 8 for q in episode.questions)
    relations = {f.relation for e in world.entities for f in getattr(e, "facts", ())}
    assert relations <= {"birthplace", "alma_mater"}
    # the defaults leave the world as it was
    assert synthetic_world(load_config(None, ["synthetic.world_entities=40"])).manifest() == \
        synthetic_world(load_config(None, ["synthetic.world_entities=40", "synthetic.world_names=default",
                                           "synthetic.world_chronicles=true"])).manifest()


@pytest.mark.parametrize("override, field", [("synthetic.world_relations=[]", "synthetic.world_relations"),
                                              ("synthetic.world_question_hops=[0]", "synthetic.world_question_hops"),
                                              ("synthetic.world_distractor_ratio=-1", "synthetic.world_distractor_ratio"),
                                              ("synthetic.world_names=long", "synthetic.world_names"),
                                              ("synthetic.oracle_drop_fact_prob=1.5", "synthetic.oracle_drop_fact_prob"),
                                              ("synthetic.copy_warmup_steps=-1", "synthetic.copy_warmup_steps")])
def test_bad_options_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])
