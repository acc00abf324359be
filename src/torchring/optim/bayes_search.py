"""Bayesian optimisation of a few continuous knobs, for the autotuner (``optim.autotune``).

The model is scikit-learn's Gaussian process regressor (a Matérn kernel; ``alpha`` is the noise term
Horovod's ``--autotune-gaussian-process-noise`` sets), fitted to the scores seen so far on the knobs
scaled to [0, 1] (logarithmically: the knobs span orders of magnitude). The next point is the one of a
few thousand random candidates with the highest expected improvement over the best score. The first
points are given (the current settings first), so the search always measures what the job would run
with anyway.

scikit-learn is imported on first use: only the rank that decides (rank 0) needs it
(``pip install 'torchring[autotune]'``).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BayesianSearch", "Knob", "search_available"]

#: Random candidates scored by expected improvement per suggestion.
CANDIDATES = 2048
#: How much improvement the expected-improvement criterion asks for (in units of the scores' spread).
EXPLORATION = 0.01


@dataclass(frozen=True)
class Knob:
    """One tuned value, searched between ``low`` and ``high`` on a logarithmic scale."""

    name: str
    low: float
    high: float

    def to_unit(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        return math.log(value / self.low) / math.log(self.high / self.low)

    def from_unit(self, unit: float) -> float:
        return self.low * (self.high / self.low) ** min(max(unit, 0.0), 1.0)


def search_available() -> str:
    """"" when the search can run here, else what is missing (and how to install it)."""
    try:
        import scipy.stats  # noqa: F401
        import sklearn.gaussian_process  # noqa: F401
    except ImportError as error:
        return f"{error.name or 'scikit-learn'} is not installed (pip install 'torchring[autotune]')"
    return ""


class BayesianSearch:
    """Suggests points (name → value) and learns from their scores (higher is better)."""

    def __init__(self, knobs: Sequence[Knob], first_points: Sequence[dict[str, float]], noise: float,
                 seed: int = 0) -> None:
        self.knobs = list(knobs)
        self._first = [dict(point) for point in first_points]
        self._noise = max(noise, 1e-6)
        self._random = random.Random(seed)
        self._points: list[list[float]] = []
        self._measured: list[dict[str, float]] = []
        self._scores: list[float] = []

    @property
    def samples(self) -> int:
        """Scores recorded so far."""
        return len(self._scores)

    def record(self, point: dict[str, float], score: float) -> None:
        """Remember that ``point`` scored ``score``."""
        self._points.append([knob.to_unit(point[knob.name]) for knob in self.knobs])
        self._measured.append(dict(point))
        self._scores.append(float(score))

    def best(self) -> tuple[dict[str, float], float]:
        """The measured point the model rates highest, and that rating in the scores' units (the first given
        point before any score). With noisy scores the single highest one is often luck; the Gaussian
        process's mean at each measured point also weighs the scores of its neighbours."""
        if not self._scores:
            return dict(self._first[0]), 0.0
        if len(self._scores) < 3 or not self.knobs:
            index = max(range(len(self._scores)), key=self._scores.__getitem__)
            return dict(self._measured[index]), self._scores[index]
        import numpy as np

        model, mean, spread = self._fit()
        rated = model.predict(np.asarray(self._points)) * spread + mean
        index = int(rated.argmax())
        return dict(self._measured[index]), float(rated[index])

    def suggest(self) -> dict[str, float]:
        """The next point to measure: the next given point, then the best expected improvement."""
        if len(self._scores) < len(self._first):
            return dict(self._first[len(self._scores)])
        if not self.knobs:
            return {}
        return self._point(self._most_promising())

    def _fit(self) -> tuple[Any, float, float]:
        """The Gaussian process fitted to the standardised scores, and the scores' mean and spread."""
        import numpy as np
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern

        model = GaussianProcessRegressor(kernel=Matern(length_scale=0.3, length_scale_bounds=(0.05, 3.0), nu=2.5),
                                         alpha=self._noise, n_restarts_optimizer=2,
                                         random_state=self._random.randrange(2**31))
        scores = np.asarray(self._scores)
        mean, spread = float(scores.mean()), float(scores.std()) or 1.0
        with warnings.catch_warnings():  # a length scale at its bound is expected with few, noisy samples
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(np.asarray(self._points), (scores - mean) / spread)
        return model, mean, spread

    def _most_promising(self) -> list[float]:
        import numpy as np
        from scipy.stats import norm

        model, mean, spread = self._fit()
        candidates = np.asarray([[self._random.random() for _ in self.knobs] for _ in range(CANDIDATES)])
        predicted, deviation = model.predict(candidates, return_std=True)
        best = (max(self._scores) - mean) / spread
        improvement = predicted - best - EXPLORATION
        deviation = np.maximum(deviation, 1e-9)
        z = improvement / deviation
        expected = improvement * norm.cdf(z) + deviation * norm.pdf(z)
        return [float(v) for v in candidates[int(expected.argmax())]]

    def _point(self, unit: Sequence[float]) -> dict[str, float]:
        return {knob.name: knob.from_unit(u) for knob, u in zip(self.knobs, unit, strict=True)}
