"""LongRoPE's search core: the constraints hold for every candidate it makes, it finds a known
optimum, a seed fixes the result, and an interrupted search resumes to the identical result."""

import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from train import tensorboard_log
from train.longrope.evolve import crossover, mutate
from train.longrope.search import SearchConfig, estimate, search
from train.longrope.space import PAPER_STARTS, Candidate, Space, seeds

SPACE = Space(pairs=8, scale=4.0, starts=(0, 4, 8))
TARGET = np.array([1.0, 1.2, 1.5, 2.0, 2.6, 3.3, 4.2, 4.9])


def synthetic(candidate: Candidate) -> float:
    """A fitness whose optimum is known: TARGET's factors (on the grid) and start 4."""
    f = np.asarray(candidate.factors(SPACE.step))
    return float(np.sum((f - TARGET) ** 2) + 0.5 * (candidate.start != 4))


def test_paper_space_and_bounds():
    space = Space(pairs=32, scale=8.0)
    assert space.starts == PAPER_STARTS
    assert (space.low * space.step, space.high * space.step) == pytest.approx((1.0, 10.0))


def test_seeds_are_pi_ntk_yarn_in_the_space():
    space = Space(pairs=32, scale=4.0)
    pi, ntk, yarn = seeds(space, original_max_position_embeddings=2048, base=10000.0)
    assert set(pi.factors(space.step)) == {4.0}
    np.testing.assert_allclose(ntk.factors(space.step), 4.0 ** (np.arange(32) / 31), atol=0.005)
    assert yarn.factors(space.step)[0] == 1.0 and yarn.factors(space.step)[-1] == 4.0
    for cand in (pi, ntk, yarn):
        space.check(cand)


def _assert_valid(space: Space, cand: Candidate) -> None:
    space.check(cand)
    k = np.asarray(cand.steps)
    assert np.all(np.diff(k) >= 0) and k.min() >= space.low and k.max() <= space.high
    assert isinstance(cand.start, int) and cand.start in space.starts


@given(seed=st.integers(0, 2**32 - 1), pairs=st.integers(1, 12),
       scale=st.floats(1.01, 64.0), rate=st.floats(0.05, 1.0))
def test_mutation_and_crossover_keep_every_constraint(seed, pairs, scale, rate):
    space = Space(pairs=pairs, scale=scale, starts=(0, 1, 2, 4, 8))
    rng = np.random.Generator(np.random.PCG64(seed))
    population = seeds(space, original_max_position_embeddings=512, base=10000.0)
    for seed_candidate in population:  # PI, NTK and YaRN snapped into the space
        _assert_valid(space, seed_candidate)
    seen = set(population)
    for _ in range(12):
        a = population[rng.integers(len(population))]
        child = mutate(rng, a, space, rate=rate, seen=seen)
        _assert_valid(space, child)
        mixed = crossover(rng, a, child, space, rate=rate, seen=seen)
        if mixed is not None:
            _assert_valid(space, mixed)
        population += [child] + ([mixed] if mixed else [])
        seen |= set(population)


@pytest.mark.parametrize("bad, message", [
    (Candidate((100,) * 7, 0), "candidate has 7 factors; the space has R=8"),
    (Candidate((99,) + (100,) * 7, 0), "leave the bounds [1.0, 5.0]"),
    (Candidate((100,) * 7 + (501,), 0), "leave the bounds [1.0, 5.0]"),
    (Candidate((200, 100) + (300,) * 6, 0), "are not non-decreasing toward low frequencies"),
    (Candidate((100,) * 8, 3), "start=3 is not one of the allowed starts (0, 4, 8)"),
])
def test_check_names_the_broken_constraint(bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]")):
        SPACE.check(bad)


def test_space_and_config_refuse_bad_values():
    with pytest.raises(ValueError, match="scale must be > 1.0, got scale=1.0"):
        Space(pairs=4, scale=1.0)
    with pytest.raises(ValueError, match="starts must be distinct"):
        Space(pairs=4, scale=2.0, starts=(0, 0))
    with pytest.raises(ValueError, match="parents=9 must be <= population=8"):
        SearchConfig(population=8, parents=9)


def test_search_finds_a_known_optimum():
    space_seeds = seeds(SPACE, original_max_position_embeddings=64, base=10000.0)
    result = search(synthetic, SPACE, SearchConfig(generations=60, seed=1), seeds=space_seeds)
    assert result.best.start == 4
    np.testing.assert_allclose(result.best.factors(SPACE.step), TARGET, atol=0.06)
    assert result.value < 0.01 < min(synthetic(s) for s in space_seeds)
    best = [r["best_ppl"] for r in result.records]
    assert best == sorted(best, reverse=True) and len(best) == 61   # never worse


def test_same_seed_same_factors_other_seed_other_path():
    cfg = SearchConfig(generations=5, population=16, parents=8, mutations=4, crossovers=4)
    a = search(synthetic, SPACE, cfg)
    b = search(synthetic, SPACE, cfg)
    c = search(synthetic, SPACE, SearchConfig(**{**cfg.identity(), "generations": 5, "seed": 7}))
    assert a.best == b.best and a.values == b.values
    assert c.values != a.values


class Killed(Exception):
    pass


def test_interrupted_search_resumes_to_the_same_result(tmp_path):
    cfg = SearchConfig(generations=8, population=16, parents=8, mutations=4, crossovers=4,
                       seed=3)
    whole = search(synthetic, SPACE, cfg)
    calls = {"n": 0}

    def dies(candidate):  # killed in the middle of generation 3
        calls["n"] += 1
        if calls["n"] > cfg.population + 2 * 8 + 5:
            raise Killed
        return synthetic(candidate)

    with pytest.raises(Killed):
        search(dies, SPACE, cfg, workdir=str(tmp_path))
    files = sorted(os.listdir(tmp_path / "generations"))
    assert files == ["gen_0000.json", "gen_0001.json", "gen_0002.json"]
    stopped = search(synthetic, SPACE, SearchConfig(**{**cfg.identity(), "generations": 5}),
                     workdir=str(tmp_path))                                # stop early...
    assert len(stopped.records) == 6
    resumed = search(synthetic, SPACE, cfg, workdir=str(tmp_path))         # ...and go on
    assert resumed.best == whole.best and resumed.values == whole.values
    drop = [{k: v for k, v in r.items() if k != "seconds"} for r in resumed.records]
    assert drop == [{k: v for k, v in r.items() if k != "seconds"} for r in whole.records]
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in log] == list(range(9))
    scalars = tensorboard_log.read_scalars(str(tmp_path / "tensorboard"))
    steps = sorted({s for s, _ in scalars["longrope/best_ppl"]})
    assert steps == list(range(9))


def test_resume_refuses_other_settings(tmp_path):
    cfg = SearchConfig(generations=1, population=4, parents=2, mutations=1, crossovers=1)
    search(synthetic, SPACE, cfg, workdir=str(tmp_path))
    with pytest.raises(ValueError, match="holds a search with config=.*'seed': 0.*this one has "
                                         "config=.*'seed': 1"):
        search(synthetic, SPACE, SearchConfig(**{**cfg.identity(), "generations": 1, "seed": 1}),
               workdir=str(tmp_path))


def test_estimate_times_one_evaluation_and_multiplies():
    cfg = SearchConfig(generations=10, population=8, parents=4, mutations=2, crossovers=3)
    cost, value = estimate(synthetic, Candidate((100,) * 8, 0), cfg)
    assert cost.evaluations == 8 + 10 * 5 and value == synthetic(Candidate((100,) * 8, 0))
    assert cost.seconds == pytest.approx(cost.seconds_per_evaluation * 58)
    assert "58 evaluations" in str(cost)


def test_nan_fitness_ranks_last():
    cfg = SearchConfig(generations=2, population=6, parents=3, mutations=2, crossovers=1)
    result = search(lambda c: float("nan") if c.start == 0 else synthetic(c), SPACE, cfg)
    assert result.best.start != 0 and np.isfinite(result.value)


def test_a_space_smaller_than_the_population_ends():
    tiny = Space(pairs=1, scale=1.03, max_ratio=1.0, starts=(0,))  # 1.00, 1.01, 1.02, 1.03
    result = search(lambda c: abs(c.steps[0] - 102), tiny,
                    SearchConfig(generations=3, population=16, parents=8, mutations=4,
                                 crossovers=4))
    assert result.best.steps == (102,) and result.value == 0 and len(result.values) == 4
