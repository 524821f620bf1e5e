"""Building a model to compute in bfloat16 (`--precision=mixed_bfloat16`), its weights in float32.

Keras' mixed-precision policy `mixed_bfloat16` keeps every variable in float32 and computes each
layer in bfloat16. On a CPU with native bfloat16 instructions (AVX512_BF16, AMX) a run then takes
less CPU time than in float32 (docs/benchmarks.md §2), the one lever left on a run whose float32
step is already at Keras' own cost (§1). The model's outputs are cast back to float32 by a last
layer, so the losses, the regularisers, evaluation and aggregation see what they see in float32,
and the weights the server averages and checkpoints stay float32. bfloat16 keeps float32's
exponent range, so no loss scaling is needed (Keras' LossScaleOptimizer is for float16).

Keras reads the policy when a layer is made; it has no public per-call scope in TF 2.14, so the
global policy is set for the build and restored after it, under a lock (threads building float32
models at the same time would otherwise see it).
"""

from __future__ import annotations

import threading
from typing import Callable

import tensorflow as tf

PRECISIONS = ('float32', 'mixed_bfloat16')
_POLICY_LOCK = threading.Lock()


def native_bfloat16_cpu() -> bool:
  """Whether this machine's CPU has bfloat16 instructions (else oneDNN emulates them, slowly)."""
  try:
    with open('/proc/cpuinfo') as f:
      flags = f.read()
  except OSError:
    return False
  return any(name in flags for name in ('avx512_bf16', 'amx_bf16'))


def build(builder: Callable[[], tf.keras.Model], precision: str) -> tf.keras.Model:
  """`builder()` computing in `precision`: float32 as it is; mixed_bfloat16 built under Keras'
  policy, with float32 outputs and the same weights (names, shapes, float32, order)."""
  if precision == 'float32':
    return builder()
  if precision not in PRECISIONS:
    raise ValueError(f'--precision: unknown precision {precision!r}; choose one of '
                     f'{", ".join(PRECISIONS)}.')
  with _POLICY_LOCK:
    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(precision)
    try:
      model = builder()
    finally:
      tf.keras.mixed_precision.set_global_policy(previous)
  # The same graph, plus a float32 cast of each output: a layer without weights, so the model's
  # weights and their order are the builder's.
  outputs = {name: tf.keras.layers.Activation('linear', dtype='float32', name=f'{name}_float32')(t)
             for name, t in model.output.items()}
  return tf.keras.Model(model.inputs, outputs, name=model.name)
