r"""FedAvgM's BatchNorm-statistics rule chosen by measurement.

FedAvgM (the reference's form, server momentum 0.9) with each rule of `--fedavgm_bn` (ema: the
statistics move by an EMA toward the clients' average; reference: the same momentum as the weights,
variances clamped at 0; average: FedAvg's weighted average), over seeds, at the fidelity setting
(bench/settings.py: ResNet20, the shared 10,000 train images, Dirichlet alpha 0.05, 10 clients all
participating, 10 rounds x 1 local epoch, lr 0.01, momentum 0.9, weight decay 1e-5, batch 64) or on
the embedded default (`--setting=digits`: docs/algorithms.md's command, 12 rounds, alpha 0.1). Each
run is `tff_decorr.program.training.train` (what bin/train runs), evaluated once at the end; a run
whose weights or loss become non-finite is reported as such, and the smallest moving variance of
the final global model is printed (negative would be a broken model).

  .venv/bin/python -m bench.accuracy.fedavgm_bn --setting=fidelity --seeds=1,2,3  # 3.5 min a run

Finished runs are reused (bin/train resumes), so an interrupted invocation continues. Writes
bench/results/fedavgm_bn_<setting>.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time

from absl import app
from absl import flags

# Before absl app.run (as bench/accuracy/feddecorr_cifar10.py); also reads checkpoints.
import tensorflow as tf

from bench import _common
from bench import settings as bench_settings
from tff_decorr.configs import config as config_lib
from tff_decorr.program import round_loop
from tff_decorr.program import training

FLAGS = flags.FLAGS
RULES = ('ema', 'reference', 'average')
SETTINGS = {
    'fidelity': dict(bench_settings.FIDELITY, data_dir=_common.DEFAULT_DATA_DIR, eval_every=10),
    'digits': dict(task='digits', dirichlet_alpha=0.1, rounds=12, eval_every=12),
}

flags.DEFINE_enum('setting', 'fidelity', list(SETTINGS), 'Where to measure.')
flags.DEFINE_list('seeds', ['1', '2', '3'], 'Seeds.')
flags.DEFINE_list('rules', list(RULES), 'Rules of --fedavgm_bn.')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_fedavgm_bn', 'Where the runs go.')


def _min_moving_variance(output_dir: str) -> float:
  """The smallest moving variance of the exported final model (its BN layers' variables)."""
  reader = tf.train.load_checkpoint(os.path.join(output_dir, 'export', 'saved_model', 'variables',
                                                'variables'))
  values = [reader.get_tensor(name).min() for name in reader.get_variable_to_shape_map()
            if 'moving_variance' in name]
  return float(min(values)) if values else float('nan')


def main(argv):
  del argv
  unknown = [r for r in FLAGS.rules if r not in RULES]
  if unknown:
    raise app.UsageError(f'--rules: unknown {unknown}; choose from {", ".join(RULES)}.')
  t0 = time.time()
  results = {}
  for rule in FLAGS.rules:
    accs, notes = [], []
    for seed in FLAGS.seeds:
      out = os.path.join(FLAGS.output_dir, FLAGS.setting, f'{rule}-s{seed}')
      config = config_lib.make(**SETTINGS[FLAGS.setting], algorithm='fedavgm', regularizer='none',
                               fedavgm_form='reference', fedavgm_server_momentum=0.9,
                               fedavgm_bn=rule, seed=int(seed), output_dir=out,
                               cache_dir=os.path.join(FLAGS.output_dir, 'cache'))
      try:
        training.train(config, log=lambda s: None)  # Resumes (or reads) a finished run.
        with open(os.path.join(out, 'summary.json')) as f:
          acc = json.load(f)['final_test_accuracy']
        min_var = _min_moving_variance(out)
        note = f'smallest moving variance {min_var:.3g}'
      except round_loop.NonFiniteError as e:
        acc, note = 0.0, f'non-finite: {e}'
      accs.append(acc)
      notes.append(note)
      print(f'{FLAGS.setting} fedavgm bn={rule} seed={seed}: {acc:.4f} ({note}; '
            f'{time.time() - t0:.0f}s elapsed)', flush=True)
    results[rule] = {'seeds': [int(s) for s in FLAGS.seeds], 'accuracy': accs, 'notes': notes,
                     'mean': statistics.mean(accs),
                     'std': statistics.stdev(accs) if len(accs) > 1 else 0.0}
  print(f'\nFedAvgM (reference form, b 0.9), final test accuracy over seeds {",".join(FLAGS.seeds)}'
        f' ({FLAGS.setting})')
  print('| --fedavgm_bn | per seed | mean ± std |')
  print('| --- | --- | --- |')
  for rule, r in results.items():
    print(f'| {rule} | {", ".join(f"{a:.3f}" for a in r["accuracy"])} | '
          f'{r["mean"]:.3f} ± {r["std"]:.3f} |')
  path = os.path.join(_common.ROOT, 'bench', 'results', f'fedavgm_bn_{FLAGS.setting}.json')
  with open(path, 'w') as f:
    json.dump({'setting': SETTINGS[FLAGS.setting], 'results': results,
               'machine': _common.machine(), 'wall_time_s': time.time() - t0}, f, indent=2)
  print(f'wrote {path}')


if __name__ == '__main__':
  app.run(main)
