"""Korch's BLP selector against a brute-force oracle on random DAGs of at most 12 nodes."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from tvm_ext.select.blp import SelectionError, components, solve_cover


def _random_dag(rng: random.Random, n: int) -> dict[int, set[int]]:
    """Node -> consumers, edges only from lower to higher index."""
    return {i: {j for j in range(i + 1, n) if rng.random() < 0.3} for i in range(n)}


def _convex(dag: dict[int, set[int]], members: set[int]) -> bool:
    """No path leaves the set and comes back."""
    outside = [c for m in members for c in dag[m] if c not in members]
    seen, stack = set(), list(outside)
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        for c in dag[x]:
            if c in members:
                return False
            stack.append(c)
    return True


def _candidates(rng: random.Random, dag, n: int) -> list[frozenset[int]]:
    """Every node alone, plus random convex sets grown along edges."""
    sets = {frozenset([i]) for i in range(n)}
    for _ in range(rng.randint(3, 16)):
        members = {rng.randrange(n)}
        for _ in range(rng.randint(1, 4)):
            frontier = [c for m in members for c in dag[m] if c not in members]
            if not frontier:
                break
            members.add(rng.choice(frontier))
        if _convex(dag, members):
            sets.add(frozenset(members))
    return sorted(sets, key=sorted)


def _brute_force(sets: list[frozenset[int]], prices: list[float], n: int) -> float:
    """The cheapest exact cover by exhaustive search over every cover (lowest uncovered node first)."""
    best = math.inf
    by_node = {i: [j for j, s in enumerate(sets) if i in s] for i in range(n)}

    def search(covered: frozenset[int], cost: float) -> None:
        nonlocal best
        if cost >= best:
            return
        missing = next((i for i in range(n) if i not in covered), None)
        if missing is None:
            best = cost
            return
        for j in by_node[missing]:
            if not (sets[j] & covered):
                search(covered | sets[j], cost + prices[j])

    search(frozenset(), 0.0)
    return best


@pytest.mark.parametrize("seed", range(200))
def test_blp_equals_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    dag = _random_dag(rng, n)
    sets = _candidates(rng, dag, n)
    # singletons cost a launch each; a fused set saves part of the launches and some traffic
    prices = [len(s) * 1.0 - rng.uniform(0.0, 0.9) * (len(s) - 1) + rng.uniform(0.0, 0.2) for s in sets]
    chosen, status = solve_cover(sets, prices)
    assert status == "optimal"
    assert sorted(itertools.chain.from_iterable(sets[j] for j in chosen)) == list(range(n))   # an exact cover
    assert sum(prices[j] for j in chosen) == pytest.approx(_brute_force(sets, prices, n), abs=1e-9)


def test_components_split_independent_parts():
    assert sorted(map(sorted, components([{0, 1}, {2}, {1, 3}, {4, 5}, {5}]))) == [[0, 2], [1], [3, 4]]


def test_no_cover_is_a_clear_error():
    with pytest.raises(SelectionError, match="no exact cover"):
        solve_cover([{0, 1}, {1, 2}], [1.0, 1.0])
