"""mempo.synthetic.build: the small-world options of the config reach the world; bad ones name their field."""
import pytest

from mempo.config import ConfigError, load_config
from mempo.synthetic.build import check_world_config, synthetic_world
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


@pytest.mark.parametrize("override, field", [
    ("synthetic.world_relations=[]", "synthetic.world_relations"),
    ("synthetic.world_question_hops=[0]", "synthetic.world_question_hops"),
    ("synthetic.world_distractor_ratio=-1", "synthetic.world_distractor_ratio"),
    ("synthetic.world_names=long", "synthetic.world_names"),
    ("synthetic.oracle_drop_fact_prob=1.5", "synthetic.oracle_drop_fact_prob"),
    ("synthetic.copy_warmup_steps=-1", "synthetic.copy_warmup_steps"),
])
def test_bad_options_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])


@pytest.mark.parametrize("override, field, reason", [
    # issue 47 C36, C37, C39: World.generate's ValueErrors escaped `mempo train` as tracebacks
    ("synthetic.world_relations=[no_such_relation]", "synthetic.world_relations", "unknown: ['no_such_relation']"),
    ("synthetic.world_question_hops=[50]", "synthetic.world_question_hops", "hops must be in 1..4"),
    ("synthetic.world_documents=1", "synthetic.world_documents", "num_documents=1 is too small for 20 entities"),
])
def test_the_world_s_own_checks_name_the_field_before_anything_is_built(override, field, reason):
    cfg = load_config(None, [override])  # the section's ranges hold; the world's rules are the world's
    with pytest.raises(ConfigError) as error:
        check_world_config(cfg)
    assert error.value.field == field and reason in str(error.value)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        synthetic_world(cfg)
    check_world_config(load_config(None, SMALL))  # the demo's small world passes
