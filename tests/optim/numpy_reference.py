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
