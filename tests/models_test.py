"""Model builders: outputs, representation sizes, parameter counts, decomposition, masks, export."""

import os
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from tff_decorr import models
from tff_decorr.models import common
from tff_decorr.models import decomposed

# name -> (representation dim, PyTorch-style parameter count for 10 classes and 3 channels, input
# sizes to test; size 8 is tested with 1 channel, the digits task).
# The counts were derived by hand from the layer lists in each module's docstring (e.g. ResNet20:
# stem 464 + stages 14,016 / 51,072 / 203,520 + classifier 650 = 269,722), and MobileNetV2's and
# ResNet18's equal the published counts of the reference networks (2,296,922; 11,173,962).
EXPECTED = {
    'small_cnn': (64, 24_234, (32, 8)),
    'mobilenet_v2_cifar': (1280, 2_296_922, (32, 64)),
    'resnet18': (512, 11_173_962, (32, 64)),
    'resnet20': (64, 269_722, (32, 64)),
    'resnet32': (64, 464_154, (32, 64)),
    'alexnet_bn': (4096, 57_063_498, (64, 96)),
}


def _batch(size, channels=3, n=2, seed=0):
  return tf.constant(np.random.RandomState(seed).randn(n, size, size, channels), tf.float32)


class BuildTest(parameterized.TestCase, tf.test.TestCase):

  def test_registry(self):
    self.assertCountEqual(models.names(), EXPECTED)
    with self.assertRaisesRegex(ValueError, r'--model.*small_cnn'):
      models.build('resnet50', num_classes=10, input_shape=(32, 32, 3))
    with self.assertRaisesRegex(ValueError, r'unsupported argument\(s\) weight_decay'):
      models.build('small_cnn', num_classes=10, input_shape=(32, 32, 3), weight_decay=1e-4)
    with self.assertRaisesRegex(ValueError, 'num_classes'):
      models.build('small_cnn', num_classes=0, input_shape=(32, 32, 3))
    with self.assertRaisesRegex(ValueError, 'input_shape'):
      models.build('small_cnn', num_classes=3, input_shape=(32, 32))
    with self.assertRaisesRegex(ValueError, '--num_atoms.*--decomposed'):
      models.build('small_cnn', num_classes=3, input_shape=(8, 8, 1), num_atoms=4)
    with self.assertRaisesRegex(ValueError, 'at least 63x63'):
      models.build('alexnet_bn', num_classes=3, input_shape=(32, 32, 3), hidden_dim=8)

  @parameterized.parameters(sorted(EXPECTED))
  def test_outputs_and_parameter_count(self, name):
    rep_dim, params, sizes = EXPECTED[name]
    for size in sizes:
      channels = 1 if size == 8 else 3
      model = models.build(name, num_classes=10, input_shape=(size, size, channels))
      # One input channel instead of three removes 2 * 3 * 3 * 32 weights of small_cnn's conv1.
      want = params if channels == 3 else params - 2 * 9 * 32
      self.assertEqual(models.count_parameters(model), want, f'{name} at {size}')
      self.assertEqual(models.representation_dim(model), rep_dim)
      out = model(_batch(size, channels), training=True)
      self.assertEqual(set(out), {'representation', 'logits'})
      self.assertEqual(out['representation'].shape, (2, rep_dim))
      self.assertEqual(out['logits'].shape, (2, 10))
      self.assertTrue(np.all(np.isfinite(out['logits'].numpy())))
      # Every BN layer has PyTorch's momentum / epsilon and there are no Keras regularizers.
      for layer in model.submodules:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
          self.assertEqual((layer.momentum, layer.epsilon), (0.9, 1e-5))
        for attr in ('kernel_regularizer', 'bias_regularizer', 'depthwise_regularizer'):
          self.assertIsNone(getattr(layer, attr, None), f'{layer.name}.{attr}')
      self.assertEmpty(model.losses)
      del model

  def test_bn_mask(self):
    model = models.build('small_cnn', num_classes=3, input_shape=(8, 8, 1))
    mask = models.bn_variable_mask(model)
    self.assertLen(mask, len(model.weights))
    bn_names = [v.name for v, m in zip(model.weights, mask) if m]
    self.assertCountEqual([n.split('/')[-1] for n in bn_names],
                          ['gamma:0', 'beta:0', 'moving_mean:0', 'moving_variance:0'])
    self.assertTrue(all(n.startswith('bn1/') for n in bn_names))
    resnet = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3))
    # 19 BN layers (stem + 2 per block x 9 blocks; option-A shortcuts have none) x 4 variables.
    self.assertEqual(sum(models.bn_variable_mask(resnet)), 19 * 4)

  def test_projection_head(self):
    model = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3), projection_dim=256)
    out = model(_batch(32))
    self.assertEqual(out['representation'].shape, (2, 256))
    # 64 -> 64 (ReLU) -> 256 -> 10 head on top of the plain network.
    self.assertEqual(models.count_parameters(model),
                     269_722 - 650 + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 10 + 10))
    # The classifier reads the projection.
    self.assertEqual(model.get_layer('classifier').input.shape[-1], 256)

  def test_small_alexnet_options(self):
    model = models.build('alexnet_bn', num_classes=5, input_shape=(64, 64, 3), hidden_dim=32)
    self.assertEqual(model(_batch(64))['representation'].shape, (2, 32))
    self.assertEqual(sum(models.bn_variable_mask(model)), 7 * 4)


class AdaptivePoolingTest(tf.test.TestCase):

  def test_matches_torch_semantics(self):
    x = np.random.RandomState(0).randn(1, 5, 7, 2).astype(np.float32)
    y = common.AdaptiveAveragePooling2D((3, 2))(tf.constant(x)).numpy()
    # PyTorch bins: rows [0,2) [1,4) [3,5); cols [0,4) [3,7).
    rows, cols = [(0, 2), (1, 4), (3, 5)], [(0, 4), (3, 7)]
    for i, (r0, r1) in enumerate(rows):
      for j, (c0, c1) in enumerate(cols):
        self.assertAllClose(y[0, i, j], x[0, r0:r1, c0:c1].mean(axis=(0, 1)))
    up = common.AdaptiveAveragePooling2D((6, 6))(tf.constant(x[:, :1, :1])).numpy()
    self.assertAllClose(up, np.broadcast_to(x[:, :1, :1], (1, 6, 6, 2)))


class DecomposedTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters((3, 1, 'same', True, None), (3, 2, 'valid', False, 4),
                            (5, 2, 'same', True, 30), (1, 1, 'valid', True, None))
  def test_equals_plain_conv_with_composed_kernel(self, k, stride, padding, use_bias, m):
    x = _batch(9, channels=3, n=2, seed=1)
    layer = decomposed.DecomposedConv2D(4, k, strides=stride, padding=padding, use_bias=use_bias,
                                        num_atoms=m)
    layer.build(x.shape)
    rng = np.random.RandomState(2)
    alpha = rng.randn(*layer.coefficients.shape).astype(np.float32)
    atoms = rng.randn(*layer.atoms.shape).astype(np.float32)
    layer.coefficients.assign(alpha)
    layer.atoms.assign(atoms)
    if use_bias:
      layer.bias.assign(rng.randn(4).astype(np.float32))
    kernel = np.einsum('iom,mhw->hwio', alpha, atoms)  # W = alpha x D, computed independently
    plain = tf.keras.layers.Conv2D(4, k, strides=stride, padding=padding, use_bias=use_bias)
    plain.build(x.shape)
    plain.set_weights([kernel] + ([layer.bias.numpy()] if use_bias else []))
    self.assertAllClose(layer(x), plain(x), atol=1e-4, rtol=1e-4)

  def test_set_from_kernel(self):
    x = _batch(6, channels=2, seed=3)
    plain = tf.keras.layers.Conv2D(3, 3, padding='same')
    ref = plain(x)
    layer = decomposed.DecomposedConv2D(3, 3, padding='same')
    layer.build(x.shape)
    layer.set_from_kernel(plain.kernel.numpy())
    layer.bias.assign(plain.bias)
    self.assertAllClose(layer(x), ref, atol=1e-5)

  def test_initial_kernel_scale(self):
    # The composed kernel's variance at initialisation matches Keras' Glorot-uniform conv kernel.
    tf.keras.utils.set_random_seed(0)
    for m in (9, 4, 16):
      layer = decomposed.DecomposedConv2D(64, 3, num_atoms=m)
      layer.build((None, 8, 8, 64))
      glorot_var = 2.0 / (64 * 9 + 64 * 9)
      self.assertAllClose(np.var(layer.kernel().numpy()), glorot_var, rtol=0.1)

  def test_decomposed_models(self):
    for name, size, channels, n_decomposed in [('small_cnn', 8, 1, 2), ('resnet20', 32, 3, 19),
                                               ('mobilenet_v2_cifar', 32, 3, 1)]:
      plain = models.build(name, num_classes=10, input_shape=(size, size, channels))
      model = models.build(name, num_classes=10, input_shape=(size, size, channels),
                           decomposed=True, num_atoms=5 if name == 'small_cnn' else None)
      layers = [l for l in model.submodules if isinstance(l, decomposed.DecomposedConv2D)]
      self.assertLen(layers, n_decomposed, name)
      atoms, coefs = models.atom_variable_mask(model), models.coefficient_variable_mask(model)
      self.assertEqual(sum(atoms), n_decomposed)
      self.assertEqual(sum(coefs), n_decomposed)
      for v, a, c in zip(model.weights, atoms, coefs):
        self.assertEqual(a, 'atoms' in v.name, v.name)
        self.assertEqual(c, 'coefficients' in v.name, v.name)
      self.assertEqual(models.bn_variable_mask(model).count(True),
                       models.bn_variable_mask(plain).count(True))
      out = model(_batch(size, channels))
      self.assertEqual(out['logits'].shape, (2, 10))
      # Parameters: every decomposed k x k conv trades c_in c_out k^2 for c_in c_out m + m k^2.
      diff = sum(int(np.prod(l.coefficients.shape)) + int(np.prod(l.atoms.shape))
                 - l.kernel_size ** 2 * int(l.coefficients.shape[0]) * l.filters for l in layers)
      self.assertEqual(models.count_parameters(model), models.count_parameters(plain) + diff)

  def test_decomposed_model_equals_plain_twin(self):
    # A decomposed small_cnn whose layers are set from a plain twin's kernels computes the same.
    plain = models.build('small_cnn', num_classes=4, input_shape=(8, 8, 1))
    model = models.build('small_cnn', num_classes=4, input_shape=(8, 8, 1), decomposed=True)
    for layer in model.layers:
      twin = plain.get_layer(layer.name)
      if isinstance(layer, decomposed.DecomposedConv2D):
        layer.set_from_kernel(twin.kernel.numpy())
        if layer.use_bias:
          layer.bias.assign(twin.bias)
      else:
        layer.set_weights(twin.get_weights())
    x = _batch(8, channels=1, n=3, seed=4)
    for training in (False, True):
      a, b = model(x, training=training), plain(x, training=training)
      self.assertAllClose(a['logits'], b['logits'], atol=1e-4)
      self.assertAllClose(a['representation'], b['representation'], atol=1e-4)


class SavedModelTest(tf.test.TestCase):

  def _roundtrip(self, model, x):
    want = model(x, training=False)
    path = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), 'model')
    tf.saved_model.save(model, path)
    loaded = tf.saved_model.load(path)
    got = loaded(x, training=False)
    self.assertEqual(set(got), {'representation', 'logits'})
    for k in got:
      self.assertAllClose(got[k], want[k], atol=1e-5)
    self.assertTrue(np.any(np.abs(want['logits'].numpy()) > 0))

  def test_small_cnn_decomposed(self):
    model = models.build('small_cnn', num_classes=10, input_shape=(8, 8, 1), decomposed=True)
    self._roundtrip(model, _batch(8, channels=1, n=3))

  def test_resnet20(self):
    model = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3), projection_dim=16)
    self._roundtrip(model, _batch(32))


if __name__ == '__main__':
  absltest.main()
