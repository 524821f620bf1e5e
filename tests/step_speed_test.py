"""Correctness properties of the client step's speed changes; nothing here is timed.

- The local-training loop runs in the client function's own graph, not inside tf.data: no
  ReduceDataset/ScanDataset in the graph the TF runtime runs nor in the one TFF's worker receives.
- Compiled as a graph, the loop computes what eager execution of the same code computes.
- TFF's worker_binary is started with TF_ENABLE_ONEDNN_OPTS (on unless the user set it).
"""

import functools
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.tensorflow_libs import serialization_utils

from tests import testutil
from tff_decorr import algorithms
from tff_decorr import models
from tff_decorr import tf_env
from tff_decorr.worker import tff_context
from tff_decorr.algorithms import client_update
from tff_decorr.algorithms import workspace
from tff_decorr.algorithms import testing
from tff_decorr.runtimes import tf_runtime
from tff_decorr.runtimes import tff_runtime

_CFG = algorithms.SGDHParams(lr=0.02, momentum=0.9, weight_decay=1e-3)
_DATASET_SCANS = {'ReduceDataset', 'ScanDataset'}


def _op_types(graph_def) -> set:
  ops = {n.op for n in graph_def.node}
  for f in graph_def.library.function:
    ops |= {n.op for n in f.node_def}
  return ops


def _tff_graph_defs(message):
  """Every TensorFlow graph inside a TFF computation proto (recursively)."""
  for field, value in message.ListFields():
    if field.message_type is None:
      continue
    for item in (value if field.label == field.LABEL_REPEATED else [value]):
      if field.name == 'tensorflow' and item.DESCRIPTOR.name == 'TensorFlow':
        yield serialization_utils.unpack_graph_def(item.graph_def)
      yield from _tff_graph_defs(item)


def _algorithm(regularizer=None):
  return algorithms.build('fedavg', functools.partial(testing.tiny_model, representation_dim=8),
                          _CFG, regularizer=regularizer)


class StepSpeedTest(tf.test.TestCase):

  def test_tf_runtime_loop_is_not_a_dataset_reduce(self):
    alg = _algorithm(testing.feddecorr(0.1))
    rt = tf_runtime.TfRuntime(alg, testing.make_client_dataset_fn(testing.synthetic_clients()))
    # pylint: disable=protected-access
    broadcast = rt._broadcast(tf.nest.map_structure(tf.constant, rt.initialize()))
    concrete = rt._steps[0].get_concrete_function(
        broadcast, tf.constant('0'), tf.constant(0, tf.int64), tf.constant(0))
    # pylint: enable=protected-access
    ops = _op_types(concrete.graph.as_graph_def())
    self.assertEmpty(ops & _DATASET_SCANS)
    self.assertIn('IteratorGetNextAsOptional', ops)

  def test_graph_sent_to_the_tff_worker_has_no_dataset_reduce(self):
    alg = _algorithm(testing.feddecorr(0.1))
    process = tff_runtime.build_process(
        alg, testing.make_client_dataset_fn(testing.synthetic_clients()))
    proto = tff.framework.ConcreteComputation.get_proto(process.next)
    ops = set().union(*[_op_types(g) for g in _tff_graph_defs(proto)])
    self.assertIn('IteratorGetNextAsOptional', ops)  # the client computation is in there
    self.assertEmpty(ops & _DATASET_SCANS)

  def test_compiled_loop_matches_eager_execution(self):
    data = testing.synthetic_clients()
    dataset = testing.make_client_dataset_fn(data, shuffle=True, epochs=2)(
        tf.constant('2'), tf.constant(5, tf.int64))
    for regularizer in (None, testing.feddecorr(0.1)):
      model_fn = functools.partial(testing.tiny_model, representation_dim=8)
      start = [v.numpy() for v in model_fn().weights]
      results = []
      for compiled in (False, True):
        ws = workspace.Workspace(model_fn)
        train = functools.partial(client_update.local_train, ws, start, dataset, _CFG, regularizer)
        results.append(tf.function(train)() if compiled else train())
      eager, graph = results
      self.assertEqual(int(eager.num_steps), int(graph.num_steps))
      self.assertEqual(int(graph.num_steps), 2 * 4)  # 14 examples, batch 4, 2 epochs
      for name in client_update.METRIC_NAMES:
        self.assertAllClose(eager.metrics[name], graph.metrics[name], rtol=1e-5, atol=1e-6)
      for a, b in zip(eager.weights, graph.weights):
        self.assertAllClose(a, b, rtol=1e-5, atol=1e-6)

  def test_large_model_client_step_can_be_called_again(self):
    # AlexNet-BN (4096-d BatchNorm): grappler's gradient accumulators once outlived a call of a
    # loop that ran the step inline, and the second call failed with AlreadyExistsError.
    model_fn = lambda: models.build('alexnet_bn', num_classes=10, input_shape=(64, 64, 3))
    ws = workspace.Workspace(model_fn)
    start = [v.numpy() for v in ws.weights]
    rng = np.random.RandomState(0)
    dataset = tf.data.Dataset.from_tensor_slices(
        (rng.randn(8, 64, 64, 3).astype(np.float32), rng.randint(0, 10, 8))).batch(4)
    train = tf.function(lambda: client_update.local_train(
        ws, start, dataset, _CFG, testing.feddecorr(0.1)).metrics['loss_sum'])
    self.assertAllClose(train(), train())

  def test_worker_environment_turns_onednn_on_unless_the_user_chose(self):
    self.assertEqual(tf_env.worker_environment({})['TF_ENABLE_ONEDNN_OPTS'], '1')
    self.assertEqual(tf_env.worker_environment({'TF_ENABLE_ONEDNN_OPTS': '0'})
                     ['TF_ENABLE_ONEDNN_OPTS'], '0')

  def test_tensorflow_imported_after_tf_env_has_onednn(self):
    env = {k: v for k, v in os.environ.items() if k != 'TF_ENABLE_ONEDNN_OPTS'}
    program = ('from tff_decorr import tf_env\n'
               'from tensorflow.python.util import _pywrap_util_port as port\n'
               'print("ONEDNN", port.IsMklEnabled())\n')
    out = subprocess.run([sys.executable, '-c', program], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         check=True).stdout
    self.assertIn('ONEDNN True', out)

  def test_worker_binary_gets_the_variable(self):
    worker = tff_context.WorkerProcess()
    try:
      with open(f'/proc/{worker.binary_pid}/environ', 'rb') as f:
        environ = f.read().split(b'\0')
    finally:
      worker.stop()
    expected = tf_env.worker_environment()['TF_ENABLE_ONEDNN_OPTS']  # '1' unless the user chose
    self.assertIn(f'TF_ENABLE_ONEDNN_OPTS={expected}'.encode(), environ)


class BenchFlagsTest(absltest.TestCase):
  """The step benchmarks' own flags refuse bad values by name, before any work."""

  def test_bad_values_are_refused_by_flag(self):
    for module, flag, name in (
        ('bench.speed.step_speed', '--precision=float16', '--precision'),
        ('bench.speed.autotune_stalls', '--blocks=0', '--blocks'),
        ('bench.speed.autotune_stalls', '--evaluations=-1', '--evaluations')):
      proc = testutil.run_module(module, flag)
      self.assertNotEqual(proc.returncode, 0, (module, flag))
      self.assertIn(f'Flags parsing error: flag {name}=', proc.stderr,
                    (module, flag, proc.stderr[-1000:]))
      self.assertNotIn('Traceback', proc.stderr, (module, flag))
      self.assertNotIn('wrote', proc.stdout, (module, flag))


if __name__ == '__main__':
  absltest.main()
