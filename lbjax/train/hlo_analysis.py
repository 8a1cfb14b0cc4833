"""Figures read from a compiled program's HLO text: the bytes of its collectives, its matmul FLOPs and its kernels.

`analyze(compiled.as_text())` walks the optimized HLO module (the per-device SPMD program) and counts

* every collective, by kind (`all-reduce`, `reduce-scatter`, `all-gather`, `collective-permute`,
  `all-to-all`; the asynchronous `-start` halves, never the `-done` ones): the bytes of its operands,
  i.e. what one device hands to the collective (an all-reduce of the gradients: the gradient bytes;
  an all-gather: the device's shard); its payload, the full array it reduces or gathers; and the bytes
  one device sends with ring algorithms over its replica group of n devices: 2(n-1)/n x the payload for
  an all-reduce (a reduce-scatter and an all-gather), (n-1)/n for a reduce-scatter, an all-gather and an
  all-to-all, 1 x for a collective-permute. Collectives in `call`ed computations count, and those of a
  `call-start`, with which XLA:TPU offloads a collective to a SparseCore (TPU7x's gradient all-reduce);
* the FLOPs of every `dot` and `convolution` (TPU writes matmuls as convolutions), 2 per
  multiply-add: 2 * |result| * (contracted size), the contracted size being the product of a dot's
  contracting dimensions, or of a convolution kernel's spatial dimensions and its input features. On a
  GPU the convolutions are cuDNN calls (`custom-call`s to `__cudnn$conv...`: forward, input gradient and
  kernel gradient, each 2 * |kernel| * the forward output's batch and spatial positions) and some matmuls
  cuBLAS calls (`__cublas$...`), counted as the operations they compute;
* the kernels one execution launches: every instruction of the entry computation and of the
  computations its control flow runs (`while` bodies and conditions, `conditional` branches, `call`s)
  that computes (a fusion, a library call, a copy, an unfused operation), not the values, views and
  control flow themselves, nor the `-done` halves of asynchronous pairs. On a GPU each is one kernel
  (or library call) the runtime launches: the figure that sets a step's time where its kernels are short;
* the bytes those kernels read and write, each kernel's operands (a fusion's as far as it slices them) and
  results: where a step's elementwise and reduction kernels are bound by memory (on a GPU, BatchNorm and
  activations beside the convolutions), the figure their time follows.

All count an instruction inside a `while` body once per iteration: a loop's trip count is read from
its `known_trip_count`, or from the `counter < N` comparison of its condition (XLA's scans count from
0), and multiplies everything the body calls. XLA's own `cost_analysis()` counts a loop body once,
whatever its trip count (a 10-step `lax.scan` of a matmul reports a tenth of the unrolled loop's
FLOPs), which is why `HloFigures.loop_flop_ratio` is kept: the matmul FLOPs counted per
iteration over those counted once.
"""

from collections import defaultdict
import dataclasses
import math
import re
from typing import Any

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1,
          "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "s4": 0.5, "u4": 0.5}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_OPERAND = re.compile(r"%([^\s,()]+)")
_CALLED = re.compile(r"\b(body|condition|calls|to_apply|branch_computations)=\{?(%[^\s,}]+(?:,\s*%[^\s,}]+)*)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CALL_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_LHS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
# cuDNN's convolution calls: where the forward output and the kernel are (an operand's index, or "result").
# Their `dim_labels` are the forward convolution's whatever the call computes.
_CUDNN_CONVOLUTIONS = {"__cudnn$convForward": ("result", 1), "__cudnn$convBiasActivationForward": ("result", 1),
                       "__cudnn$convBackwardInput": (0, 1), "__cudnn$convBackwardFilter": (1, "result")}
# Instructions that launch nothing of their own: values, views, ordering tokens, and control flow (what it runs
# is counted where it runs). The `-done` half of an asynchronous pair waits for its `-start`.
_NO_KERNEL = frozenset({"parameter", "tuple", "get-tuple-element", "constant", "bitcast", "while", "conditional",
                        "call", "after-all", "add-dependency", "opt-barrier"})


@dataclasses.dataclass(frozen=True)
class HloFigures:
  """What `analyze` reads from one HLO module (per device).

  Attributes:
    collective_bytes: operand bytes per step by collective kind (every kind of `COLLECTIVES`, 0 if absent).
    collective_counts: collective instructions executed per step, by kind.
    collective_payload_bytes: the bytes of the full arrays the collectives reduce or gather per step, by
      kind (a reduce-scatter: its result times the group size).
    collective_ring_bytes: the bytes one device sends per step with ring algorithms, by kind.
    matmul_flops: FLOPs of the dots and convolutions per step, loop bodies counted per iteration.
    matmul_flops_once: the same with every loop body counted once (as XLA's cost analysis does).
    loop_trip_counts: the trip count of each `while` loop (1 where it could not be read).
    kernels: the kernels one execution launches, loop bodies counted per iteration (a `conditional`:
      its largest branch).
    kernel_bytes: the bytes those kernels read and write per step, loop bodies counted per iteration: each
      kernel's results, and its operands in full except where a fusion reads only slices of one (through
      views and elementwise operations: the part it slices). The memory traffic of a step whose kernels
      are fused as compiled; a library call's workspace, what a kernel reads twice and what it reads of
      an operand it gathers from or reduces a window of are not told apart (counted once, in full).
    all_reduce_16bit_bytes: the bytes of the all-reduce results in 16-bit floats (bf16, f16): what is
      summed across the devices at that precision (a bfloat16 model's gradients, where the partitioner
      reduces the convolutions' partial gradients before their cast to the float32 parameters). The
      result's type, not the operand's: XLA:TPU can take a bf16 operand into a float32 sum.
  """
  collective_bytes: dict[str, int]
  collective_counts: dict[str, int]
  matmul_flops: float
  matmul_flops_once: float
  loop_trip_counts: tuple[int, ...]
  all_reduce_16bit_bytes: int = 0
  kernels: int = 0
  collective_payload_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  collective_ring_bytes: dict[str, float] = dataclasses.field(default_factory=dict)
  kernel_bytes: float = 0.0

  @property
  def collectives(self) -> dict[str, tuple[int, int, float]]:
    """kind -> (count, payload bytes, ring bytes sent per device) per step, for the kinds the module has."""
    return {kind: (count, self.collective_payload_bytes[kind], self.collective_ring_bytes[kind])
            for kind, count in self.collective_counts.items() if count}

  @property
  def loop_flop_ratio(self) -> float:
    """matmul FLOPs counted per loop iteration over those counted once (1.0 without loops or matmuls)."""
    return self.matmul_flops / self.matmul_flops_once if self.matmul_flops_once else 1.0


_16BIT_FLOATS = ("bf16", "f16")


def array_bytes(shape_text: str, dtypes: tuple[str, ...] | None = None) -> float:
  """Bytes of every array in an HLO shape (`f32[8,128]{1,0}` or a tuple of them); of those of `dtypes` only,
  when given."""
  return sum(_BYTES.get(dtype, 0) * math.prod(_dims(dims)) for dtype, dims in _ARRAY.findall(shape_text)
             if dtypes is None or dtype in dtypes)


def _dims(text: str) -> list[int]:
  return [int(d) for d in text.split(",") if d]


def _first_array(shape_text: str) -> list[int]:
  found = _ARRAY.search(shape_text)
  return _dims(found.group(2)) if found else []


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  opcode: str
  rest: str  # operands and attributes


def _operands(instruction: _Instruction) -> list[str]:
  """The names of an instruction's operands (those before its attributes)."""
  return _OPERAND.findall(instruction.rest.split(")", 1)[0])


def _parse(hlo_text: str) -> tuple[dict[str, list[_Instruction]], str | None]:
  """Computations by name (their instructions in order) and the name of the entry computation."""
  computations: dict[str, list[_Instruction]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    if " = " not in line.split("(", 1)[0]:
      header = _HEADER.match(line)
      if header:
        current = header.group(1).lstrip("%")
        computations[current] = []
        if line.startswith("ENTRY"):
          entry = current
        continue
    found = _INSTRUCTION.match(line)
    if found and current is not None:
      computations[current].append(_Instruction(*found.groups()))
  return computations, entry


def _trip_count(instruction: _Instruction, computations: dict[str, list[_Instruction]]) -> int:
  """A `while` loop's trip count: its `known_trip_count`, else N of the condition's `counter < N`."""
  known = _TRIP_COUNT.search(instruction.rest)
  if known:
    return int(known.group(1))
  condition = re.search(r"condition=%([^\s,]+)", instruction.rest)
  body = computations.get(condition.group(1), []) if condition else []
  constants = {i.name: i.rest.split(")", 1)[0] for i in body if i.opcode == "constant"}
  for i in body:
    if i.opcode == "compare" and "direction=LT" in i.rest:
      for operand in _operands(i):
        if operand in constants and constants[operand].lstrip("-").isdigit():
          return int(constants[operand])
  return 1


# Instructions whose `to_apply` is a computation they run: a `call`, and the asynchronous `call-start` with which
# XLA:TPU offloads a collective to a SparseCore (TPU7x: the gradient all-reduce).
_CALLS = ("call", "call-start")


def _multipliers(computations: dict[str, list[_Instruction]], entry: str
                 ) -> tuple[dict[str, int], dict[str, int], list[int]]:
  """How many times each computation runs per execution of `entry`, the same with every loop body
  run once, and the loops' trip counts."""
  times: dict[str, int] = defaultdict(int)
  times_once: dict[str, int] = defaultdict(int)
  trips: list[int] = []

  def visit(name: str, count: int, count_once: int) -> None:
    times[name] += count
    times_once[name] += count_once
    for instruction in computations.get(name, []):
      trip = _trip_count(instruction, computations) if instruction.opcode == "while" else 1
      if instruction.opcode == "while":
        trips.append(trip)
      for kind, names in _CALLED.findall(instruction.rest):
        if kind == "to_apply" and instruction.opcode not in _CALLS:  # scalar reductions: no collectives, no matmuls
          continue
        for called in re.findall(r"%([^\s,}]+)", names):
          visit(called, count * (trip if kind == "body" else 1), count_once)

  visit(entry, 1, 1)
  return times, times_once, trips


def _library_call_flops(instruction: _Instruction, operands: list[str], shapes: dict[str, str]) -> float:
  """A cuDNN convolution's or cuBLAS matmul's FLOPs (0 for any other `custom-call`)."""
  target = _CALL_TARGET.search(instruction.rest)
  target = target.group(1) if target else ""
  if target.startswith("__cublas$"):
    lhs = _first_array(shapes.get(operands[0], "")) if operands else []
    contracting = _LHS_CONTRACTING.search(instruction.rest)
    indices = [int(d) for d in re.findall(r"\d+", contracting.group(1))] if contracting else []
    return 2.0 * math.prod(_first_array(instruction.shape)) * math.prod(lhs[i] for i in indices if i < len(lhs))
  if target not in _CUDNN_CONVOLUTIONS:
    return 0.0

  def shape(at: int | str) -> list[int]:
    if at == "result":
      return _first_array(instruction.shape)
    return _first_array(shapes.get(operands[at], "")) if at < len(operands) else []

  output_at, kernel_at = _CUDNN_CONVOLUTIONS[target]
  output, kernel = shape(output_at), shape(kernel_at)
  labels = re.search(r"dim_labels=[^_]+_[^-]+->(\w+)", instruction.rest)
  if labels is None or "f" not in labels.group(1) or len(output) != len(labels.group(1)) or not kernel:
    return 0.0
  positions = math.prod(output) // output[labels.group(1).index("f")]  # the output's batch x spatial positions
  return 2.0 * positions * math.prod(kernel)


def _matmul_flops(instruction: _Instruction, shapes: dict[str, str]) -> float:
  operands = _operands(instruction)
  if instruction.opcode == "custom-call":
    return _library_call_flops(instruction, operands, shapes)
  result = math.prod(_first_array(instruction.shape))
  if instruction.opcode == "dot":
    lhs = _first_array(shapes.get(operands[0], ""))
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instruction.rest)
    indices = _dims(contracting.group(1)) if contracting else []
    return 2.0 * result * math.prod(lhs[i] for i in indices if i < len(lhs))
  labels = re.search(r"dim_labels=[^_]+_([^-]+)->", instruction.rest)
  if labels is None or len(operands) < 2:
    return 0.0
  kernel = _first_array(shapes.get(operands[1], ""))
  kernel_labels = labels.group(1)
  if len(kernel) != len(kernel_labels):
    return 0.0
  contracted = math.prod(size for size, label in zip(kernel, kernel_labels) if label != "o")
  return 2.0 * result * contracted


def _result_shape(instruction: _Instruction) -> str:
  """A collective's result shape. XLA:GPU's asynchronous `all-reduce-start` returns `((operands), results)`,
  the operands it aliases first; XLA:TPU's returns the results alone."""
  shape = instruction.shape
  if not (instruction.opcode.endswith("-start") and shape.startswith("((")):
    return shape
  depth = 0
  for position, character in enumerate(shape[1:], start=1):
    depth += {"(": 1, ")": -1}.get(character, 0)
    if depth == 0:  # the end of the operands' tuple
      return shape[position + 1:]
  return shape


def _group_size(instruction: _Instruction, devices: int) -> int:
  """The number of devices in each replica group of a collective; `devices` (the module's) when the groups
  are not written out (`replica_groups={}`: one group of every device)."""
  mesh_form = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", instruction.rest)
  if mesh_form:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh_form.group(1)))
    return math.prod(int(sizes[axis]) for axis in re.findall(r"'(\w+)'", mesh_form.group(2)))
  iota_form = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", instruction.rest)
  if iota_form:
    return int(iota_form.group(2))
  explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", instruction.rest)
  return len(explicit.group(1).split(",")) if explicit else devices


def _module_devices(hlo_text: str) -> int:
  """The devices an HLO module runs on: its header's `replica_count` x `num_partitions` (1 if unnamed)."""
  header = hlo_text.split("\n", 1)[0]
  counts = [re.search(rf"\b{name}=(\d+)", header) for name in ("replica_count", "num_partitions")]
  return math.prod(int(count.group(1)) for count in counts if count)


def _ring_factor(kind: str, group_size: int) -> float:
  """Bytes each device sends per payload byte with ring algorithms (an all-reduce: a reduce-scatter and an
  all-gather)."""
  if kind == "collective-permute":
    return 1.0
  share = (group_size - 1) / group_size
  return 2 * share if kind == "all-reduce" else share


def _kernel_instructions(computations: dict[str, list[_Instruction]], name: str,
                         times: int = 1) -> list[tuple[_Instruction, int]]:
  """Each kernel one execution of computation `name` launches `times` times (`HloFigures.kernels`), with
  how often it runs: the instructions that compute, those of the `while` bodies and conditions, the
  largest `conditional` branch and the `call`ed computations they run included."""
  kernels = []
  for instruction in computations.get(name, []):
    called = {kind: re.findall(r"%([^\s,}]+)", names) for kind, names in _CALLED.findall(instruction.rest)}
    if instruction.opcode == "while":
      trip = _trip_count(instruction, computations)
      for body in called.get("body", []):
        kernels += _kernel_instructions(computations, body, times * trip)
      for condition in called.get("condition", []):
        kernels += _kernel_instructions(computations, condition, times * (trip + 1))
    elif instruction.opcode == "conditional":
      branches = called.get("branch_computations", []) + re.findall(r"(?:true|false)_computation=%([^\s,]+)",
                                                                     instruction.rest)
      launches = [_kernel_instructions(computations, branch, times) for branch in branches]
      kernels += max(launches, key=lambda branch: sum(count for _, count in branch), default=[])
    elif instruction.opcode == "call":
      for target in called.get("to_apply", []):
        kernels += _kernel_instructions(computations, target, times)
    elif instruction.opcode not in _NO_KERNEL and not instruction.opcode.endswith("-done"):
      kernels.append((instruction, times))
  return kernels


# Inside a fusion: instructions that map each element of an operand to one element of the result (views and
# elementwise operations), through which a slice further on still reads only its part of a fusion's operand.
_ELEMENT_FOR_ELEMENT = frozenset({
    "bitcast", "reshape", "convert", "negate", "abs", "add", "subtract", "multiply", "divide", "maximum", "minimum",
    "select", "compare", "and", "or", "not", "xor", "exponential", "log", "sqrt", "rsqrt", "tanh", "logistic",
    "power", "clamp", "sign", "floor", "ceil", "round-nearest-even", "is-finite"})
_PARAMETER_INDEX = re.compile(r"(\d+)\)")  # what follows `parameter(` in a fused computation


def _read_fraction(value: str, users: dict[str, list[_Instruction]], shapes: dict[str, str]) -> float:
  """The share of `value`'s elements a fused computation reads: below 1 only where every use of it leads,
  through views and elementwise operations, to slices (a flat buffer of which the fusion writes one leaf)."""
  elements = math.prod(_first_array(shapes.get(value, ""))) or 1
  total = 0.0
  for user in users.get(value, []):
    if user.opcode in ("slice", "dynamic-slice"):
      total += math.prod(_first_array(user.shape)) / elements
    elif user.opcode in _ELEMENT_FOR_ELEMENT and math.prod(_first_array(user.shape)) == elements:
      total += _read_fraction(user.name, users, shapes)
    else:
      return 1.0
  return min(total, 1.0) if users.get(value) else 1.0


def _operand_bytes(instruction: _Instruction, computations: dict[str, list[_Instruction]],
                   shapes: dict[str, str]) -> float:
  """The bytes a kernel reads of its operands: each in full, but a fusion's operand only as far as its fused
  computation reads it (`_read_fraction`)."""
  operands = _operands(instruction)
  fused = re.search(r"\bcalls=%([^\s,]+)", instruction.rest) if instruction.opcode == "fusion" else None
  fractions = [1.0] * len(operands)
  if fused and fused.group(1) in computations:
    body = computations[fused.group(1)]
    body_shapes = {i.name: i.shape for i in body}
    users: dict[str, list[_Instruction]] = defaultdict(list)
    for inner in body:
      for operand in set(_operands(inner)):
        users[operand].append(inner)
    for inner in body:
      index = _PARAMETER_INDEX.match(inner.rest) if inner.opcode == "parameter" else None
      if index and int(index.group(1)) < len(operands):
        fractions[int(index.group(1))] = _read_fraction(inner.name, users, body_shapes)
  return sum(fraction * array_bytes(shapes.get(operand, "")) for operand, fraction in zip(operands, fractions))


def kernel_count(compiled: Any) -> int:
  """The kernels one call of `compiled` (a `jax.stages.Compiled`) launches (`HloFigures.kernels`)."""
  return analyze(compiled.as_text()).kernels


def analyze(hlo_text: str) -> HloFigures:
  """The collective bytes, matmul FLOPs, kernels and kernel bytes of one step of the compiled HLO module
  `hlo_text`."""
  computations, entry = _parse(hlo_text)
  shapes = {i.name: i.shape for instructions in computations.values() for i in instructions}
  times, times_once, trips = _multipliers(computations, entry) if entry else ({}, {}, [])
  collective_bytes = dict.fromkeys(COLLECTIVES, 0)
  collective_counts = dict.fromkeys(COLLECTIVES, 0)
  devices = _module_devices(hlo_text)
  payload_bytes = dict.fromkeys(COLLECTIVES, 0)
  ring_bytes = dict.fromkeys(COLLECTIVES, 0.0)
  flops = flops_once = 0.0
  all_reduce_16bit = 0
  for name, instructions in computations.items():
    count = times.get(name, 0)
    if not count:
      continue
    for instruction in instructions:
      kind = instruction.opcode.removesuffix("-start")
      if kind in COLLECTIVES:
        operands = _operands(instruction)
        collective_bytes[kind] += count * int(sum(array_bytes(shapes.get(o, "")) for o in operands))
        collective_counts[kind] += count
        group_size = _group_size(instruction, devices)
        payload = int(array_bytes(_result_shape(instruction))) * (group_size if kind == "reduce-scatter" else 1)
        payload_bytes[kind] += count * payload
        ring_bytes[kind] += count * payload * _ring_factor(kind, group_size)
        if kind == "all-reduce":  # the result's type is the sum's (XLA:TPU may sum a bf16 operand into an f32)
          all_reduce_16bit += count * int(array_bytes(_result_shape(instruction), _16BIT_FLOATS))
      elif instruction.opcode in ("dot", "convolution", "custom-call"):
        matmul = _matmul_flops(instruction, shapes)
        flops += count * matmul
        flops_once += times_once[name] * matmul
  kernels = _kernel_instructions(computations, entry) if entry else []
  kernel_bytes = sum(count * (array_bytes(instruction.shape) + _operand_bytes(instruction, computations, shapes))
                     for instruction, count in kernels)
  return HloFigures(collective_bytes, collective_counts, flops, flops_once, tuple(trips), all_reduce_16bit,
                    sum(count for _, count in kernels), payload_bytes, ring_bytes, kernel_bytes)
