"""Statistical efficiency of a batch size and the progress predictor (docs/elastic.md).

Gradient noise scale (McCandlish et al. 2018, "An empirical model of
large-batch training"): a minibatch gradient of ``b`` samples satisfies
``E|g_b|^2 = |G|^2 + tr(Sigma)/b``; the (simple) noise scale is
``B_noise = tr(Sigma)/|G|^2``. With data parallelism over ranks of *uneven*
local batches one step yields several points ``(1/b_k, |g_k|^2)`` plus the
global one ``(1/B, |G_B|^2)``, so a least-squares line through them gives
both terms at once (:func:`gns_from_norms`); an exponential moving average of
the two terms (not of their noisy ratio) smooths across steps
(:class:`GNSTracker`).

Efficiency (Pollux, Qiao et al. OSDI 2021): relative to the batch ``B0``
the user tuned, one sample at batch ``B`` is worth
``E(B) = (B_noise + B0) / (B_noise + B)`` samples at ``B0``; a job that needs
``W`` samples at ``B0`` needs ``W / E(B)`` at ``B``. ONES's own assumption
(linear LR scaling keeps epochs constant) is ``E = 1``.

Progress predictor (ONES Sec. 3.2.1): the fraction of its training a job has
done is modelled as ``Beta(alpha, beta)`` whose mean is a logistic-linear
function of the job's features; the coefficients and the precision are
fitted by maximum likelihood (scipy.optimize) on completed jobs' epoch
history. Remaining work is then ``done * (1 - p) / p`` (ONES eq. 7).
Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: epochs assumed for a ``target_loss`` job before any history refines it
PRIOR_EPOCHS = 10.0


# ---------------------------------------------------------------------------
# gradient noise scale


@dataclass(frozen=True)
class GNSEstimate:
    """``g2`` estimates |G|^2, ``trace`` estimates tr(Sigma) (per-sample covariance)."""

    g2: float
    trace: float

    @property
    def noise_scale(self) -> float:
        """B_noise = tr(Sigma)/|G|^2 (inf when the gradient estimate is not positive)."""
        return self.trace / self.g2 if self.g2 > 0 else math.inf


def gns_from_norms(local_sq: Sequence[float], local_b: Sequence[int], global_sq: float,
                   global_b: int) -> GNSEstimate:
    """Fit ``|g_b|^2 = g2 + trace/b`` through each rank's and the global gradient norm.

    ``local_sq[k]`` is |mean gradient over rank k's b_k samples|^2. Points
    are weighted by their batch (the variance of |g_b|^2 shrinks like 1/b),
    which gives the unbiased two-batch estimator of McCandlish et al. when
    there is one small and one large batch.
    """
    bs = [float(b) for b in local_b if b > 0] + [float(global_b)]
    ys = [float(s) for s, b in zip(local_sq, local_b, strict=True) if b > 0] + [float(global_sq)]
    if len(set(bs)) < 2:
        raise ValueError("need at least two distinct batch sizes")
    x = np.array([1.0 / b for b in bs])
    y = np.array(ys)
    w = np.sqrt(np.array(bs))
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (g2, tr), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    return GNSEstimate(float(g2), float(tr))


@dataclass
class GNSTracker:
    """Exponential moving averages of |G|^2 and tr(Sigma) across steps (Pollux-style)."""

    decay: float = 0.9
    g2: float = 0.0
    trace: float = 0.0
    n: int = 0

    def update(self, est: GNSEstimate) -> None:
        if self.n == 0:
            self.g2, self.trace = est.g2, est.trace
        else:
            d = self.decay
            self.g2 = d * self.g2 + (1 - d) * est.g2
            self.trace = d * self.trace + (1 - d) * est.trace
        self.n += 1

    @property
    def noise_scale(self) -> float | None:
        if self.n == 0:
            return None
        return GNSEstimate(self.g2, self.trace).noise_scale


def efficiency(batch: float, base_batch: float, noise_scale: float | None) -> float:
    """Samples-at-``base_batch`` one sample at ``batch`` is worth (Pollux); 1 if unknown."""
    if noise_scale is None or not math.isfinite(noise_scale):
        return 1.0
    phi = max(0.0, noise_scale)
    return (phi + base_batch) / (phi + batch)


# ---------------------------------------------------------------------------
# progress predictor

FEATURES = ("log_epoch_size", "log_initial_loss", "log_epochs_done", "loss_ratio", "bias")


def features(epoch_size: float, epochs_done: float, initial_loss: float | None = None,
             loss: float | None = None) -> np.ndarray:
    """ONES's inputs, without validation accuracy (hetsched reports no validation).

    Losses unknown at planning time (a simulated job) are NaN; the model
    replaces them by its training means.
    """
    if initial_loss is None or loss is None or initial_loss <= 0:
        il, ratio = math.nan, math.nan
    else:
        il, ratio = math.log1p(initial_loss), (initial_loss - loss) / initial_loss
    return np.array([math.log1p(epoch_size), il, math.log1p(epochs_done), ratio, 1.0])


@dataclass
class ProgressModel:
    """Beta regression of training progress on :func:`features` (ONES eq. 6).

    ``coef`` gives the logit of the mean progress, ``precision`` = alpha + beta.
    Unfitted, it predicts a mean of 0.5 with a wide spread (precision 2).
    """

    coef: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    precision: float = 2.0
    n_train: int = 0
    #: column means of the training features (imputed for NaN inputs)
    means: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))

    def _impute(self, X: np.ndarray) -> np.ndarray:
        X = np.array(X, dtype=float, copy=True)
        bad = np.isnan(X)
        if bad.any():
            X[bad] = np.broadcast_to(self.means, X.shape)[bad]
        return X

    def fit(self, X: np.ndarray, y: np.ndarray, max_points: int = 2000, seed: int = 0
            ) -> ProgressModel:
        """Maximum likelihood on (features, progress in (0, 1]) pairs of completed jobs.

        Keeps at most ``max_points`` uniformly sampled points (ONES keeps a
        bounded training set so fitting stays cheap and does not overfit).
        """
        from scipy.optimize import minimize
        from scipy.special import betaln, expit

        X = np.asarray(X, dtype=float)
        y = np.clip(np.asarray(y, dtype=float), 1e-3, 1 - 1e-3)
        if len(y):
            with np.errstate(all="ignore"):
                m = np.nanmean(np.where(np.isnan(X).all(axis=0), 0.0, X), axis=0)
            self.means = np.nan_to_num(m)
            X = self._impute(X)
        if len(y) > max_points:
            keep = np.random.default_rng(seed).choice(len(y), max_points, replace=False)
            X, y = X[keep], y[keep]
        if len(y) < 3:
            return self

        def nll(theta: np.ndarray) -> float:
            mu = np.clip(expit(X @ theta[:-1]), 1e-6, 1 - 1e-6)
            phi = math.exp(min(theta[-1], 20.0))
            a, b = mu * phi, (1 - mu) * phi
            ll = (a - 1) * np.log(y) + (b - 1) * np.log1p(-y) - betaln(a, b)
            return float(-ll.sum() + 1e-3 * (theta[:-1] ** 2).sum())

        x0 = np.concatenate([self.coef, [math.log(max(self.precision, 1e-3))]])
        res = minimize(nll, x0, method="L-BFGS-B")
        self.coef, self.precision = res.x[:-1], float(math.exp(min(res.x[-1], 20.0)))
        self.n_train = len(y)
        return self

    def beta(self, x: np.ndarray) -> tuple[float, float]:
        z = float(np.dot(self.coef, self._impute(x[None, :])[0]))
        mu = 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))
        mu = min(max(mu, 1e-3), 1 - 1e-3)
        return mu * self.precision, (1 - mu) * self.precision

    def mean_remaining(self, x: np.ndarray, done: float) -> float:
        a, b = self.beta(x)
        p = a / (a + b)
        return done * (1 - p) / p


def sample_remaining(rng: np.random.Generator, alpha: float, beta: float, done: float,
                     total_hint: float, n: int = 1) -> np.ndarray:
    """Remaining work draws from Beta progress (ONES eq. 7), ``total_hint`` before any progress.

    A job that has done nothing yet has no ``done`` to extrapolate from: its
    remaining work is ``total_hint`` (the spec's or the predicted length).
    """
    if done <= 0:
        return np.full(n, float(total_hint))
    p = np.clip(rng.beta(alpha, beta, size=n), 1e-3, 1.0)
    return done * (1 - p) / p
