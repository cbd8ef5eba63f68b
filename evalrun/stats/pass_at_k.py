"""pass@k: the chance that at least one of k samples of a program passes its tests, estimated without bias from n
samples of which c passed (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"), as HumanEval's
``estimate_pass_at_k`` and Hugging Face's ``code_eval`` (which lm-eval's code tasks call) compute it: per problem,
then the mean over problems."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n - c, k) / C(n, k)``, as the product ``prod(1 - k / i for i in n-c+1..n)`` (the form the reference
    implementations use, stable for large n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
