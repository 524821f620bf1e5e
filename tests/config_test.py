"""Configuration resolution: component flags, config.json files of earlier releases (resumed, or
refused with what to do) and default run-directory names that stay what they were before component
settings existed."""

import contextlib
import io
import json
import os
import sys
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import tensorflow as tf

from tests import testutil
from tff_decorr.bin import train
from tff_decorr.configs import cli
from tff_decorr.configs import config
from tff_decorr.run_files import run_dir

# Default run-directory names printed by bin/train at commit 7dc4b1f (before component settings,
# the same settings in their flat spellings of then) for these commands: a command finds the run
# it wrote in every release since.
GOLDEN = [
    ({}, ['digits-fedavg-none-c912a466', 'digits-fedavg-feddecorr-39976aa0']),
    (dict(task='cifar10', algorithm='moon', regularizer='feddecorr'),
     ['cifar10-moon-feddecorr-a8536435']),
    (dict(task='digits', algorithm='fedavgm', dirichlet_alpha=0.1, fedavgm_form='tff',
          fedavgm_server_lr=0.5, regularizer='none'), ['digits-fedavgm-none-8bb3ed3b']),
    (dict(task='cifar100', algorithm='fedprox', fedprox_mu=0.01, regularizer='feduv',
          feduv_mu=0.3), ['cifar100-fedprox-feduv-a1775d8c']),
    (dict(task='digits', algorithm='scaffold', partition='pathological',
          pathological_classes_per_client=3, regularizer='decov', decov_beta=0.2),
     ['digits-scaffold-decov-b770eed5']),
    (dict(task='digits', algorithm='fedavg_decomposed', decomposed=True,
          fedavg_decomposed_coefficient_period=0, regularizer='feddecorr'),
     ['digits-fedavg_decomposed-feddecorr-8d1eda28']),
    # Printed by 0.2.0 (commit 4490e2c, `config.directory_hash`) and its last commit (9e6eacd):
    # components and settings that came after the flat form keep their names too.
    (dict(task='digits', algorithm='fedprox', fedprox_mu=0.01, regularizer='feddecorr',
          num_clients=4, rounds=2), ['digits-fedprox-feddecorr-a47894a5']),
    (dict(task='digits', algorithm='fedexp', regularizer='none'),
     ['digits-fedexp-none-573c0af4']),
    (dict(task='digits', regularizer='feddecorr', aggregator='dp', dp_clip=1.0),
     ['digits-fedavg-feddecorr-69e6b442']),
    (dict(task='cifar10', algorithm='fedprox', regularizer='feddecorr', fedprox_mu=0.01,
          feddecorr_beta=0.2), ['cifar10-fedprox-feddecorr-106e084f']),
    (dict(task='digits', algorithm='moon', regularizer='none', precision='mixed_bfloat16'),
     ['digits-moon-none-b83cc7c2']),
    # Printed by 0.3.0 (commit 828281f), when the client optimiser's settings were generic ones.
    (dict(task='digits', client_lr=0.05, momentum=0.5, weight_decay=0.0, regularizer='none'),
     ['digits-fedavg-none-ed5891cc']),
    (dict(task='cifar100', algorithm='fedprox', client_lr=0.1, regularizer='feddecorr'),
     ['cifar100-fedprox-feddecorr-14751551']),
]

# config.json as 0.2.0 wrote it (commit 4490e2c, `config.make(task='digits', algorithm='fedprox',
# fedprox_mu=0.01, regularizer='feddecorr', num_clients=4, rounds=2).to_dict()`).
CONFIG_0_2_0 = {
    'aggregator': 'mean', 'algorithm': 'fedprox', 'batch_size': 32, 'cache_dir': '',
    'client_lr': 0.01, 'clients_per_round': 4, 'data_dir': '', 'decomposed': False,
    'eval_every': 1, 'export_every': 0,
    'hparams': {'dirichlet': {'alpha': 0.5}, 'feddecorr': {'beta': 0.1}, 'fedprox': {'mu': 0.01},
                'mean': {}},
    'init': 'keras', 'local_epochs': 5, 'max_concurrent_computation_calls': -1,
    'model': 'small_cnn', 'momentum': 0.9, 'num_atoms': 0, 'num_clients': 4, 'output_dir': '',
    'partition': 'dirichlet', 'projection_dim': 0, 'regularizer': 'feddecorr', 'rounds': 2,
    'runtime': 'tff', 'seed': 0, 'task': 'digits', 'track_collapse': False,
    'weight_decay': 1e-05, 'workers': ''}

# config.json as 0.3.0 wrote it (commit 828281f, `config.make(task='digits', algorithm='fedprox',
# regularizer='feddecorr', client_lr=0.05, momentum=0.5, weight_decay=0.0, num_clients=4,
# rounds=2).to_dict()`): the client optimiser's settings at top level.
CONFIG_0_3_0 = {
    **CONFIG_0_2_0, 'client_lr': 0.05, 'momentum': 0.5, 'weight_decay': 0.0,
    'precision': 'float32', 'runtime': 'tf',
    'hparams': {**CONFIG_0_2_0['hparams'], 'fedprox': {'mu': 0.001}}}

# A config.json written at commit 7dc4b1f (flat: every setting at top level), which 0.2.0 migrated
# and 0.3.0 refuses.
OLD_CONFIG = {
    'algorithm': 'fedavg', 'alpha': 0.5, 'batch_size': 32, 'beta': 0.1, 'cache_dir': '/c',
    'classes_per_client': 2, 'client_lr': 0.01, 'clients_per_round': 4, 'coefficient_period': 1,
    'data_dir': '', 'decomposed': False, 'eval_every': 1, 'export_every': 0,
    'fedavgm_form': 'reference', 'feduv_lambda': 2.5, 'feduv_mu': 0.5, 'local_epochs': 1,
    'max_concurrent_computation_calls': -1, 'model': 'small_cnn', 'momentum': 0.9, 'mu': 0.001,
    'num_atoms': 0, 'num_clients': 4, 'output_dir': '/o', 'partition': 'dirichlet',
    'projection_dim': 0, 'regularizer': 'feddecorr', 'rounds': 2, 'runtime': 'tf', 'seed': 0,
    'server_lr': 1.0, 'server_momentum': 0.9, 'task': 'digits', 'temperature': 0.5,
    'track_collapse': False, 'weight_decay': 1e-05, 'workers': ''}


def resolve(**flag_values):
  with flagsaver.flagsaver(**flag_values):
    return train.resolve_configs(train.FLAGS)


class ConfigTest(absltest.TestCase):

  def test_default_run_directories_keep_their_names(self):
    for flag_values, names in GOLDEN:
      got = [c.output_dir.split('/runs/')[1] for c in resolve(**flag_values)]
      self.assertEqual(got, names, flag_values)

  def test_a_0_2_0_run_directory_resumes_under_the_command_that_wrote_it(self):
    (new,) = resolve(task='digits', algorithm='fedprox', fedprox_mu=0.01, regularizer='feddecorr',
                     num_clients=4, rounds=2, local_epochs=5)
    self.assertEqual(os.path.basename(new.output_dir), 'digits-fedprox-feddecorr-a47894a5')
    self.assertEqual(config.from_dict(CONFIG_0_2_0).hparams, new.hparams)
    out = self.create_tempdir().full_path
    run_dir.write_config(out, CONFIG_0_2_0)
    new.output_dir = out
    # The same configuration: the caller resumes it from its checkpoint.
    self.assertTrue(run_dir.prepare(out, new.to_dict(), migrate=config.migrate_dict))
    run_dir.unlock(out)

  def test_a_0_3_0_run_directory_resumes_with_its_client_optimizer(self):
    old = config.from_dict(CONFIG_0_3_0)
    self.assertEqual(old.client_optimizer.to_dict(),
                     {'lr': 0.05, 'momentum': 0.5, 'weight_decay': 0.0})
    self.assertIs(old.client_optimizer, old.hparams['sgd'])
    self.assertNotIn('client_lr', old.to_dict())
    command = dict(task='digits', algorithm='fedprox', regularizer='feddecorr', num_clients=4,
                   rounds=2, local_epochs=5, runtime='tf', momentum=0.5, weight_decay=0.0)
    (new,) = resolve(client_lr=0.05, **command)
    (other,) = resolve(client_lr=0.02, **command)
    self.assertEqual(old.hparams, new.hparams)
    self.assertEqual(run_dir.differences(config.migrate_dict(CONFIG_0_3_0), new.to_dict()), [])
    self.assertEqual(run_dir.differences(config.migrate_dict(CONFIG_0_3_0), other.to_dict()),
                     ['hparams.sgd.lr'])
    out = self.create_tempdir().full_path
    run_dir.write_config(out, CONFIG_0_3_0)
    self.assertTrue(run_dir.prepare(out, new.to_dict(), migrate=config.migrate_dict))
    run_dir.unlock(out)
    # The refusal names the flag the user typed, not the component's place in config.json.
    with self.assertRaisesRegex(run_dir.RunDirError, r'\(--client_lr: 0\.05 -> 0\.02\)'):
      run_dir.prepare(out, other.to_dict(), migrate=config.migrate_dict)
    run_dir.unlock(out)

  def test_a_task_default_sets_the_client_optimizer_by_its_flag_name(self):
    from tff_decorr.tasks import registry as task_registry  # pylint: disable=g-import-not-at-top
    task = task_registry.get('cifar100')
    self.assertEqual(task.defaults['weight_decay'], 1e-4)
    (c,) = resolve(task='cifar100', regularizer='none')
    self.assertEqual(c.client_optimizer.weight_decay, 1e-4)  # The task's, not the field's 1e-5.
    (given,) = resolve(task='cifar100', regularizer='none', weight_decay=0.0)
    self.assertEqual(given.client_optimizer.weight_decay, 0.0)  # The flag's, over the task's.
    self.assertEqual(config.make(task='cifar100', weight_decay=0.0).client_optimizer,
                     given.client_optimizer)

  def test_a_flat_config_json_is_refused_with_what_to_do(self):
    with self.assertRaisesRegex(config.OldConfigError, 'before tff_decorr 0.2.0'):
      config.from_dict(OLD_CONFIG)
    (new,) = resolve(task='digits', num_clients=4, rounds=2, local_epochs=1, runtime='tf',
                     regularizer='feddecorr')
    out = self.create_tempdir().full_path
    run_dir.write_config(out, OLD_CONFIG)
    with self.assertRaises(run_dir.RunDirError) as caught:
      run_dir.prepare(out, new.to_dict(), migrate=config.migrate_dict)
    run_dir.unlock(out)
    message = str(caught.exception)
    self.assertNotIn('\n', message)
    self.assertRegex(message, f'^--output_dir={out}: its config.json was written before tff_decorr '
                     r'0.2.0 .*re-run with --overwrite to start again \(the old run is moved '
                     r'aside\), or finish it with tff_decorr 0.2.0.$')
    with open(os.path.join(out, 'config.json')) as f:  # Refused: nothing touched.
      self.assertEqual(json.load(f), OLD_CONFIG)
    # --overwrite moves it aside and starts afresh.
    logged = []
    self.assertFalse(run_dir.prepare(out, new.to_dict(), overwrite=True, log=logged.append,
                                     migrate=config.migrate_dict))
    run_dir.unlock(out)
    self.assertFalse(os.path.exists(os.path.join(out, 'config.json')))
    (aside,) = [p for p in os.listdir(os.path.dirname(out))
                if p.startswith(os.path.basename(out) + '.replaced-')]
    with open(os.path.join(os.path.dirname(out), aside, 'config.json')) as f:
      self.assertEqual(json.load(f), OLD_CONFIG)
    self.assertIn('moved it to', logged[0])

  def test_bin_train_refuses_a_flat_run_directory_in_one_line(self):
    out = self.create_tempdir().full_path
    run_dir.write_config(out, OLD_CONFIG)
    proc = testutil.run_module('bin.train', '--task=digits', '--num_clients=4', '--rounds=2',
                               '--local_epochs=1', '--regularizer=feddecorr',
                               f'--output_dir={out}')
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    self.assertNotIn('Traceback', proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if 'error' in line]
    self.assertLen(errors, 1, proc.stderr[-2000:])
    self.assertIn('re-run with --overwrite to start again', errors[0])

  def test_old_flag_spellings_are_unknown_flags(self):
    # Removed in 0.3.0 (CHANGELOG.md names each one's component flag).
    for old in ('mu', 'beta', 'alpha', 'temperature', 'server_lr', 'server_momentum',
                'coefficient_period', 'classes_per_client'):
      with self.subTest(old=old), flagsaver.flagsaver():
        with self.assertRaisesRegex(flags.UnrecognizedFlagError, f"flag '{old}'"):
          train.FLAGS(['train', f'--{old}=1', '--regularizer=none'])

  def test_config_json_from_before_the_aggregator_resumes(self):
    # Written by the release with component settings but no --aggregator: it meant the plain sum.
    (new,) = resolve(task='digits', num_clients=4, rounds=2, local_epochs=1, runtime='tf',
                     regularizer='feddecorr', output_dir='/o', cache_dir='/c')
    written = new.to_dict()
    del written['aggregator']
    del written['hparams']['mean']
    self.assertEqual(run_dir.differences(config.migrate_dict(written), new.to_dict()), [])
    (dp,) = resolve(task='digits', regularizer='feddecorr', aggregator='dp', dp_clip=1.0)
    self.assertNotEqual(run_dir.differences(config.migrate_dict(written), dp.to_dict()), [])

  def test_fedavgm_config_json_from_before_its_bn_rule_resumes(self):
    # Written before --fedavgm_bn existed: its statistics followed the rule of then (ema).
    (ema,) = resolve(task='digits', algorithm='fedavgm', regularizer='none', fedavgm_bn='ema')
    written = ema.to_dict()
    self.assertEqual(written['hparams']['fedavgm'].pop('bn'), 'ema')
    self.assertEqual(run_dir.differences(config.migrate_dict(written), ema.to_dict()), [])
    # Today's default (average) keeps the old command's directory name (GOLDEN), so the old
    # command finds its old run, whose config.json then refuses the new default (the fedavgm
    # settings differ); --fedavgm_bn=ema resumes it. The reference's rule is another directory.
    (new,) = resolve(task='digits', algorithm='fedavgm', regularizer='none')
    (ref,) = resolve(task='digits', algorithm='fedavgm', regularizer='none', fedavgm_bn='reference')
    self.assertEqual(new.hparams['fedavgm'].bn, 'average')
    self.assertEqual(new.output_dir, ema.output_dir)
    self.assertNotEqual(ref.output_dir, ema.output_dir)
    for other in (new, ref):
      differences = run_dir.differences(config.migrate_dict(written), other.to_dict())
      self.assertEqual(differences, ['hparams.fedavgm.bn'])

  def test_fedexp_config_json_from_before_its_evaluated_model_resumes_only_as_written(self):
    # Written before --fedexp_evaluate existed: the last iterate was evaluated. The old command
    # finds its run (same directory) and is refused under today's default, whose server state
    # also holds x_{t-1}; --fedexp_evaluate=last resumes it.
    (last,) = resolve(task='digits', algorithm='fedexp', regularizer='none', fedexp_evaluate='last')
    written = last.to_dict()
    self.assertEqual(written['hparams']['fedexp'].pop('evaluate'), 'last')
    self.assertEqual(run_dir.differences(config.migrate_dict(written), last.to_dict()), [])
    (new,) = resolve(task='digits', algorithm='fedexp', regularizer='none')
    self.assertEqual(new.hparams['fedexp'].evaluate, 'average_last_two')
    self.assertEqual(new.output_dir, last.output_dir)
    self.assertEqual(run_dir.differences(config.migrate_dict(written), new.to_dict()),
                     ['hparams.fedexp.evaluate'])

  def test_fedexp_evaluate_refuses_an_unknown_model(self):
    with self.assertRaisesRegex(ValueError, "--fedexp_evaluate: choose one of average_last_two, "
                                "last, got 'middle'"):
      resolve(task='digits', algorithm='fedexp', regularizer='none', fedexp_evaluate='middle')

  def test_initialisation_defaults_to_the_models_reference_and_old_runs_are_not_mixed_in(self):
    (r20,) = resolve(task='cifar10', model='resnet20', regularizer='none')
    (mob,) = resolve(task='cifar10', regularizer='none')
    (dig,) = resolve(task='digits', regularizer='none')
    self.assertEqual((r20.init, mob.init, dig.init), ('kaiming_normal', 'torch', 'keras'))
    # A config.json from before `init` existed was built with Keras' initialisation: resuming it
    # with today's default is a different configuration (refused unless --overwrite or --init).
    written = mob.to_dict()
    del written['init']
    self.assertEqual(run_dir.differences(config.migrate_dict(written), mob.to_dict()),
                     ['init'])
    (mob_keras,) = resolve(task='cifar10', regularizer='none', init='keras')
    self.assertEqual(run_dir.differences(config.migrate_dict(written), mob_keras.to_dict()), [])
    # The default keeps the default directory name; another initialisation gets its own.
    self.assertNotEqual(mob_keras.output_dir, mob.output_dir)
    self.assertEqual(resolve(task='cifar10', regularizer='none', init='torch')[0].output_dir,
                     mob.output_dir)
    self.assertIn('secure (simulated: no cryptography', train.FLAGS['aggregator'].help)
    self.assertEqual([c.regularizer for c in resolve(task='digits', regularizer='none,none')],
                     ['none'])
    with self.assertRaisesRegex(ValueError, '^--init: unknown initialisation'):
      config.make(task='digits', init='glorot')

  def test_precision_is_float32_for_runs_written_before_it_and_bfloat16_gets_its_own_name(self):
    (plain,) = resolve(task='digits', regularizer='none')
    (mixed,) = resolve(task='digits', regularizer='none', precision='mixed_bfloat16')
    self.assertEqual((plain.precision, mixed.precision), ('float32', 'mixed_bfloat16'))
    written = plain.to_dict()
    del written['precision']  # A config.json from before --precision existed.
    self.assertEqual(run_dir.differences(config.migrate_dict(written), plain.to_dict()), [])
    self.assertEqual(run_dir.differences(config.migrate_dict(written), mixed.to_dict()),
                     ['precision'])
    self.assertNotEqual(mixed.output_dir, plain.output_dir)  # float32 keeps GOLDEN's names
    with self.assertRaisesRegex(ValueError, '^--precision: unknown precision .float16.'):
      config.make(task='digits', precision='float16')

  def test_runtime_auto_is_tf_unless_only_tff_runs_it(self):
    self.assertEqual(train.FLAGS['runtime'].default, 'auto')
    self.assertIn('auto: tf, or tff with --workers or an --aggregator factory',
                  train.FLAGS['runtime'].help)
    gpu = tf.config.PhysicalDevice(name='/physical_device:GPU:0', device_type='GPU')
    devices = lambda device_type=None: [gpu] if device_type in ('GPU', None) else []
    with mock.patch.object(tf.config, 'list_physical_devices', side_effect=devices):
      (on_gpu,) = resolve(regularizer='none')
      header = train.run_header(on_gpu, 'auto')
      # Only TFF's runtime runs remote workers and tff.aggregators factories: auto picks it.
      (workers,) = resolve(regularizer='none', workers='localhost:9')
      (dp,) = resolve(regularizer='none', aggregator='dp')
      (explicit,) = resolve(regularizer='none', runtime='tff')
    with mock.patch.object(tf.config, 'list_physical_devices', return_value=[]):
      (on_cpu,) = resolve(regularizer='none')
      cpu_header = train.run_header(on_cpu, 'auto')
    self.assertEqual((on_gpu.runtime, on_cpu.runtime), ('tf', 'tf'))
    self.assertEqual((workers.runtime, dp.runtime, explicit.runtime), ('tff', 'tff', 'tff'))
    # config.json records the runtime that ran, not 'auto'.
    self.assertEqual(on_gpu.to_dict()['runtime'], 'tf')
    self.assertIn('(runtime tf, auto: TensorFlow sees 1 GPU(s), /physical_device:GPU:0)', header)
    cores = len(os.sched_getaffinity(0))
    self.assertIn(f'(runtime tf, auto: no GPU; the plain mean runs fastest in this process, {cores} '
                  f'client(s) at a time on {cores} CPU core(s)', cpu_header)
    self.assertIn('(runtime tf, --runtime=tf)', train.run_header(on_gpu, 'tf'))
    # Same run on either machine: one directory name, and each resumes the other's run.
    self.assertEqual(on_gpu.output_dir, on_cpu.output_dir)
    self.assertTrue(on_gpu.output_dir.endswith('/runs/digits-fedavg-none-c912a466'))
    self.assertEqual(run_dir.differences(on_cpu.to_dict(), on_gpu.to_dict()), [])
    with self.assertRaisesRegex(ValueError, '^--workers: .*not --runtime=tf'):
      resolve(regularizer='none', runtime='tf', workers='localhost:9')

  def test_aggregator_settings_are_component_flags(self):
    (c,) = resolve(task='digits', regularizer='none', aggregator='dp', dp_noise_multiplier=0.3,
                   dp_clip=2.0)
    self.assertEqual(c.hparams['dp'].to_dict(), {'noise_multiplier': 0.3, 'clip': 2.0, 'target_delta': 0.0,
                                                 'zeroing': True})
    (r,) = resolve(task='digits', regularizer='none', aggregator='robust', robust_clipping=False)
    self.assertEqual(r.hparams['robust'].to_dict(), {'zeroing': True, 'clipping': False, 'weighted': True})
    # A different aggregator is a different run: its own default directory.
    (m,) = resolve(task='digits', regularizer='none')
    self.assertNotEqual(c.output_dir, m.output_dir)
    self.assertNotEqual(r.output_dir, m.output_dir)

  def test_aggregator_errors_name_the_flag(self):
    cases = [
        (dict(aggregator='dp', runtime='tf'), '--aggregator: dp .* only under --runtime=tff'),
        (dict(aggregator='secure', algorithm='fednova'), "--aggregator=secure cannot be combined "
         "with --algorithm=fednova: its upload carries the normaliser"),
        (dict(aggregator='robust', algorithm='fednova'), "--aggregator=robust cannot be combined "
         "with --algorithm=fednova"),
        (dict(aggregator='dp', algorithm='scaffold'), "--aggregator=dp cannot be combined "
         "with --algorithm=scaffold: its control-variate deltas"),
        (dict(aggregator='robust', algorithm='fedavg_decomposed', decomposed=True),
         '--aggregator=robust: --algorithm=fedavg_decomposed has no upload'),
        (dict(aggregator='robust', dp_clip=1.0), '--dp_clip: set.* --aggregator=robust'),
        (dict(aggregator='compression', compression_bits=20), '--compression_bits: must be <= 16'),
        (dict(aggregator='dp', dp_target_delta=1.0), '--dp_target_delta: must be < 1.0'),
        (dict(aggregator='dp', dp_noise_multiplier=-0.5), '--dp_noise_multiplier: must be >= 0'),
        (dict(aggregator='dp', dp_clip=-1.0), '--dp_clip: must be >= 0'),
        (dict(aggregator='compression', compression_threshold=-1),
         '--compression_threshold: must be >= 0'),
    ]
    for values, pattern in cases:
      with self.assertRaisesRegex(ValueError, pattern, msg=str(values)):
        resolve(task='digits', regularizer='none', **values)

  def test_each_value_is_checked_where_it_is_declared(self):
    with self.assertRaisesRegex(ValueError, '--fedprox_mu: must be >= 0.0'):
      resolve(algorithm='fedprox', fedprox_mu=-1.0)
    with self.assertRaisesRegex(ValueError, '--fedexp_step_counters: must be true or false'):
      resolve(algorithm='fedexp', fedexp_step_counters='yes')
    with self.assertRaisesRegex(ValueError, '--dirichlet_alpha: must be > 0.0'):
      resolve(dirichlet_alpha=0.0)
    with self.assertRaisesRegex(ValueError, '--fedavgm_server_lr applies only'):
      resolve(algorithm='fedavgm', fedavgm_server_lr=0.5)
    # alpha = inf is the IID limit of the Dirichlet partition, also as typed on a command line.
    (c,) = resolve(regularizer='none', dirichlet_alpha=float('inf'))
    self.assertEqual(c.hparams['dirichlet'].alpha, float('inf'))
    with flagsaver.flagsaver():
      train.FLAGS(['train', '--dirichlet_alpha=inf', '--regularizer=none'])
      (c,) = train.resolve_configs(train.FLAGS)
    self.assertEqual(c.hparams['dirichlet'].alpha, float('inf'))

  def test_configuration_is_resolved_into_typed_objects(self):
    from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
    from tff_decorr import partitions  # pylint: disable=g-import-not-at-top
    (c,) = resolve(algorithm='fedprox', fedprox_mu=0.25, regularizer='none', client_lr=0.05,
                   momentum=0.5, weight_decay=0.0)
    self.assertIsInstance(c.hparams['fedprox'], algorithms.hparams_class('fedprox'))
    self.assertEqual(c.hparams['fedprox'].mu, 0.25)
    self.assertIsInstance(c.component_hparams('partition'), partitions.hparams_class('dirichlet'))
    self.assertEqual(c.client_optimizer,
                     algorithms.SGDHParams(lr=0.05, momentum=0.5, weight_decay=0.0))
    # config.json's plain form round-trips to equal typed objects; a hand-edited bad value is
    # refused when the Config is made, naming the flag.
    self.assertEqual(config.from_dict(c.to_dict()), c)
    bad = c.to_dict()
    bad['hparams']['fedprox']['mu'] = -1.0
    with self.assertRaisesRegex(ValueError, '^--fedprox_mu: must be >= 0.0, got -1.0.$'):
      config.from_dict(bad)
    for flag, value, message in (('client_lr', 0.0, 'must be > 0.0'),
                                 ('momentum', 1.0, 'must be < 1.0'),
                                 ('weight_decay', -1e-4, 'must be >= 0.0'),
                                 ('client_lr', float('inf'), 'must be a finite number')):
      with self.assertRaisesRegex(ValueError, f'^--{flag}: {message}'):
        resolve(regularizer='none', **{flag: value})

  def test_make_builds_without_flags(self):
    c = config.make(task='digits', algorithm='fedprox', fedprox_mu=0.1, regularizer='none')
    self.assertEqual(c.hparams['fedprox'].to_dict(), {'mu': 0.1})
    self.assertEqual(c.rounds, 15)  # The task's default.
    with self.assertRaisesRegex(ValueError, 'unknown setting.*beta'):
      config.make(beta=0.1)


  def test_flags_reach_their_configs_in_one_pass(self):
    # docs/DESIGN.md: read the flags (cli), resolve the components, build and validate the
    # Configs, name their directories (config); each step called once from resolve_configs, and
    # none calls back into an earlier step's module. Every Python call made while resolving is
    # recorded, with its module and its caller.
    steps_module = ('tff_decorr.configs.cli', 'tff_decorr.configs.config')
    driver = cli.resolve_configs.__code__
    calls = []

    def record(frame, event, unused_arg):
      if event == 'call' and frame.f_code is not driver:
        calls.append((frame.f_globals.get('__name__'), frame.f_code.co_name,
                      frame.f_back.f_code is driver if frame.f_back else False))

    stderr = io.StringIO()
    with flagsaver.flagsaver(algorithm='fedprox', fedprox_mu=0.3, regularizer='none,feddecorr',
                             feddecorr_beta=0.2), contextlib.redirect_stderr(stderr):
      sys.setprofile(record)
      try:
        configs = train.resolve_configs(train.FLAGS)
      finally:
        sys.setprofile(None)
    visits = [module for module, _, _ in calls if module in steps_module]
    visits = [m for i, m in enumerate(visits) if i == 0 or visits[i - 1] != m]
    self.assertEqual(visits, list(steps_module))
    self.assertEqual([name for module, name, from_driver in calls
                      if from_driver and module in steps_module],
                     ['read_flags', 'resolve_components', 'build', 'set_output_dirs'])
    # The value reached both Configs, and resolving printed nothing.
    self.assertEqual([c.hparams['fedprox'].mu for c in configs], [0.3, 0.3])
    self.assertEqual(stderr.getvalue(), '')


if __name__ == '__main__':
  absltest.main()
