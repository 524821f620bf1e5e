"""Model builders: outputs, representation sizes, parameter counts, decomposition, masks, export."""

import functools
import os
import tempfile

import numpy as np
import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

from tff_decorr import models
from tff_decorr.models import common
from tff_decorr.models import decomposed
from tff_decorr.models import precision

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


# name -> (tiny input shape, build kwargs, number of k x k convs with k > 1 counted from the module
# docstrings, extra parameters of the decomposed model). With the default m = k^2 the coefficients
# have as many entries as the kernel they replace, so each decomposed layer adds its m k^2 = k^4
# atoms: small_cnn 2 x 81; MobileNetV2 (stem + 1+2+3+4+3+3+1 = 17 depthwise) 18 x 81; ResNet20
# (stem + 2 x 9 blocks) 19 x 81; ResNet18 (stem + 2 x 8 blocks) 17 x 81;
# AlexNet 11^4 + 5^4 + 3 x 3^4.
DECOMPOSED_CASES = {
    'small_cnn': ((8, 8, 1), {}, 2, 2 * 81),
    'mobilenet_v2_cifar': ((8, 8, 3), {}, 18, 18 * 81),
    'resnet20': ((8, 8, 3), {}, 19, 19 * 81),
    'resnet18': ((8, 8, 3), {}, 17, 17 * 81),
    'alexnet_bn': ((63, 63, 3), {'hidden_dim': 8}, 5, 14_641 + 625 + 3 * 81),
}


def _batch(size, channels=3, n=2, seed=0):
  return tf.constant(np.random.RandomState(seed).randn(n, size, size, channels), tf.float32)


@functools.lru_cache(maxsize=None)
def _twins(name):
  """(plain, decomposed) builds of DECOMPOSED_CASES[name], built once and shared by the tests."""
  shape, kwargs = DECOMPOSED_CASES[name][:2]
  return tuple(models.build(name, num_classes=10, input_shape=shape, decomposed=d, **kwargs)
               for d in (False, True))


def _conv_layers(model):
  """Every convolution-like layer (anything with a kernel size), by name."""
  return {l.name: l for l in model.layers if hasattr(l, 'kernel_size')}


def _kernel_size(layer):
  k = layer.kernel_size
  return k if isinstance(k, int) else max(k)


def _plain_kernel(layer):
  return layer.depthwise_kernel if isinstance(layer, tf.keras.layers.DepthwiseConv2D) \
      else layer.kernel


def _randomize(layer, rng):
  """Gives a decomposed layer random coefficients, atoms (and bias), not the orthonormal initial
  atoms, so that no layout error can cancel out. Returns the weights of the equivalent plain Keras
  layer: [kernel = alpha x D computed in NumPy] (+ [bias])."""
  # Kernel entries of variance 1 / (channels summed over), so that outputs stay O(k) and float32
  # rounding stays far below the tolerance of the comparisons even for 512-channel convs.
  summed = 1 if isinstance(layer, decomposed.DecomposedDepthwiseConv2D) else \
      int(layer.coefficients.shape[0])
  alpha = (rng.randn(*layer.coefficients.shape) / np.sqrt(summed * layer.num_atoms)).astype(
      np.float32)
  atoms = rng.randn(*layer.atoms.shape).astype(np.float32)
  layer.coefficients.assign(alpha)
  layer.atoms.assign(atoms)
  weights = [np.einsum('abm,mhw->hwab', alpha, atoms)]  # [k, k, a, b], Keras' kernel layout
  if layer.use_bias:
    weights.append(rng.randn(*layer.bias.shape).astype(np.float32))
    layer.bias.assign(weights[-1])
  return weights


# Which decomposed class replaces which Keras class.
_DECOMPOSED_TYPE = {tf.keras.layers.Conv2D: decomposed.DecomposedConv2D,
                    tf.keras.layers.DepthwiseConv2D: decomposed.DecomposedDepthwiseConv2D}


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
    # 64 -> 32 (ReLU) -> 256 -> 10 head on top of the plain network: the hidden layer is half the
    # pooled width, as the FedDecorr reference's MOON wrapper (Linear(d, d // 2)).
    self.assertEqual(models.count_parameters(model),
                     269_722 - 650 + (64 * 32 + 32) + (32 * 256 + 256) + (256 * 10 + 10))
    # The classifier reads the projection.
    self.assertEqual(model.get_layer('classifier').input.shape[-1], 256)

  def test_small_alexnet_options(self):
    model = models.build('alexnet_bn', num_classes=5, input_shape=(64, 64, 3), hidden_dim=32)
    self.assertEqual(model(_batch(64))['representation'].shape, (2, 32))
    self.assertEqual(sum(models.bn_variable_mask(model)), 7 * 4)


class PrecisionTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('resnet20', 'small_cnn')
  def test_mixed_bfloat16_keeps_the_weights_and_computes_in_bfloat16(self, name):
    build = lambda: models.build(name, num_classes=10, input_shape=(32, 32, 3))
    tf.keras.utils.set_random_seed(3)
    plain = build()
    tf.keras.utils.set_random_seed(3)
    mixed = precision.build(build, 'mixed_bfloat16')
    self.assertEqual(tf.keras.mixed_precision.global_policy().name, 'float32')  # restored
    # The same weights (names, shapes, float32, values, order) and the same BN mask: the server
    # averages and checkpoints exactly what it does in float32.
    self.assertEqual([v.name for v in mixed.weights], [v.name for v in plain.weights])
    for a, b in zip(mixed.weights, plain.weights):
      self.assertEqual(a.dtype, tf.float32)
      self.assertAllEqual(a.numpy(), b.numpy())
    self.assertEqual(models.bn_variable_mask(mixed), models.bn_variable_mask(plain))
    self.assertEqual({l.compute_dtype for l in mixed.layers if l.weights}, {'bfloat16'})
    x = np.random.RandomState(0).uniform(size=(8, 32, 32, 3)).astype(np.float32)
    want, got = plain(x, training=False), mixed(x, training=False)
    for key in ('logits', 'representation'):
      self.assertEqual(got[key].dtype, tf.float32)
      # bfloat16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4 %): close to the float32
      # model, and not equal to it (the layers did compute in bfloat16).
      scale = np.abs(want[key].numpy()).max()
      err = np.abs(got[key].numpy() - want[key].numpy()).max() / scale
      self.assertBetween(err, 1e-4, 5e-2, key)
    with self.assertRaisesRegex(ValueError, '--precision: unknown precision .float16.'):
      precision.build(build, 'float16')


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
    weights = _randomize(layer, np.random.RandomState(2))
    plain = tf.keras.layers.Conv2D(4, k, strides=stride, padding=padding, use_bias=use_bias)
    plain.build(x.shape)
    plain.set_weights(weights)
    self.assertAllClose(layer(x), plain(x), atol=1e-4, rtol=1e-4)

  @parameterized.parameters((3, 1, 'same', True, None, 1), (3, 2, 'valid', False, 4, 2),
                            (5, 2, 'same', True, 30, 3))
  def test_depthwise_equals_plain_depthwise_with_composed_kernel(self, k, stride, padding,
                                                                 use_bias, m, mult):
    x = _batch(9, channels=3, n=2, seed=5)
    layer = decomposed.DecomposedDepthwiseConv2D(k, strides=stride, padding=padding,
                                                 depth_multiplier=mult, use_bias=use_bias,
                                                 num_atoms=m)
    layer.build(x.shape)
    self.assertEqual(layer.coefficients.shape, (3, mult, m or k * k))
    self.assertEqual(layer.atoms.shape, (m or k * k, k, k))
    weights = _randomize(layer, np.random.RandomState(6))
    self.assertEqual(weights[0].shape, (k, k, 3, mult))  # [k, k, channels, multiplier]
    plain = tf.keras.layers.DepthwiseConv2D(k, strides=stride, padding=padding,
                                            depth_multiplier=mult, use_bias=use_bias)
    plain.build(x.shape)
    plain.set_weights(weights)
    self.assertAllClose(layer(x), plain(x), atol=1e-4, rtol=1e-4)
    # The config rebuilds the same layer (Keras-layer style).
    clone = decomposed.DecomposedDepthwiseConv2D.from_config(layer.get_config())
    self.assertEqual(clone.get_config(), layer.get_config())

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
      # Depthwise: Keras' Glorot fans of a [3, 3, 256, 1] kernel are 256 * 9 and 1 * 9.
      layer = decomposed.DecomposedDepthwiseConv2D(3, num_atoms=m)
      layer.build((None, 8, 8, 256))
      self.assertAllClose(np.var(layer.kernel().numpy()), 2.0 / (256 * 9 + 9), rtol=0.1)

  @parameterized.parameters(sorted(DECOMPOSED_CASES))
  def test_every_spatial_conv_is_decomposed(self, name):
    _, _, n_spatial, extra_params = DECOMPOSED_CASES[name]
    plain, model = _twins(name)
    plain_convs = _conv_layers(plain)
    spatial = {n: l for n, l in plain_convs.items() if _kernel_size(l) > 1}
    # The plain model is the architecture we think it is (counted by hand, not from the code).
    self.assertLen(spatial, n_spatial)
    self.assertTrue(all(type(l) in _DECOMPOSED_TYPE for l in plain_convs.values()))
    layers = {l.name: l for l in model.layers if isinstance(l, decomposed.DecomposedConvBase)}
    self.assertCountEqual(layers, spatial)
    for n, layer in layers.items():
      twin = spatial[n]
      self.assertIsInstance(layer, _DECOMPOSED_TYPE[type(twin)], n)
      self.assertEqual((layer.kernel_size,) * 2, twin.kernel_size, n)
      self.assertEqual((layer.strides,) * 2, twin.strides, n)
      self.assertEqual((layer.padding, layer.use_bias), (twin.padding, twin.use_bias), n)
      self.assertEqual(layer.kernel().shape, _plain_kernel(twin).shape, n)
    # Whatever is not decomposed is a plain 1x1 conv of the plain model.
    for n, layer in _conv_layers(model).items():
      if n not in layers:
        self.assertIs(type(layer), type(plain_convs[n]), n)
        self.assertEqual(_kernel_size(layer), 1, n)
    atoms, coefs = models.atom_variable_mask(model), models.coefficient_variable_mask(model)
    self.assertEqual((sum(atoms), sum(coefs)), (n_spatial, n_spatial))
    for v, a, c in zip(model.weights, atoms, coefs):
      self.assertEqual(a, 'atoms' in v.name, v.name)
      self.assertEqual(c, 'coefficients' in v.name, v.name)
    self.assertEqual(sum(models.bn_variable_mask(model)), sum(models.bn_variable_mask(plain)))
    self.assertEqual(models.count_parameters(model) - models.count_parameters(plain), extra_params)

  @parameterized.parameters(sorted(DECOMPOSED_CASES))
  def test_decomposed_layers_equal_plain_layers_with_composed_kernel(self, name):
    # Each decomposed layer of the model against a plain Keras layer with the plain model's config
    # (strides, padding, bias) and kernel = coefficients x atoms computed in NumPy.
    plain, model = _twins(name)
    rng = np.random.RandomState(7)
    for layer in model.layers:
      if not isinstance(layer, decomposed.DecomposedConvBase):
        continue
      weights = _randomize(layer, rng)
      plain_layer = plain.get_layer(layer.name)
      twin = type(plain_layer).from_config(plain_layer.get_config())
      size = layer.kernel_size + 4  # A stride-2 conv still has a 3x3 output.
      x = tf.constant(rng.randn(2, size, size, int(layer.coefficients.shape[0])), tf.float32)
      twin.build(x.shape)
      twin.set_weights(weights)
      want = twin(x)
      self.assertGreater(float(tf.reduce_max(tf.abs(want))), 0.0)
      self.assertAllClose(layer(x), want, atol=1e-4, rtol=1e-4, msg=f'{name}/{layer.name}')

  def test_num_atoms(self):
    # m = 5 atoms: each 3x3 conv trades c_in c_out 9 kernel entries for c_in c_out 5 + 5 x 9.
    plain = models.build('small_cnn', num_classes=10, input_shape=(8, 8, 1))
    model = models.build('small_cnn', num_classes=10, input_shape=(8, 8, 1), decomposed=True,
                         num_atoms=5)
    layers = [l for l in model.layers if isinstance(l, decomposed.DecomposedConvBase)]
    self.assertEqual([l.atoms.shape for l in layers], [(5, 3, 3)] * 2)
    diff = sum(5 * n // 9 + 5 * 9 - n for n in (1 * 32 * 9, 32 * 64 * 9))
    self.assertEqual(models.count_parameters(model), models.count_parameters(plain) + diff)
    self.assertEqual(model(_batch(8, 1))['logits'].shape, (2, 10))

  @parameterized.parameters(sorted(DECOMPOSED_CASES))
  def test_decomposed_model_equals_plain_twin(self, name):
    # A decomposed model whose layers are set from its plain twin's kernels computes the same.
    plain, model = _twins(name)
    rng = np.random.RandomState(8)
    for layer in model.layers:
      twin = plain.get_layer(layer.name)
      if isinstance(layer, decomposed.DecomposedConvBase):
        layer.set_from_kernel(_plain_kernel(twin).numpy())
        if layer.use_bias:
          # Non-zero (the initial biases are 0), so that a dropped bias would show.
          twin.bias.assign(rng.randn(*twin.bias.shape).astype(np.float32))
          layer.bias.assign(twin.bias)
      else:
        layer.set_weights(twin.get_weights())
    shape = DECOMPOSED_CASES[name][0]
    x = _batch(shape[0], channels=shape[2], n=3, seed=4)
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

  def test_decomposed_depthwise(self):
    # MobileNetV2's decomposed depthwise conv (strided, padded explicitly) in a tiny model: saving
    # the whole decomposed MobileNetV2 takes about 30 s here, and its layers are the same classes.
    convs = common.Convs(decomposed=True)
    inputs = tf.keras.Input((8, 8, 3))
    x = convs.depthwise(inputs, 3, strides=2, padding=1, use_bias=True, name='depthwise')
    x = convs.conv(x, 4, 3, padding=1, name='conv')
    rep, logits = common.head(tf.keras.layers.GlobalAveragePooling2D()(x), 10, None)
    model = common.make_model(inputs, rep, logits, 'tiny')
    self.assertIsInstance(model.get_layer('depthwise'), decomposed.DecomposedDepthwiseConv2D)
    self._roundtrip(model, _batch(8, n=3))

  def test_resnet20(self):
    model = models.build('resnet20', num_classes=10, input_shape=(32, 32, 3), projection_dim=16)
    self._roundtrip(model, _batch(32))


if __name__ == '__main__':
  absltest.main()
