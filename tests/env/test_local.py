"""What local retrievers share (`mempo.env.local`): the exact top-k row selection."""


def test_topk_selection_is_exact():
    import numpy as np

    from mempo.env.local import topk_rows

    rng = np.random.default_rng(0)
    for _ in range(300):
        n, k = int(rng.integers(1, 3000)), int(rng.integers(1, 20))
        density = rng.random()
        scores = np.where(rng.random(n) < density, np.round(rng.random(n) * 3, 1), 0).astype(np.float32)
        positive = np.flatnonzero(scores > 0)
        expected = positive[np.lexsort((positive, -scores[positive]))][:k]  # best first, ties to the lower row
        assert np.array_equal(topk_rows(scores, k, block=int(rng.integers(2, 70))), expected)
