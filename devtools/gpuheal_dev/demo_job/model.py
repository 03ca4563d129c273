"""The model and its maths, pure NumPy: a synthetic dataset, a one-hidden-layer MLP, SGD.

Everything is a function of ``(config, step)`` and the state passed in, nothing reads a clock
or a global RNG, so a run resumed from a checkpoint computes exactly what an uninterrupted run
computes (``np.array_equal``, not ``allclose``):

- the dataset is drawn from ``default_rng([seed, DATA_STREAM])`` (a fixed "teacher" MLP labels
  Gaussian inputs);
- the minibatch of step ``s`` is drawn from ``default_rng([seed, BATCH_STREAM, s])``, so the data
  order needs no state at all;
- input jitter (a small augmentation) comes from one continuing PCG64 stream whose state *is*
  checkpointed: the resume logic must restore RNG state, and the bit-identical test proves it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

DATA_STREAM = 0xDA7A
INIT_STREAM = 0x1217
BATCH_STREAM = 0xBA7C
JITTER_STREAM = 0x7177
PARAM_NAMES = ("w1", "b1", "w2", "b2")


@dataclass(frozen=True)
class ModelConfig:
    """What defines a run's numbers. A checkpoint only resumes a run with the same config."""

    seed: int = 0
    n_samples: int = 2048
    n_features: int = 16
    n_classes: int = 4
    hidden: int = 32
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    jitter: float = 0.05

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Dataset:
    x: Array  # (n_samples, n_features)
    y: NDArray[np.int64]  # (n_samples,) class ids


def make_dataset(cfg: ModelConfig) -> Dataset:
    """Gaussian inputs labelled by a random teacher MLP (learnable: the loss keeps falling)."""
    rng = np.random.default_rng([cfg.seed, DATA_STREAM])
    x = rng.standard_normal((cfg.n_samples, cfg.n_features))
    t1 = rng.standard_normal((cfg.n_features, 24))
    t2 = rng.standard_normal((24, cfg.n_classes))
    y = np.argmax(np.tanh(x @ t1) @ t2, axis=1).astype(np.int64)
    return Dataset(x=x, y=y)


def init_params(cfg: ModelConfig) -> dict[str, Array]:
    rng = np.random.default_rng([cfg.seed, INIT_STREAM])
    return {
        "w1": rng.standard_normal((cfg.n_features, cfg.hidden)) / math.sqrt(cfg.n_features),
        "b1": np.zeros(cfg.hidden),
        "w2": rng.standard_normal((cfg.hidden, cfg.n_classes)) / math.sqrt(cfg.hidden),
        "b2": np.zeros(cfg.n_classes),
    }


def zeros_like(params: dict[str, Array]) -> dict[str, Array]:
    return {k: np.zeros_like(v) for k, v in params.items()}


def jitter_rng(cfg: ModelConfig) -> np.random.Generator:
    """The continuing augmentation stream (its state goes into every checkpoint)."""
    return np.random.Generator(np.random.PCG64([cfg.seed, JITTER_STREAM]))


def batch_indices(cfg: ModelConfig, step: int) -> NDArray[np.int64]:
    """Rows used by ``step`` (1-based): a function of (seed, step) only."""
    rng = np.random.default_rng([cfg.seed, BATCH_STREAM, step])
    return rng.choice(cfg.n_samples, size=cfg.batch_size, replace=False).astype(np.int64)


def _forward(params: dict[str, Array], x: Array) -> tuple[Array, Array]:
    h = np.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return h, logits


def _softmax_xent(logits: Array, y: NDArray[np.int64]) -> tuple[float, Array]:
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = y.shape[0]
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
    p[np.arange(n), y] -= 1.0
    return loss, p / n


def loss(params: dict[str, Array], data: Dataset) -> float:
    """Mean cross-entropy over the whole dataset."""
    _, logits = _forward(params, data.x)
    value, _ = _softmax_xent(logits, data.y)
    return value


def accuracy(params: dict[str, Array], data: Dataset) -> float:
    _, logits = _forward(params, data.x)
    return float((np.argmax(logits, axis=1) == data.y).mean())


def sgd_step(  # noqa: PLR0917 - the maths reads best with its state spelled out
    cfg: ModelConfig,
    params: dict[str, Array],
    velocity: dict[str, Array],
    data: Dataset,
    step: int,
    rng: np.random.Generator,
) -> float:
    """One SGD-with-momentum step, in place; returns the minibatch loss before the update."""
    idx = batch_indices(cfg, step)
    x = data.x[idx] + cfg.jitter * rng.standard_normal((cfg.batch_size, cfg.n_features))
    y = data.y[idx]
    h, logits = _forward(params, x)
    batch_loss, dlogits = _softmax_xent(logits, y)
    grads = {"w2": h.T @ dlogits, "b2": dlogits.sum(axis=0)}
    dh = (dlogits @ params["w2"].T) * (1.0 - h * h)
    grads["w1"] = x.T @ dh
    grads["b1"] = dh.sum(axis=0)
    for name in PARAM_NAMES:
        velocity[name] *= cfg.momentum
        velocity[name] += grads[name]
        params[name] -= cfg.lr * velocity[name]
    return batch_loss
