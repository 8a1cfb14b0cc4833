"""The SGD noise scale of Smith & Le and the batch-size rule it implies (papers/002).

SGD with learning rate eps, momentum m, batch size B on N training examples has noise scale

  g = eps / (1 - m) * (N / B - 1)  ~=  eps * N / (B * (1 - m))   (B << N),

where eps / (1 - m) is the effective learning rate. Recipes that keep g equal at every epoch train
alike (papers/002, "Simulated annealing in a wide ResNet"); hence B proportional to eps / (1 - m).
"""

from lbjax.schedules import validation


def effective_learning_rate(learning_rate: float, momentum: float = 0.0) -> float:
  """Returns `eps_eff = eps / (1 - m)` (papers/002, "The effective learning rate").

  Args:
    learning_rate: eps, > 0.
    momentum: m, 0 <= m < 1.
  """
  learning_rate = validation.check_positive("learning_rate", learning_rate)
  momentum = validation.check_momentum("momentum", momentum)
  return learning_rate / (1.0 - momentum)


def _check_batch(batch_size: int, num_train_examples: int) -> tuple[int, int]:
  batch_size = validation.check_positive_int("batch_size", batch_size)
  num_train_examples = validation.check_positive_int("num_train_examples", num_train_examples)
  if batch_size > num_train_examples:
    raise ValueError(
        f"batch_size ({batch_size}) must not exceed num_train_examples ({num_train_examples}): "
        "the noise scale is defined for B <= N."
    )
  return batch_size, num_train_examples


def noise_scale(
    learning_rate: float, batch_size: int, num_train_examples: int, momentum: float = 0.0
) -> float:
  """Returns the noise scale `g = eps * N / (B * (1 - m))` (papers/002, the B << N form).

  Args:
    learning_rate: eps, > 0.
    batch_size: B, a positive int <= N.
    num_train_examples: N, a positive int.
    momentum: m, 0 <= m < 1.
  """
  batch_size, num_train_examples = _check_batch(batch_size, num_train_examples)
  return effective_learning_rate(learning_rate, momentum) * num_train_examples / batch_size


def exact_noise_scale(
    learning_rate: float, batch_size: int, num_train_examples: int, momentum: float = 0.0
) -> float:
  """Returns the noise scale `g = eps / (1 - m) * (N / B - 1)` (papers/002, Smith & Le).

  Args:
    learning_rate: eps, > 0.
    batch_size: B, a positive int <= N (g = 0 at B = N: full-batch gradient descent).
    num_train_examples: N, a positive int.
    momentum: m, 0 <= m < 1.
  """
  batch_size, num_train_examples = _check_batch(batch_size, num_train_examples)
  return effective_learning_rate(learning_rate, momentum) * (
      num_train_examples / batch_size - 1.0
  )


def noise_preserving_batch_size(
    base_batch_size: int,
    base_learning_rate: float,
    learning_rate: float,
    base_momentum: float = 0.0,
    momentum: float = 0.0,
) -> int:
  """Returns the batch size that keeps `g ~ eps * N / (B (1 - m))` when eps and m change.

    B = base_B * (eps / (1 - m)) / (base_eps / (1 - base_m)),  rounded to the nearest integer

  (papers/002: B proportional to eps / (1 - m)). Example from papers/002: base B=128, eps=0.1,
  m=0.9; eps=0.5 gives B=640; eps=0.5 and m=0.98 gives B=3200.

  Args:
    base_batch_size: batch size of the baseline recipe, a positive int.
    base_learning_rate: its learning rate, > 0.
    learning_rate: the new learning rate, > 0.
    base_momentum: its momentum, 0 <= m < 1.
    momentum: the new momentum, 0 <= m < 1.

  Raises:
    ValueError: on bad inputs, or if the scaled batch rounds to less than 1.
  """
  base_batch_size = validation.check_positive_int("base_batch_size", base_batch_size)
  ratio = effective_learning_rate(learning_rate, momentum) / effective_learning_rate(
      base_learning_rate, base_momentum
  )
  batch_size = round(base_batch_size * ratio)
  if batch_size < 1:
    raise ValueError(
        f"the noise-preserving batch size {base_batch_size} * {ratio:g} rounds to {batch_size}; "
        "the new effective learning rate is too small for this base batch size."
    )
  return batch_size
