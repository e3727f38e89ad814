"""Skewed synthetic click logs in the Criteo TSV format.

Categorical ids follow a truncated power law (Zipf) per table, so the hottest
id of a large table is thousands of times more frequent than its median one,
as in production click logs. Labels come from a hidden logistic model over the
features (per-id weights, count weights and one cross term), so a trained
model can learn them. The hidden model depends only on ``model_seed``: files
written with different ``seed`` values share it, which makes a train file and
a held-out file of the same task.

With ``bags`` (:class:`SynthConfig`) each row holds a bag of ids per table, written
in the multi-hot text format of :mod:`criteo.multihot` (a field's ids separated by
commas, an empty field an empty bag); the hidden model then scores a bag by the
mean of its ids' weights, so every id of it carries signal.

With ``users`` (:class:`UserRequests`) the rows come as ranking requests: runs of
consecutive rows, one run per request, each run sharing one user's features (the split's
columns) and each row one candidate. Users are drawn from a pool with a power-law
popularity (a few users make many requests), the run lengths from
:attr:`UserRequests.spread`; labels are drawn after the user's features are in place, so
they follow the hidden model on the rows as written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL, NUM_DENSE, VARIABLE_HOTNESS, FeatureSplit
from criteo.tables import check_table_sizes

#: How many candidates each request holds: all the mean, or drawn (geometric, of that mean).
SPREADS = ("fixed", "geometric")


@dataclass(frozen=True)
class UserRequests:
    """Rows written as ranking requests (see the module docstring).

    Args:
        split: which features are the user's.
        candidates: candidates per request (the mean, for a drawn spread).
        spread: ``fixed`` or ``geometric`` (:data:`SPREADS`).
        users: distinct users in the pool.
        exponent: power-law exponent of the users' popularity (> 0).
    """

    split: FeatureSplit
    candidates: int = 128
    spread: str = "fixed"
    users: int = 10_000
    exponent: float = 1.05

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.users < 1:
            raise ConfigError(f"candidates and users must be >= 1, got {self.candidates} and {self.users}")
        if self.spread not in SPREADS:
            raise ConfigError(f"candidate spread must be one of {', '.join(SPREADS)}, got {self.spread!r}")
        if not 0.0 < self.exponent <= 4.0:
            raise ConfigError(f"the users' popularity exponent must be in (0, 4], got {self.exponent}")

    def run_lengths(self, rng: np.random.Generator, rows: int) -> np.ndarray:
        """Candidates of each request covering ``rows`` rows (the last one cut to fit)."""
        lengths: list[int] = []
        total = 0
        while total < rows:
            count = self.candidates if self.spread == "fixed" else int(rng.geometric(1.0 / self.candidates))
            count = min(count, rows - total)
            lengths.append(count)
            total += count
        return np.asarray(lengths, dtype=np.int64)


@dataclass(frozen=True)
class SynthConfig:
    """Options of the generator.

    Args:
        rows: number of rows to write.
        seed: seed of the row sampling.
        model_seed: seed of the hidden model (vocabularies, weights).
        exponent: power-law exponent of the id frequencies (> 0; 1.05 is click-log like).
        max_vocabulary: distinct ids of the largest table.
        vocabulary: distinct ids of each of C1..C26 (e.g. the Criteo Kaggle table
            sizes), each capped at ``max_vocabulary``; None: 26 sizes spread
            log-uniformly from 10 to ``max_vocabulary``, in a shuffled order.
        chunk_rows: rows generated and written per step.
        bags: None for one id per table (Criteo's format); 26 counts for bags of that
            fixed size per table (MLPerf's hotness, say); or
            :data:`bundle.schema.VARIABLE_HOTNESS` for bags of any size, table ``t``'s drawn
            uniformly from 0 to twice MLPerf's hotness for it (empty bags included).
        users: write the rows as ranking requests (None: independent rows).
    """

    rows: int
    seed: int = 0
    model_seed: int = 2026
    exponent: float = 1.05
    max_vocabulary: int = 200_000
    vocabulary: tuple[int, ...] | None = None
    chunk_rows: int = 50_000
    bags: tuple[int, ...] | str | None = None
    users: UserRequests | None = None

    def __post_init__(self) -> None:
        if self.users is not None and self.bags is not None:
            raise ConfigError("ranking requests are written with one id per table; drop the bags")
        if isinstance(self.bags, str) and self.bags != VARIABLE_HOTNESS:
            raise ConfigError(f"bags must be 26 counts or {VARIABLE_HOTNESS!r}, got {self.bags!r}")
        if isinstance(self.bags, tuple) and (len(self.bags) != NUM_CATEGORICAL or min(self.bags) < 1):
            raise ConfigError(f"bags need {NUM_CATEGORICAL} counts >= 1, got {self.bags}")
        if self.rows <= 0:
            raise ConfigError(f"rows must be positive, got {self.rows}")
        if not 0.0 < self.exponent <= 4.0:
            raise ConfigError(f"exponent must be in (0, 4], got {self.exponent}")
        if self.max_vocabulary < 10:
            raise ConfigError(f"max_vocabulary must be >= 10, got {self.max_vocabulary}")
        if self.chunk_rows <= 0:
            raise ConfigError(f"chunk_rows must be positive, got {self.chunk_rows}")
        if self.vocabulary is not None:
            check_table_sizes(self.vocabulary, "vocabulary")

    @property
    def vocabulary_sizes(self) -> tuple[int, ...] | None:
        """The per-table vocabularies as generated: capped at ``max_vocabulary``, at least 2."""
        if self.vocabulary is None:
            return None
        return tuple(max(2, min(int(size), self.max_vocabulary)) for size in self.vocabulary)


class HiddenModel:
    """The logistic model that labels synthetic rows.

    ``logit = bias + sum_j a_j * z_j + sum_t w_t[rank_t] + c * z_0 * w_1[rank_1]``
    where ``z_j`` is the standardised log1p count and ``w_t`` are per-id weights.
    """

    def __init__(
        self,
        model_seed: int,
        exponent: float,
        max_vocabulary: int,
        vocabulary: tuple[int, ...] | None = None,
    ) -> None:
        rng = np.random.default_rng(model_seed)
        # Vocabulary sizes spread over orders of magnitude, as in Criteo.
        exponents = np.linspace(1.0, np.log10(max_vocabulary), NUM_CATEGORICAL)
        self.vocabulary = np.maximum(np.round(10**exponents).astype(np.int64), 2)
        rng.shuffle(self.vocabulary)
        if vocabulary is not None:  # drawn above all the same, so the rest of the model stays seeded alike
            self.vocabulary = np.asarray(vocabulary, dtype=np.int64)
        self.cdf = []
        self.hex_ids = []
        self.id_weights = []
        for size in self.vocabulary:
            p = np.arange(1, size + 1, dtype=np.float64) ** -exponent
            self.cdf.append(np.cumsum(p) / p.sum())
            # Distinct random 32-bit ids, so ids carry no rank information.
            ids = rng.choice(2**32 - 1, size=int(size), replace=False) + 1
            self.hex_ids.append(np.array([f"{v:08x}" for v in ids], dtype=object))
            self.id_weights.append(rng.normal(0.0, 0.3, size=int(size)))
        self.count_mu = rng.uniform(0.0, 4.0, NUM_DENSE)
        self.count_sigma = rng.uniform(0.6, 1.6, NUM_DENSE)
        self.count_missing = rng.uniform(0.0, 0.4, NUM_DENSE)
        self.id_missing = np.where(
            rng.random(NUM_CATEGORICAL) < 0.3, rng.uniform(0.02, 0.4, NUM_CATEGORICAL), 0.0
        )
        self.count_weights = rng.normal(0.0, 0.3, NUM_DENSE)
        self.cross_weight = 0.6
        self.bias = -1.5

    def sample(
        self, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``n`` rows.

        Returns:
            labels ``n`` int, counts ``n x 13`` int64, count-missing mask ``n x 13``,
            ranks ``n x 26`` int64 (0-based), id-missing mask ``n x 26``.
        """
        features = self.features(rng, n)
        return (self.label(rng, *features), *features)

    def features(
        self, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``n`` rows' features, unlabeled: counts, count-missing mask, ranks, id-missing mask."""
        counts = np.floor(rng.lognormal(self.count_mu, self.count_sigma, (n, NUM_DENSE))).astype(np.int64)
        # Criteo's second count column holds small negative values now and then.
        negative = rng.random(n) < 0.02
        counts[negative, 1] = -rng.integers(1, 4, int(negative.sum()))
        count_missing = rng.random((n, NUM_DENSE)) < self.count_missing
        ranks = np.empty((n, NUM_CATEGORICAL), dtype=np.int64)
        for t, cdf in enumerate(self.cdf):
            ranks[:, t] = np.minimum(np.searchsorted(cdf, rng.random(n)), cdf.size - 1)
        id_missing = rng.random((n, NUM_CATEGORICAL)) < self.id_missing
        return counts, count_missing, ranks, id_missing

    def label(
        self,
        rng: np.random.Generator,
        counts: np.ndarray,
        count_missing: np.ndarray,
        ranks: np.ndarray,
        id_missing: np.ndarray,
    ) -> np.ndarray:
        """Labels of rows of these features."""
        id_w = np.stack([w[ranks[:, t]] for t, w in enumerate(self.id_weights)], axis=1)
        id_w[id_missing] = 0.0
        return self.draw_labels(rng, counts, count_missing, id_w)

    def draw_labels(
        self, rng: np.random.Generator, counts: np.ndarray, count_missing: np.ndarray, id_weight: np.ndarray
    ) -> np.ndarray:
        """Labels drawn from the model's logit, given each row's weight per table (``n x 26``)."""
        z = np.log1p(np.where(count_missing, 0, np.maximum(counts, 0))) - self.count_mu
        logit = (
            self.bias
            + z @ self.count_weights
            + id_weight.sum(axis=1)
            + self.cross_weight * np.tanh(z[:, 0]) * id_weight[:, 1] * 2.0
        )
        return (rng.random(len(counts)) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)


def generate_lines(config: SynthConfig) -> Iterator[list[str]]:
    """Yield chunks of TSV lines (with trailing newline) for ``config.rows`` rows."""
    model = HiddenModel(config.model_seed, config.exponent, config.max_vocabulary, config.vocabulary_sizes)
    rng = np.random.default_rng(config.seed)
    pool = _UserPool(model, config.users, rng) if config.users is not None else None
    remaining = config.rows
    while remaining > 0:
        n = min(config.chunk_rows, remaining)
        if config.bags is not None:
            yield _bag_lines(model, rng, n, config.bags)
            remaining -= n
            continue
        if pool is None:
            labels, counts, count_missing, ranks, id_missing = model.sample(rng, n)
        else:
            counts, count_missing, ranks, id_missing = pool.rows(rng, n)
            labels = model.label(rng, counts, count_missing, ranks, id_missing)
        count_text = counts.astype(str).astype(object)
        count_text[count_missing] = ""
        id_text = np.empty((n, NUM_CATEGORICAL), dtype=object)
        for t in range(NUM_CATEGORICAL):
            id_text[:, t] = model.hex_ids[t][ranks[:, t]]
        id_text[id_missing] = ""
        columns = np.concatenate([labels.astype(str).astype(object)[:, None], count_text, id_text], axis=1)
        yield ["\t".join(row) + "\n" for row in columns.tolist()]
        remaining -= n


class _UserPool:
    """The users of ranking requests: their features drawn once, their popularity a power law."""

    def __init__(self, model: HiddenModel, users: UserRequests, rng: np.random.Generator) -> None:
        self.model = model
        self.users = users
        self.features = model.features(rng, users.users)
        weights = np.arange(1, users.users + 1, dtype=np.float64) ** -users.exponent
        self.cdf = np.cumsum(weights) / weights.sum()

    def rows(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``n`` rows of requests: candidates' features drawn, each run's user columns its user's."""
        counts, count_missing, ranks, id_missing = self.model.features(rng, n)
        lengths = self.users.run_lengths(rng, n)
        drawn = np.minimum(np.searchsorted(self.cdf, rng.random(len(lengths))), self.cdf.size - 1)
        user_of_row = np.repeat(drawn, lengths)
        dense, tables = list(self.users.split.user_dense), list(self.users.split.user_categorical)
        pool_counts, pool_count_missing, pool_ranks, pool_id_missing = self.features
        counts[:, dense] = pool_counts[user_of_row][:, dense]
        count_missing[:, dense] = pool_count_missing[user_of_row][:, dense]
        ranks[:, tables] = pool_ranks[user_of_row][:, tables]
        id_missing[:, tables] = pool_id_missing[user_of_row][:, tables]
        return counts, count_missing, ranks, id_missing


def _bag_lines(
    model: HiddenModel, rng: np.random.Generator, n: int, bags: tuple[int, ...] | str
) -> list[str]:
    """``n`` rows of bags, labeled by ``model`` with each bag's mean id weight in place of its id's."""
    from criteo.multihot import DRAWN_MAX_LENGTHS

    if isinstance(bags, str):
        lengths = rng.integers(0, np.asarray(DRAWN_MAX_LENGTHS) + 1, size=(n, NUM_CATEGORICAL))
    else:
        lengths = np.tile(np.asarray(bags, dtype=np.int64), (n, 1))
    _, counts, count_missing, _, _ = model.sample(rng, n)
    bag_weight = np.zeros((n, NUM_CATEGORICAL))
    id_text = np.empty((n, NUM_CATEGORICAL), dtype=object)
    for t, cdf in enumerate(model.cdf):
        sizes = lengths[:, t]
        ranks = np.minimum(np.searchsorted(cdf, rng.random(int(sizes.sum()))), cdf.size - 1)
        ends = np.cumsum(sizes)
        running = np.concatenate(([0.0], np.cumsum(model.id_weights[t][ranks])))
        sums = running[ends] - running[ends - sizes]
        bag_weight[:, t] = np.where(sizes > 0, sums / np.maximum(sizes, 1), 0.0)
        hexes = model.hex_ids[t][ranks].tolist()
        spans = zip(ends.tolist(), sizes.tolist(), strict=True)
        id_text[:, t] = [",".join(hexes[end - size : end]) for end, size in spans]
    labels = model.draw_labels(rng, counts, count_missing, bag_weight)
    count_text = counts.astype(str).astype(object)
    count_text[count_missing] = ""
    columns = np.concatenate([labels.astype(str).astype(object)[:, None], count_text, id_text], axis=1)
    return ["\t".join(row) + "\n" for row in columns.tolist()]


def write_tsv(config: SynthConfig, out: Path, on_rows: Callable[[int], None] | None = None) -> None:
    """Write ``config.rows`` synthetic rows to ``out`` (TSV, Criteo format).

    Args:
        config: generator options.
        out: output file; its parent folders are created.
        on_rows: called with the number of rows after each chunk (progress).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="ascii", newline="\n") as handle:
        for lines in generate_lines(config):
            handle.writelines(lines)
            if on_rows is not None:
                on_rows(len(lines))
