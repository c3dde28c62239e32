"""The what-if allreduce models (issue 22): limits, monotonicity, crossover, hierarchy."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbtrain.whatif.network import (
    ALGORITHMS,
    Link,
    best,
    broadcast,
    crossover_bytes,
    hierarchical,
    recursive_doubling,
    ring,
)

NAMES = sorted(ALGORITHMS)
alphas = st.floats(min_value=0.0, max_value=1e-3)
betas = st.floats(min_value=1e6, max_value=1e13)
gammas = st.floats(min_value=0.0, max_value=1e-9)
sizes = st.floats(min_value=0.0, max_value=1e11)
ranks = st.integers(min_value=1, max_value=200_000)
links = st.builds(Link, alphas, betas, gammas)


@pytest.mark.parametrize("name", NAMES)
def test_one_rank_costs_nothing(name):
    link = Link(alpha=1e-5, beta=1e9, gamma=1e-10)
    assert ALGORITHMS[name](1e9, 1, link) == 0.0


def test_zero_bytes_leave_the_latency_terms():
    link = Link(alpha=1e-5, beta=1e9, gamma=1e-10)
    p, rounds = 16, 4
    expected = {
        "ring": 2 * (p - 1) * link.alpha,
        "recursive-doubling": rounds * link.alpha,
        "binomial-tree": 2 * rounds * link.alpha,
        "rabenseifner": 2 * rounds * link.alpha,
    }
    for name, seconds in expected.items():
        assert ALGORITHMS[name](0, p, link) == pytest.approx(seconds), name


def test_large_messages_approach_the_bandwidth_terms():
    link = Link(alpha=1e-5, beta=1e9)
    p, rounds, n = 12, 4, 1e15
    per_byte = {
        "ring": 2 * (p - 1) / p / link.beta,
        "recursive-doubling": rounds / link.beta,
        "binomial-tree": 2 * rounds / link.beta,
        "rabenseifner": 2 * (p - 1) / p / link.beta,
    }
    for name, slope in per_byte.items():
        assert ALGORITHMS[name](n, p, link) / n == pytest.approx(slope, rel=1e-6), name


@pytest.mark.parametrize("name", NAMES)
def test_an_infinite_bandwidth_leaves_the_latency(name):
    fast = Link(alpha=3e-6, beta=math.inf)
    assert ALGORITHMS[name](1e9, 64, fast) == ALGORITHMS[name](0, 64, fast)


@settings(max_examples=200, deadline=None)
@given(links, sizes, sizes, ranks, ranks, st.sampled_from(NAMES))
def test_time_grows_with_bytes_and_ranks(link, n1, n2, p1, p2, name):
    model = ALGORITHMS[name]
    (n_lo, n_hi), (p_lo, p_hi) = sorted((n1, n2)), sorted((p1, p2))
    assert model(n_lo, p_lo, link) <= model(n_hi, p_lo, link) * (1 + 1e-12)
    assert model(n_lo, p_lo, link) <= model(n_lo, p_hi, link) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(alphas, betas, betas, sizes, ranks, st.sampled_from(NAMES))
def test_time_falls_as_bandwidth_rises(alpha, b1, b2, n, p, name):
    slow, fast = Link(alpha, min(b1, b2)), Link(alpha, max(b1, b2))
    assert ALGORITHMS[name](n, p, fast) <= ALGORITHMS[name](n, p, slow) * (1 + 1e-12)


@pytest.mark.parametrize("p", [3, 4, 8, 16, 100, 1024, 100_000])
@pytest.mark.parametrize("gamma", [0.0, 1e-10])
def test_recursive_doubling_wins_small_messages_and_ring_large_at_the_closed_form(p, gamma):
    link = Link(alpha=5e-6, beta=1.25e10, gamma=gamma)
    assert recursive_doubling(8, p, link) < ring(8, p, link)
    assert ring(1e10, p, link) < recursive_doubling(1e10, p, link)
    # The crossover, found by bisection on the models, matches the closed form.
    lo, hi = 8.0, 1e10
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if recursive_doubling(mid, p, link) < ring(mid, p, link) else (lo, mid)
    assert crossover_bytes(p, link) == pytest.approx(hi, rel=1e-9)


def test_two_ranks_without_reduction_cost_never_cross():
    link = Link(alpha=5e-6, beta=1e10)
    assert crossover_bytes(2, link) == math.inf
    assert recursive_doubling(1e12, 2, link) < ring(1e12, 2, link)


def test_best_picks_the_fastest_and_names_it():
    link = Link(alpha=5e-6, beta=1.25e10)
    n = np.array([0.0, 1e3, 1e6, 1e9])
    choice = best(n, 64, link)
    times = np.stack([ALGORITHMS[name](n, 64, link) for name in ALGORITHMS])
    np.testing.assert_allclose(choice.seconds, times.min(axis=0))
    assert choice.algorithm[1] == "recursive-doubling"
    assert choice.algorithm[-1] == "rabenseifner"
    only = best(1e9, 64, link, algorithms=["ring", "binomial-tree"])
    assert only == (ring(1e9, 64, link), "ring")
    with pytest.raises(ValueError, match="unknown allreduce algorithm.*'nccl'"):
        best(1, 2, link, algorithms=["nccl"])


@settings(max_examples=100, deadline=None)
@given(links, links, sizes, st.integers(min_value=1, max_value=4096))
def test_hierarchy_of_one_node_or_one_rank_per_node_is_flat(intra, inter, n, p):
    one_node = hierarchical(n, p, p, intra, inter)
    assert one_node.seconds == pytest.approx(best(n, p, intra).seconds, rel=1e-12, abs=0)
    one_per_node = hierarchical(n, p, 1, intra, inter)
    assert one_per_node.seconds == pytest.approx(best(n, p, inter).seconds, rel=1e-12, abs=0)


def test_hierarchy_adds_the_three_stages():
    intra, inter = Link(1e-6, 9e11), Link(5e-6, 1.25e10)
    n, p, g = 1e8, 100, 8  # 13 nodes, the fullest holds 8 ranks
    expected = best(n, 8, intra).seconds + best(n, 13, inter).seconds + broadcast(n, 8, intra)
    got = hierarchical(n, p, g, intra, inter)
    assert got.seconds == pytest.approx(expected)
    assert got.algorithm == "intra=rabenseifner; inter=rabenseifner"


def test_a_hundred_thousand_devices_and_many_sizes_are_vector_operations():
    link = Link(alpha=2e-6, beta=1.25e10)
    n = np.logspace(0, 10, 1000)[:, None]
    p = np.arange(1, 100_001)[None, ::97]
    assert hierarchical(n, p, 8, link, link).seconds.shape == (1000, p.size)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": -1.0, "beta": 1.0}, "alpha=-1.0 must be a latency"),
        ({"alpha": 0.0, "beta": 0.0}, "beta=0.0 must be a bandwidth"),
        ({"alpha": 0.0, "beta": 1.0, "gamma": -1.0}, "gamma=-1.0 must be"),
    ],
)
def test_a_bad_link_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Link(**kwargs)


def test_bad_sizes_and_ranks_are_named():
    link = Link(1e-6, 1e9)
    with pytest.raises(ValueError, match="bytes n must be >= 0"):
        ring(-1, 4, link)
    with pytest.raises(ValueError, match="ranks p must be whole numbers >= 1"):
        ring(1, 0, link)
    with pytest.raises(ValueError, match="ranks p must be whole numbers >= 1"):
        ring(1, 2.5, link)
    with pytest.raises(ValueError, match="ranks per node"):
        hierarchical(1, 4, 0, link, link)


def test_the_whatif_package_imports_no_torch():
    code = "import sys, lbtrain.whatif; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
