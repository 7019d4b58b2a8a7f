"""mempo.seeds: every derived seed by name, with the numbers the code used before they were named
(a change here changes every sampled trajectory and every drawn question set)."""
from mempo.seeds import (CALL_SEED_STRIDE, EVAL_SEED_OFFSET, SEED_MODULUS, SFT_SEED_OFFSET, STEP_SEED_STRIDE,
                         VALIDATION_SEED_OFFSET, eval_question_seed, generation_seed, sft_question_seed,
                         training_rollout_seed, validation_question_seed)


def test_the_constants_keep_their_values():
    assert (SEED_MODULUS, STEP_SEED_STRIDE, CALL_SEED_STRIDE) == (2 ** 31 - 1, 1_000_003, 10_007)
    assert (EVAL_SEED_OFFSET, SFT_SEED_OFFSET, VALIDATION_SEED_OFFSET) == (10_000, 20_000, 30_000)


def test_derivations():
    assert training_rollout_seed(0, 1) == 1 and training_rollout_seed(3, 2) == 3_000_011
    assert training_rollout_seed(5_000, 7) == (5_000 * 1_000_003 + 7) % (2 ** 31 - 1) == 705_047_713
    # the engine of training step 2 (rollout.seed 3), first call, third generation step
    assert generation_seed(training_rollout_seed(3, 2), 0, 2) == 2_132_828_823
    assert generation_seed(0, 1, 0) == 10_007 and 0 <= generation_seed(2 ** 40, 99, 99) < SEED_MODULUS
    assert eval_question_seed(4, 2) == 10_006 and sft_question_seed(4, 2) == 20_006
    assert validation_question_seed(4, 8) == 30_012
