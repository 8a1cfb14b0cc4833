"""`lbjax.train.hlo_analysis`: collective bytes, matmul FLOPs and kernels read from compiled HLO, on programs
compiled here and on hand-written HLO in the forms XLA:TPU and XLA:GPU print (asynchronous collectives,
cuDNN and cuBLAS calls, control flow)."""
# ruff: noqa: E501  (the HLO below has one instruction per line, as XLA prints it)

import jax
import jax.numpy as jnp

from lbjax.train import hlo_analysis


# The scalar sum the hand-written modules' collectives reduce with.
F32_ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

"""

def test_a_scan_is_counted_once_per_iteration():
  """XLA's cost analysis counts a loop body once; the HLO analysis multiplies it by the trip count."""
  batch, hidden, steps = 8, 32, 7

  def loss(w, x):
    return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), x, None, length=steps)[0].sum()

  w, x = jnp.zeros((hidden, hidden)), jnp.zeros((batch, hidden))
  figures = hlo_analysis.analyze(jax.jit(jax.grad(loss)).lower(w, x).compile().as_text())
  per_step = 2 * batch * hidden * hidden  # one [B, H] x [H, H] matmul
  assert figures.matmul_flops == 3 * steps * per_step  # forward, and the two matmuls of the backward pass
  assert figures.loop_flop_ratio == steps and steps in figures.loop_trip_counts


def test_all_reduce_bytes_in_16_bit_floats_are_counted_apart():
  """An all-reduce of a bf16 and an f32 operand: both in the all-reduce bytes, the bf16 one also apart."""
  hlo = """HloModule m

""" + F32_ADD + """ENTRY %main (p: bf16[64,8], q: f32[16]) -> (bf16[64,8], f32[16]) {
  %p = bf16[64,8]{1,0} parameter(0)
  %q = f32[16]{0} parameter(1)
  ROOT %r = (bf16[64,8]{1,0}, f32[16]{0}) all-reduce(%p, %q), replica_groups={}, to_apply=%add
}
"""
  figures = hlo_analysis.analyze(hlo)
  assert figures.collective_bytes["all-reduce"] == 64 * 8 * 2 + 16 * 4
  assert figures.all_reduce_16bit_bytes == 64 * 8 * 2


def test_an_asynchronous_gpu_all_reduce_is_counted_once():
  """XLA:GPU's `all-reduce-start` returns ((operands), results): the operands' aliases are not a second sum."""
  hlo = """HloModule m

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %s = bf16[] add(%a, %b)
}

ENTRY %main (p: bf16[5122]) -> bf16[5122] {
  %p = bf16[5122]{0} parameter(0)
  %start = ((bf16[5122]{0}), bf16[5122]{0}) all-reduce-start(%p), replica_groups={}, to_apply=%add
  ROOT %done = bf16[5122]{0} all-reduce-done(%start)
}
"""
  figures = hlo_analysis.analyze(hlo)
  assert figures.collective_bytes["all-reduce"] == figures.all_reduce_16bit_bytes == 5122 * 2
  assert figures.collective_counts["all-reduce"] == 1


def test_a_collective_in_a_called_computation_is_counted():
  """XLA:TPU for TPU7x offloads the gradient all-reduce to a SparseCore: `call-start` on the "sparsecore" thread
  (its `to_apply` holds the all-reduce), `call-update` feeds it, `call-done` waits. A plain `call` names its
  computation the same way. Both collectives and the matmul in a called computation count once."""
  hlo = """HloModule m, replica_count=1, num_partitions=8

""" + F32_ADD + """%offloaded (a: f32[512,256]) -> f32[512,256] {
  %a = f32[512,256]{0,1} parameter(0)
  ROOT %ar = f32[512,256]{0,1} all-reduce(%a), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}

%called (b: f32[64], w: f32[64,64]) -> f32[64] {
  %b = f32[64]{0} parameter(0)
  %w = f32[64,64]{1,0} parameter(1)
  %d = f32[64]{0} dot(%b, %w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  ROOT %ar2 = f32[64]{0} all-reduce(%d), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}

ENTRY %main (g: f32[512,256], b: f32[64], w: f32[64,64]) -> (f32[512,256], f32[64]) {
  %g = f32[512,256]{0,1} parameter(0)
  %b = f32[64]{0} parameter(1)
  %w = f32[64,64]{1,0} parameter(2)
  %start = ((), (), (s32[1]{0})) call-start(), async_execution_thread="sparsecore", to_apply=%offloaded
  %update = ((f32[512,256]{0,1}), f32[512,256]{0,1}) call-update(%start, %g)
  %done = f32[512,256]{0,1} call-done(%update)
  %c = f32[64]{0} call(%b, %w), to_apply=%called
  ROOT %t = (f32[512,256]{0,1}, f32[64]{0}) tuple(%done, %c)
}
"""
  figures = hlo_analysis.analyze(hlo)
  assert figures.collective_counts["all-reduce"] == 2
  assert figures.collective_bytes["all-reduce"] == 512 * 256 * 4 + 64 * 4
  assert figures.matmul_flops == 2 * 64 * 64


def test_collective_payload_and_ring_bytes_follow_each_replica_group():
  """Payload: the full array reduced or gathered; ring bytes one device sends over its group of n: 2(n-1)/n
  (all-reduce), (n-1)/n (reduce-scatter, all-gather), 1 (collective-permute)."""
  hlo = """HloModule m

""" + F32_ADD + """ENTRY %main (p: f32[64]) -> (f32[64], f32[256], f32[16], f32[64]) {
  %p = f32[64]{0} parameter(0)
  %ar = f32[64]{0} all-reduce(%p), replica_groups=[1,8]<=[8], to_apply=%add
  %ag = f32[256]{0} all-gather(%p), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %rs = f32[16]{0} reduce-scatter(%p), replica_groups=[2,4]<=[8], dimensions={0}, to_apply=%add
  %cp = f32[64]{0} collective-permute(%p), source_target_pairs={{0,1},{1,0}}
  ROOT %t = (f32[64]{0}, f32[256]{0}, f32[16]{0}, f32[64]{0}) tuple(%ar, %ag, %rs, %cp)
}
"""
  figures = hlo_analysis.analyze(hlo)
  assert figures.collectives == {"all-reduce": (1, 256, 256 * 2 * 7 / 8), "all-gather": (1, 1024, 1024 * 3 / 4),
                                 "reduce-scatter": (1, 256, 256 * 3 / 4), "collective-permute": (1, 256, 256)}
  assert figures.collective_bytes["all-gather"] == figures.collective_bytes["reduce-scatter"] == 256  # operands


def test_unwritten_replica_groups_are_every_device_of_the_module():
  hlo = """HloModule m, replica_count=1, num_partitions=4

""" + F32_ADD + """ENTRY %main (p: f32[64]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  ROOT %ar = f32[64]{0} all-reduce(%p), channel_id=1, replica_groups={}, use_global_device_ids=true, to_apply=%add
}
"""
  assert hlo_analysis.analyze(hlo).collectives == {"all-reduce": (1, 256, 256 * 2 * 3 / 4)}


def _scan_gradient(length: int) -> jax.stages.Compiled:
  """The gradient of a `length`-step scan of a matmul, compiled for the CPU."""

  def loss(w, x):
    return jax.lax.scan(lambda h, _: (jnp.tanh(h @ w) + 1.0, None), x, None, length=length)[0].sum()

  w, x = jnp.zeros((32, 32)), jnp.zeros((8, 32))
  return jax.jit(jax.grad(loss)).lower(w, x).compile()


def test_a_loop_launches_its_kernels_once_per_iteration():
  """The kernels grow by the same number with every 5 more steps of the scan (its forward and backward loops'
  bodies and conditions); `kernel_count` of a compiled program is `analyze`'s figure."""
  programs = [_scan_gradient(n) for n in (5, 10, 15)]
  five, ten, fifteen = (hlo_analysis.analyze(p.as_text()).kernels for p in programs)
  assert fifteen - ten == ten - five > 10
  assert [hlo_analysis.kernel_count(p) for p in programs] == [five, ten, fifteen]


CONTROL_FLOW = """HloModule m

%fused_add (p0: f32[64], p1: f32[64]) -> f32[64] {
  %p0 = f32[64]{0} parameter(0)
  %p1 = f32[64]{0} parameter(1)
  ROOT %a = f32[64]{0} add(%p0, %p1)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (t: (s32[], f32[64])) -> (s32[], f32[64]) {
  %t = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[64]{0} get-tuple-element(%t), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %y = f32[64]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  ROOT %r = (s32[], f32[64]{0}) tuple(%next, %y)
}

%condition (t: (s32[], f32[64])) -> pred[] {
  %t = (s32[], f32[64]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%small (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  ROOT %y = f32[64]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
}

%large (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %y = f32[64]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %z = f32[64]{0} copy(%y)
  ROOT %w = f32[64]{0} fusion(%z, %y), kind=kLoop, calls=%fused_add
}

%called (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  %y = f32[64]{0} copy(%x)
  ROOT %z = f32[64]{0} fusion(%y, %x), kind=kLoop, calls=%fused_add
}

ENTRY %main (p: f32[64], b: pred[]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  %b = pred[] parameter(1)
  %zero = s32[] constant(0)
  %f = f32[64]{0} fusion(%p, %p), kind=kLoop, calls=%fused_add
  %start = ((f32[64]{0}), f32[64]{0}) all-reduce-start(%f), replica_groups={}, to_apply=%add
  %done = f32[64]{0} all-reduce-done(%start)
  %t = (s32[], f32[64]{0}) tuple(%zero, %done)
  %loop = (s32[], f32[64]{0}) while(%t), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %x = f32[64]{0} get-tuple-element(%loop), index=1
  %c = f32[64]{0} conditional(%b, %x, %x), true_computation=%small, false_computation=%large
  %k = f32[64]{0} call(%c), to_apply=%called
  ROOT %out = f32[64]{0} bitcast(%k)
}
"""


def test_kernels_count_what_control_flow_runs():
  """Entry: a fusion and the all-reduce (its `-start`; the `-done` waits); the loop: 4 x its body's fusion and
  its unfused add, 5 x its condition's compare; the conditional: its larger branch (3); the call: 2."""
  assert hlo_analysis.analyze(CONTROL_FLOW).kernels == 2 + 4 * 2 + 5 * 1 + 3 + 2


def test_kernel_bytes_are_each_kernels_operands_and_results_as_often_as_it_runs():
  """A fusion of two f32[64] into one: 3 x 256 bytes; the all-reduce's start: its operand and its two results;
  the loop body's s32 add 12 bytes, the condition's compare 9; the larger branch: two fusions and a copy."""
  fusion, copy = 3 * 256, 2 * 256
  expected = fusion + 3 * 256 + 4 * (fusion + 12) + 5 * 9 + (2 * fusion + copy) + (copy + fusion)
  assert hlo_analysis.analyze(CONTROL_FLOW).kernel_bytes == expected


# A flat buffer's leaf written back (the multi-tensor layout's last kernels, as XLA:GPU fuses them): the fusion
# takes the whole f32[100,8] step buffer and reads 4 of its rows, through an elementwise negate.
SLICED_OPERAND = """HloModule m

%fused_add (p0: f32[4,8], p1: f32[100,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[100,8]{1,0} parameter(1)
  %n = f32[100,8]{1,0} negate(%p1)
  %s = f32[4,8]{1,0} slice(%n), slice={[10:14], [0:8]}
  ROOT %a = f32[4,8]{1,0} add(%p0, %s)
}

%fused_sum (p0: f32[100,8]) -> f32[100,8] {
  %p0 = f32[100,8]{1,0} parameter(0)
  %s = f32[4,8]{1,0} slice(%p0), slice={[0:4], [0:8]}
  %b = f32[100,8]{1,0} broadcast(%s), dimensions={}
  ROOT %m = f32[100,8]{1,0} multiply(%p0, %b)
}

ENTRY %main (w: f32[4,8], buffer: f32[100,8]) -> (f32[4,8], f32[100,8]) {
  %w = f32[4,8]{1,0} parameter(0)
  %buffer = f32[100,8]{1,0} parameter(1)
  %leaf = f32[4,8]{1,0} fusion(%w, %buffer), kind=kLoop, calls=%fused_add
  %whole = f32[100,8]{1,0} fusion(%buffer), kind=kLoop, calls=%fused_sum
  ROOT %out = (f32[4,8]{1,0}, f32[100,8]{1,0}) tuple(%leaf, %whole)
}
"""


def test_a_fusion_that_slices_an_operand_reads_only_the_slice():
  """The leaf's fusion: w (128 bytes) and 4 of the buffer's 100 rows (128 bytes) read, 128 written; the second
  fusion also reads the whole buffer elsewhere, so all of it counts (3,200 in, 3,200 out)."""
  assert hlo_analysis.analyze(SLICED_OPERAND).kernel_bytes == (128 + 128 + 128) + (3200 + 3200)


# XLA:GPU's library calls as it prints them (shapes from a ResNet-50 step compiled for an H100, shortened).
LIBRARY_CALLS = """HloModule m

ENTRY %main (x: bf16[256,56,56,64], w: bf16[256,3,3,64], dy: bf16[256,28,28,256], a: f32[512,1024], b: f32[1024,64]) -> f32[512,64] {
  %x = bf16[256,56,56,64]{3,2,1,0} parameter(0)
  %w = bf16[256,3,3,64]{3,2,1,0} parameter(1)
  %dy = bf16[256,28,28,256]{3,2,1,0} parameter(2)
  %a = f32[512,1024]{1,0} parameter(3)
  %b = f32[1024,64]{1,0} parameter(4)
  %forward = (bf16[256,28,28,256]{3,2,1,0}, u8[0]{0}) custom-call(%x, %w), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convForward", backend_config={"cudnn_conv_backend_config":{"activation_mode":"kNone"}}
  %input = (bf16[256,56,56,64]{3,2,1,0}, u8[0]{0}) custom-call(%dy, %w), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardInput", backend_config={}
  %filter = (bf16[256,3,3,64]{3,2,1,0}, u8[0]{0}) custom-call(%x, %dy), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_o01i->b01f, custom_call_target="__cudnn$convBackwardFilter", backend_config={}
  %gemm = (f32[512,64]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  ROOT %out = f32[512,64]{1,0} get-tuple-element(%gemm), index=0
}
"""


def test_cudnn_and_cublas_calls_count_as_the_matmuls_they_compute():
  """A 3x3 stride-2 convolution from 64 to 256 features on 256 images of 56x56 -> 28x28: forward, input
  gradient and kernel gradient each 2 * (256 * 28 * 28 positions) * (3 * 3 * 64 * 256) FLOPs; a 512x1024 by
  1024x64 matmul 2 * 512 * 1024 * 64. Each call is one kernel."""
  figures = hlo_analysis.analyze(LIBRARY_CALLS)
  convolution = 2 * (256 * 28 * 28) * (3 * 3 * 64 * 256)
  assert figures.matmul_flops == 3 * convolution + 2 * 512 * 1024 * 64
  assert figures.kernels == 4
