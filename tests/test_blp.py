"""Korch's BLP selector against a brute-force oracle on random DAGs of at most 12 nodes."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from tvm_ext.select.blp import SelectionError, components, kernel_cycle, solve_cover


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


def _producers(dag: dict[int, set[int]]) -> dict[int, set[int]]:
    return {i: {p for p in dag if i in dag[p]} for i in dag}


def _candidates(rng: random.Random, dag, n: int) -> list[frozenset[int]]:
    """Every node alone, random convex sets grown along edges, and random convex unions of two
    grown sets (which can depend on each other both ways: covers with kernel cycles)."""
    sets = {frozenset([i]) for i in range(n)}
    for _ in range(rng.randint(2, 10)):
        pair = frozenset(rng.sample(range(n), 2)) if n >= 2 else frozenset([0])
        if _convex(dag, set(pair)):
            sets.add(pair)
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


def _orderable(dag, chosen: list[frozenset[int]]) -> bool:
    """The chosen sets' kernels have a launch order (their quotient graph has no cycle)."""
    home = {m: k for k, s in enumerate(chosen) for m in s}
    deps = {k: {home[c] for m in s for c in dag[m] if home[c] != k} for k, s in enumerate(chosen)}
    done: set[int] = set()
    while len(done) < len(chosen):
        ready = [k for k in deps if k not in done and not (deps[k] - done)]
        if not ready:
            return False
        done.update(ready)
    return True


def _brute_force(dag, sets: list[frozenset[int]], prices: list[float], n: int) -> float:
    """The cheapest exact cover with a launch order, by exhaustive search over every exact cover
    (lowest uncovered node first)."""
    best = math.inf
    by_node = {i: [j for j, s in enumerate(sets) if i in s] for i in range(n)}

    def search(covered: frozenset[int], picked: list[int], cost: float) -> None:
        nonlocal best
        if cost >= best:
            return
        missing = next((i for i in range(n) if i not in covered), None)
        if missing is None:
            if _orderable(dag, [sets[j] for j in picked]):
                best = cost
            return
        for j in by_node[missing]:
            if not (sets[j] & covered):
                search(covered | sets[j], picked + [j], cost + prices[j])

    search(frozenset(), [], 0.0)
    return best


def _case(seed: int):
    """Random case ``seed``: a DAG of 2-12 nodes, its convex candidate sets and their prices."""
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    dag = _random_dag(rng, n)
    sets = _candidates(rng, dag, n)
    # singletons cost a launch each; a fused set saves part of the launches and some traffic
    prices = [len(s) * 1.0 - rng.uniform(0.0, 0.9) * (len(s) - 1) + rng.uniform(0.0, 0.2) for s in sets]
    return n, dag, sets, prices


@pytest.mark.parametrize("seed", range(200))
def test_blp_equals_brute_force(seed):
    n, dag, sets, prices = _case(seed)
    cover = solve_cover(sets, prices, producers=_producers(dag))
    assert set(cover.statuses) == {"optimal"}
    chosen = cover.chosen
    assert sorted(itertools.chain.from_iterable(sets[j] for j in chosen)) == list(range(n))   # an exact cover
    assert _orderable(dag, [sets[j] for j in chosen])
    assert sum(prices[j] for j in chosen) == pytest.approx(_brute_force(dag, sets, prices, n), abs=1e-9)


def test_oracle_covers_include_cyclic_ones():
    """The 200 random cases do exercise the cycle cuts (10 of them need one; at least 5 asked)."""
    cuts = []
    for seed in range(200):
        _, dag, sets, prices = _case(seed)
        cuts.append(solve_cover(sets, prices, producers=_producers(dag)).cuts)
    assert sum(c > 0 for c in cuts) >= 5, cuts


def test_two_convex_sets_feeding_each_other_are_cut():
    # 0 -> 1, 2 -> 3; {0, 3} and {1, 2} are both convex but need each other: no launch order
    dag = {0: {1}, 1: set(), 2: {3}, 3: set()}
    sets = [{0, 3}, {1, 2}, {0}, {1}, {2}, {3}]
    assert sorted(kernel_cycle([sets[0], sets[1]], _producers(dag))) == [0, 1]
    cover = solve_cover(sets, [1.0, 1.0, 0.9, 0.9, 0.9, 0.9], producers=_producers(dag))
    assert cover.cuts == 1
    # the best orderable cover keeps one pair: 1.0 + 0.9 + 0.9 < 4 x 0.9
    assert sum([1.0, 1.0, 0.9, 0.9, 0.9, 0.9][j] for j in cover.chosen) == pytest.approx(2.8)
    # without the graph's edges the cycle is not seen
    assert solve_cover(sets, [1.0, 1.0, 0.9, 0.9, 0.9, 0.9]).chosen == [0, 1]


def test_components_split_independent_parts():
    assert sorted(map(sorted, components([{0, 1}, {2}, {1, 3}, {4, 5}, {5}]))) == [[0, 2], [1], [3, 4]]


def test_no_cover_is_a_clear_error():
    with pytest.raises(SelectionError, match="no exact acyclic cover"):
        solve_cover([{0, 1}, {1, 2}], [1.0, 1.0])


# --- recomputation: a set may recompute a node (compute it for itself, write it for nobody) -----

def _written(dag, members: frozenset[int], rec: frozenset[int], sinks: set[int]) -> set[int]:
    return {m for m in members - rec if m in sinks or any(c not in members for c in dag[m])}


def _valid_program(dag, chosen: list[tuple[frozenset[int], frozenset[int]]], sinks: set[int]) -> bool:
    """Every value a kernel reads from outside is written by a chosen kernel, every sink is
    written, and the kernels have a launch order (a reader after every writer of what it reads)."""
    writes = [_written(dag, s, r, sinks) for s, r in chosen]
    written = set().union(*writes) if writes else set()
    if not sinks <= written:
        return False
    producers = _producers(dag)
    deps: dict[int, set[int]] = {}
    for k, (s, _) in enumerate(chosen):
        for m in s:
            for p in producers[m] - s:
                if p not in written:
                    return False
                deps.setdefault(k, set()).update(w for w, ws in enumerate(writes) if p in ws and w != k)
    done: set[int] = set()
    while len(done) < len(chosen):
        ready = [k for k in range(len(chosen)) if k not in done and not (deps.get(k, set()) - done)]
        if not ready:
            return False
        done.update(ready)
    return True


def _brute_force_recompute(dag, sets, recs, prices, n: int, sinks: set[int]) -> float:
    """Every choice of sets in which each node is computed for others by at most one set (exactly
    one outside the recomputed nodes); the cheapest valid program."""
    best = math.inf
    shared = set().union(*recs)
    for k in range(1, len(sets) + 1):
        for picked in itertools.combinations(range(len(sets)), k):
            cost = sum(prices[j] for j in picked)
            if cost >= best:
                continue
            normal = [n_ for j in picked for n_ in sets[j] - recs[j]]
            if any(normal.count(i) != 1 for i in range(n) if i not in shared):
                continue
            if any(normal.count(i) > 1 for i in shared):
                continue
            if _valid_program(dag, [(sets[j], recs[j]) for j in picked], sinks):
                best = cost
    return best


def _recompute_case(seed: int):
    """A DAG of 4-7 nodes; sets as in the exact cases, plus sets that also recompute an input
    with several consumers (priced a little above the set alone: they write nothing more)."""
    rng = random.Random(1000 + seed)
    n = rng.randint(4, 7)
    dag = {i: {j for j in range(i + 1, n) if rng.random() < 0.4} for i in range(n)}
    producers = _producers(dag)
    base = [s for s in _candidates(rng, dag, n) if len(s) <= 3]
    price = {(s, frozenset()): len(s) * 1.0 - rng.uniform(0.0, 0.9) * (len(s) - 1) + rng.uniform(0.0, 0.2)
             for s in base}
    for s in base:
        for r in sorted(i for i in range(n) if len(dag[i]) >= 2):
            grown = s | {r}
            if r not in s and any(r in producers[m] for m in s) and _convex(dag, set(grown)):
                price.setdefault((frozenset(grown), frozenset([r])), price[(s, frozenset())] + rng.uniform(0.05, 0.6))
    keys = sorted(price, key=lambda k: (sorted(k[0]), sorted(k[1])))[:14]
    keys = sorted(set(keys) | {(frozenset([i]), frozenset()) for i in range(n)},
                  key=lambda k: (sorted(k[0]), sorted(k[1])))
    sinks = {i for i in range(n) if not dag[i]}
    return n, dag, [k[0] for k in keys], [k[1] for k in keys], [price[k] for k in keys], sinks


@pytest.mark.parametrize("seed", range(100))
def test_blp_with_recomputation_equals_brute_force(seed):
    n, dag, sets, recs, prices, sinks = _recompute_case(seed)
    cover = solve_cover(sets, prices, producers=_producers(dag), recomputes=recs, sinks=sinks)
    chosen = [(sets[j], recs[j]) for j in cover.chosen]
    assert set().union(*(s for s, _ in chosen)) == set(range(n))
    assert _valid_program(dag, chosen, sinks)
    expected = _brute_force_recompute(dag, sets, recs, prices, n, sinks)
    assert sum(prices[j] for j in cover.chosen) == pytest.approx(expected, abs=1e-9)


def test_recomputation_cases_do_recompute():
    """The oracle cases exercise recomputation: some optimal covers recompute a node."""
    recomputed = 0
    for seed in range(100):
        _, dag, sets, recs, prices, sinks = _recompute_case(seed)
        recomputed += solve_cover(sets, prices, producers=_producers(dag), recomputes=recs,
                                  sinks=sinks).recomputed > 0
    assert recomputed >= 10, recomputed


def test_recomputed_broadcast_saves_its_kernel():
    """A mask (node 0) read by two softmax-like kernels {1, 2} and {3, 4}: recomputing it inside
    both is cheaper than a kernel of its own, and then nothing writes it."""
    dag = {0: {1, 3}, 1: {2}, 2: set(), 3: {4}, 4: set()}
    # the mask alone; the two readers; each reader recomputing it; a reader writing it for the other
    sets = [{0}, {1, 2}, {3, 4}, {0, 1, 2}, {0, 3, 4}, {0, 3, 4}]
    recs = [set(), set(), set(), {0}, {0}, set()]
    prices = [1.0, 2.0, 2.0, 2.05, 2.05, 2.3]
    plain = [0, 1, 2, 5]
    exact = solve_cover([sets[j] for j in plain], [prices[j] for j in plain], producers=_producers(dag))
    assert [plain[j] for j in exact.chosen] == [1, 5] and exact.recomputed == 0       # 4.3
    cover = solve_cover(sets, prices, producers=_producers(dag), recomputes=recs, sinks={2, 4})
    assert cover.chosen == [3, 4] and cover.recomputed == 1                            # 4.1
    # a reader outside both kernels needs a writer of the mask
    dag[0].add(5)
    dag[5] = set()
    cover = solve_cover([*sets, {5}], [*prices, 1.0], producers=_producers(dag), recomputes=[*recs, set()],
                        sinks={2, 4, 5})
    assert cover.chosen in ([0, 3, 4, 6], [1, 5, 6])


def test_recomputation_needs_the_graph_and_members():
    with pytest.raises(SelectionError, match="producers"):
        solve_cover([{0, 1}, {1}], [1.0, 1.0], recomputes=[{0}, set()])
    with pytest.raises(SelectionError, match="subset"):
        solve_cover([{0}, {1}], [1.0, 1.0], recomputes=[{1}, set()])


def test_time_limit_without_incumbent_falls_back_to_one_kernel_per_node(monkeypatch):
    import types

    import scipy.optimize

    def no_incumbent(**_kwargs):
        return types.SimpleNamespace(x=None, status=1, message="Time limit reached")

    monkeypatch.setattr(scipy.optimize, "milp", lambda *a, **k: no_incumbent(**k))
    sets = [{0}, {1}, {2}, {0, 1}, {1, 2}]
    cover = solve_cover(sets, [1.0, 1.0, 1.0, 0.5, 0.5], producers={1: [0], 2: [1]})
    assert sorted(cover.chosen) == [0, 1, 2] and cover.statuses == ["time limit (singletons)"]
    with pytest.raises(SelectionError, match="no exact acyclic cover"):  # no singleton for node 2
        solve_cover([{0}, {1}, {1, 2}], [1.0, 1.0, 1.0], producers={1: [0], 2: [1]})


def _interval_case(seed: int) -> tuple[int, list[list[int]], list[float]]:
    """A line of 30 nodes, every node alone and 120 random runs of 2-5 nodes, priced in seconds as
    kernels are (microseconds each): the cheapest cover is a shortest path, known exactly."""
    rng = random.Random(seed)
    n = 30
    sets = [[i] for i in range(n)]
    for _ in range(120):
        start = rng.randrange(n)
        sets.append(list(range(start, min(n, start + rng.randint(2, 5)))))
    return n, sets, [rng.uniform(1e-6, 3e-6) * len(s) ** 0.8 for s in sets]


def _cheapest_interval_cover(n: int, sets: list[list[int]], prices: list[float]) -> float:
    best = [0.0] + [math.inf] * n                    # best[i]: nodes 0..i-1 covered
    for end in range(1, n + 1):
        best[end] = min(best[s[0]] + p for s, p in zip(sets, prices) if s[-1] == end - 1)
    return best[n]


@pytest.mark.parametrize("seed", range(12))
def test_blp_is_exact_at_the_scale_of_kernel_prices(seed):
    """Prices in seconds are ~1e-6: HiGHS's default absolute gap (1e-6) accepted covers up to 0.26%
    above the cheapest on such cases; the selector must return the cheapest."""
    n, sets, prices = _interval_case(seed)
    cover = solve_cover(sets, prices)
    assert sum(prices[j] for j in cover.chosen) == pytest.approx(_cheapest_interval_cover(n, sets, prices),
                                                                  rel=1e-12)
