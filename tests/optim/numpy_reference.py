"""Independent NumPy implementations of the papers' update rules, in float64, for the tests.

Written straight from the papers, one layer (a NumPy array) at a time, without lbjax or optax.
"""

import numpy as np


def _norm(x: np.ndarray) -> float:
  return float(np.sqrt(np.sum(np.asarray(x, np.float64) ** 2)))


def lars_local_lr(w, g, eta, beta, eps=0.0, denominator="paper"):
  """papers/000 Algorithm 1: lambda = eta * ||w|| / (||g|| + beta * ||w||); eta when undefined."""
  w_norm = _norm(w)
  den = (_norm(g) + beta * w_norm if denominator == "paper" else _norm(g + beta * w)) + eps
  if w_norm == 0 or den == 0:
    return eta
  return eta * w_norm / den


def lars_step(w, g, v, lr, m, beta, eta, selected, eps=0.0, denominator="paper"):
  """One step of papers/000 Algorithm 1 for one layer; unselected layers get momentum SGD.

  Returns (new_w, new_v, local_lr or None).
  """
  if selected:
    local_lr = lars_local_lr(w, g, eta, beta, eps, denominator)
    v = m * v + lr * local_lr * (g + beta * w)
  else:
    local_lr = None
    v = m * v + lr * g
  return w - v, v, local_lr


def lamb_step(w, g, m1, m2, t, lr, b1, b2, eps, beta, selected):
  """One LAMB step (You et al. 2019): bias-corrected Adam direction r, decoupled weight decay, and
  the trust ratio ||w|| / ||r + beta*w|| (1 if either norm is zero). Returns (w, m1, m2, ratio)."""
  m1 = b1 * m1 + (1 - b1) * g
  m2 = b2 * m2 + (1 - b2) * g * g
  m_hat = m1 / (1 - b1**t)
  v_hat = m2 / (1 - b2**t)
  r = m_hat / (np.sqrt(v_hat) + eps)
  if not selected:
    return w - lr * r, m1, m2, None
  u = r + beta * w
  w_norm, u_norm = _norm(w), _norm(u)
  ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
  return w - lr * ratio * u, m1, m2, ratio


def percent_delta_rate(w, g, beta):
  """papers/003 eq. 24: size(w) / ||(g + beta*w) / w||_1 over the nonzero weights; 1 if undefined."""
  d = g + beta * w
  nonzero = w != 0
  total = float(np.sum(np.abs(d[nonzero]) / np.abs(w[nonzero])))
  count = int(np.sum(nonzero))
  if count == 0 or total == 0:
    return 1.0
  return count / total


def median_curvature_rate(w, g, beta):
  """papers/003 eq. 20/22: R_m = |w_m| / (|g_m| + beta*|w_m|) with medians of magnitudes."""
  w_m = float(np.median(np.abs(w)))
  g_m = float(np.median(np.abs(g)))
  den = g_m + beta * w_m
  if w_m == 0 or den == 0:
    return 1.0
  return w_m / den


def layer_rate_momentum(params, grads_seq, lr, m, beta, rate_fn, selected):
  """Momentum with a per-layer rate (papers/003 eq. 21): v = m*v + lr*R(w, g)*(g + beta*w), w -= v.

  Layers not `selected` take plain momentum steps (v = m*v + lr*g). Returns the final weights and the
  last rate R of every selected layer.
  """
  w = {k: np.asarray(x, np.float64) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  rates = {}
  for grads in grads_seq:
    for k in w:
      if selected[k]:
        rates[k] = rate_fn(w[k], grads[k], beta)
        v[k] = m * v[k] + lr * rates[k] * (grads[k] + beta * w[k])
      else:
        v[k] = m * v[k] + lr * grads[k]
      w[k] = w[k] - v[k]
  return w, rates


def lamb_trust_ratio(w, u, beta):
  """The LAMB trust ratio of a direction u (You et al. 2020, Algorithm 2): ||w|| / ||u + beta*w||;
  1 if either norm is zero."""
  w_norm, u_norm = _norm(w), _norm(u + beta * w)
  return w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0


def one_bit(g):
  """1-bit SGD (Seide et al. 2014; papers/004): each entry becomes the mean of its sign group
  (g_i >= 0 or g_i < 0); an empty group has mean 0."""
  g = np.asarray(g, np.float64)
  nonneg = g >= 0
  mean_pos = g[nonneg].mean() if nonneg.any() else 0.0
  mean_neg = g[~nonneg].mean() if (~nonneg).any() else 0.0
  return np.where(nonneg, mean_pos, mean_neg)


def one_bit_sgd(params, grads_seq, lr, error_feedback):
  """SGD on 1-bit-quantised gradients, w -= lr * q(g + r), with the residual r = (g + r) - q(g + r)
  carried to the next step when `error_feedback` (Seide et al. 2014). Returns the final weights."""
  w = {k: np.asarray(x, np.float64) for k, x in params.items()}
  r = {k: np.zeros_like(x) for k, x in w.items()}
  for grads in grads_seq:
    for k in w:
      p = grads[k] + r[k] if error_feedback else grads[k]
      q = one_bit(p)
      if error_feedback:
        r[k] = p - q
      w[k] = w[k] - lr * q
  return w


def powersgd_sgd(params, grads_seq, lr, queries):
  """SGD on single-worker PowerSGD updates (Vogels et al. 2019, Algorithms 1-2): for each leaf with an
  initial query Q (its matrix view: all axes but the last x the last), M = g + e, P^ = orth(M Q),
  Q = M^T P^ (kept: warm start), w -= lr * P^ Q^T, e = M - P^ Q^T; leaves without a query are sent
  whole. `queries`: {leaf name: initial Q}. Returns the final weights."""
  w = {k: np.asarray(x, np.float64) for k, x in params.items()}
  q = {k: np.asarray(x, np.float64) for k, x in queries.items()}
  e = {k: np.zeros((int(np.prod(w[k].shape[:-1])), w[k].shape[-1])) for k in q}
  for grads in grads_seq:
    for k in w:
      if k not in q:
        w[k] = w[k] - lr * grads[k]
        continue
      m = grads[k].reshape(e[k].shape) + e[k]
      p_hat = np.linalg.qr(m @ q[k])[0]
      q[k] = m.T @ p_hat
      update = p_hat @ q[k].T
      e[k] = m - update
      w[k] = w[k] - lr * update.reshape(w[k].shape)
  return w


def momentum_sgd(params, grads_seq, lr, m, beta, selected):
  """Heavy-ball SGD with L2 weight decay on the selected layers, as optax.sgd orders it:
  v = m*v + (g + beta*w), w -= lr*v. Returns the final weights."""
  w = {k: np.asarray(x, np.float64) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for grads in grads_seq:
    for k in w:
      d = grads[k] + beta * w[k] if selected[k] else grads[k]
      v[k] = m * v[k] + d
      w[k] = w[k] - lr * v[k]
  return w
