"""mempo.env.build: the small-world options of the config reach the world; bad ones name their field."""
import pytest

from mempo.config import ConfigError, load_config
from mempo.env.build import synthetic_world
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
    assert synthetic_world(load_config(None, ["data.world_entities=40"])).manifest() == \
        synthetic_world(load_config(None, ["data.world_entities=40", "data.world_names=default",
                                           "data.world_chronicles=true"])).manifest()


@pytest.mark.parametrize("override, field", [("data.world_relations=[]", "data.world_relations"),
                                              ("data.world_question_hops=[0]", "data.world_question_hops"),
                                              ("data.world_distractor_ratio=-1", "data.world_distractor_ratio"),
                                              ("data.world_names=long", "data.world_names"),
                                              ("sft.oracle_drop_fact_prob=1.5", "sft.oracle_drop_fact_prob"),
                                              ("demo.copy_warmup_steps=-1", "demo.copy_warmup_steps")])
def test_bad_options_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])
