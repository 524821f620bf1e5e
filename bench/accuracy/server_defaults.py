r"""The server-side baselines' defaults chosen by measurement.

On the digits command of docs/algorithms.md (10 clients all taking part, Dirichlet alpha 0.1, 12
rounds x 2 local epochs, client SGD lr 0.01 with momentum 0.9, no regulariser, the TF runtime),
over seeds 1, 2, 3, each cell trained by `tff_decorr.program.training.train` (what bin/train runs)
and evaluated once at the end:

  fedadagrad, fedadam, fedyogi (Reddi et al. 2021; fedopt.py)
    stage 1  bn {reference, average} x server_lr {1e-3, 1e-2, 1e-1, 1} at tau 1e-3     8 cells
             (the paper tunes the server rate over powers of ten, here 1e-3 ... 1; its BN-free
             models have no rule for the statistics: `reference` is the FedDecorr reference's,
             `average` FedAvg's)
    stage 2  tau {1e-5, 1e-4, 1e-2, 1e-1} at stage 1's best (bn, server_lr)            4 cells
             (the paper's grid of its adaptivity parameter, 1e-5 ... 1e-1; 1e-3, its and the
             reference's default, is stage 1's)
  fedexp (Jhunjhunwala et al. 2023; fedexp.py)
    stage 1  bn {reference, average} x step_counters {true, false} at eps 1e-3         4 cells
    stage 2  eps at stage 1's best: {1e-3} only, the paper's value for its image tasks
             and the reference's (`--axis=fedexp.eps=...` adds others)              0 cells
  fedlc tau {0.01, 0.1, 1}, fedrs alpha {0.1, 0.5, 0.9}, fedsam rho {0.01, 0.05, 0.1}
             one axis each: the reference's value (0.1, 0.5, 0.05) and values on both sides
             of it (the papers' own values are not checked here; FL-bench's FedLC uses tau 1,
             SAM's usual rho is the reference's 0.05)                          3 + 3 + 3 cells
  fedavg     the baseline the others are compared with                                 1 cell

50 cells in all, 150 runs with 3 seeds (FedSAM's 9 cost two passes a step). Stage 2 sweeps one
axis at stage 1's best cell (by mean final test accuracy): which cells it runs is known only
after stage 1, how many before. `--product` runs every axis against every other instead (fedopt:
2 x 4 x 5 = 40 cells each).

Each axis value is set explicitly, so the digits task's own overrides (tasks/digits.py:
server_lr 0.3 / 0.1 and bn 'average' for the adaptive optimisers) never leak into a cell. The
JSON marks each cell holding the reference's setting (`reference`) and the code's current default
(`default`), and keeps the mean over rounds of every `server/*` metric the run wrote (FedExP's
eta_g, the optimisers' update norm).

  .venv/bin/python -m bench.accuracy.server_defaults              # the full grid (estimate printed)
  .venv/bin/python -m bench.accuracy.server_defaults --dry_run   # the plan and its estimate only
  .venv/bin/python -m bench.accuracy.server_defaults --algorithms=fedexp --seeds=1
  .venv/bin/python -m bench.accuracy.server_defaults --smoke     # 1 seed, 2 rounds, 1 point an axis
  .venv/bin/python -m bench.accuracy.server_defaults --axis=fedlc.tau=0.1,1 --algorithms=fedlc

Prints the number of runs and an estimate of the time before starting: the full grid is 150 runs
of about 24 s each (FedSAM's about 48 s), some 65 minutes on this machine's 2 cores with other
work beside it (measured by --smoke: SECONDS_FIXED, SECONDS_PER_ROUND). Finished runs are reused
(bin/train resumes), so an interrupted invocation continues; the JSON is rewritten after every
cell. Writes bench/results/server_defaults.json (--smoke: server_defaults_smoke.json under
--output_dir, so a smoke run never replaces a measurement).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

from absl import app
from absl import flags

import tensorflow as tf  # pylint: disable=unused-import  (before absl.app.run)

from bench import _common

FLAGS = flags.FLAGS

# The digits command of docs/algorithms.md (bench.accuracy.convergence's setting at alpha 0.1); the
# task's defaults give the rest: small_cnn, batch 32, client lr 0.01, momentum 0.9, weight decay
# 1e-5.
SETTING: Dict[str, Any] = dict(task='digits', dirichlet_alpha=0.1, num_clients=10,
                               clients_per_round=10, local_epochs=2, regularizer='none',
                               runtime='tf')
ROUNDS = 12
SEEDS = ('1', '2', '3')


@dataclasses.dataclass(frozen=True)
class Axis:
  field: str  # The algorithm's HParams field (its flag is --<algorithm>_<field>).
  values: Tuple[Any, ...]
  reference: Any  # The FedDecorr reference's setting (its run script, else its argparse default).
  source: str  # Where the grid comes from.


@dataclasses.dataclass(frozen=True)
class Plan:
  """An algorithm's grid: stage 1 is the product of its axes (every other field at `fixed`);
  each stage-2 axis is then swept alone at stage 1's best cell."""
  stage1: Tuple[Axis, ...]
  stage2: Tuple[Axis, ...] = ()
  fixed: Tuple[Tuple[str, Any], ...] = ()


_LR = Axis('server_lr', (1e-3, 1e-2, 1e-1, 1.0), 1e-2,
           'Reddi et al. 2021 tune the server rate over powers of ten (here 1e-3 ... 1); the '
           'reference runs 0.01 (run_scripts/cifar10_fedadam.sh)')
_BN = Axis('bn', ('reference', 'average'), 'reference',
           'the paper\'s models have no BN statistics; reference = through the optimiser, as '
           'the reference; average = FedAvg\'s')
_TAU = Axis('tau', (1e-5, 1e-4, 1e-3, 1e-2, 1e-1), 1e-3,
            'Reddi et al. 2021\'s grid of the adaptivity parameter; 1e-3 is their default and '
            'the reference\'s')
_FEDOPT = Plan(stage1=(_BN, _LR), stage2=(_TAU,), fixed=(('tau', 1e-3),))

PLANS: Dict[str, Plan] = {
    'fedadagrad': _FEDOPT,
    'fedadam': _FEDOPT,
    'fedyogi': _FEDOPT,
    'fedexp': Plan(
        stage1=(Axis('bn', ('reference', 'average'), 'reference',
                     'reference = in the norms and extrapolated, as the reference; average = '
                     'out of the norms, FedAvg\'s'),
                Axis('step_counters', (True, False), True,
                     'the reference\'s norms hold BN\'s step counters (docs/reference.md §5); '
                     'false = the paper\'s norms')),
        stage2=(Axis('eps', (1e-3,), 1e-3,
                     'the paper\'s value for its image tasks, and the reference\'s'),),
        fixed=(('eps', 1e-3),)),
    'fedlc': Plan(stage1=(Axis('tau', (0.01, 0.1, 1.0), 0.1,
                               'the reference\'s --calibration_temp 0.1 and a decade either side '
                               '(FL-bench\'s FedLC uses 1.0; the paper\'s value is not checked '
                               'here)'),)),
    'fedrs': Plan(stage1=(Axis('alpha', (0.1, 0.5, 0.9), 0.5,
                               'the reference\'s --restricted_strength 0.5 and values toward '
                               'both ends (alpha = 1 is FedAvg; the paper\'s value is not '
                               'checked here)'),)),
    'fedsam': Plan(stage1=(Axis('rho', (0.01, 0.05, 0.1), 0.05,
                                'the reference\'s (and SAM\'s usual) 0.05 and values either '
                                'side (the papers\' values are not checked here)'),)),
    'fedavg': Plan(stage1=()),
}
# A FedSAM step is two forward and backward passes.
COST = {'fedsam': 2.0}
# Seconds of one run, for the estimate only: fixed (building, the first round's tracing,
# evaluation, export) + per steady round. Measured by --smoke on the 2-core VM with both cores
# busy with other training, at nice 19 (2026-11-27, load 7): first round 4-14 s (FedSAM 25 s),
# steady rounds 0.4-2 s (FedSAM 1.4 s), a whole 2-round run 6-18 s (FedSAM 35 s).
SECONDS_FIXED = 12.0
SECONDS_PER_ROUND = 1.0

flags.DEFINE_list('algorithms', list(PLANS), 'Algorithms to measure (fedavg: the baseline).')
flags.DEFINE_list('seeds', list(SEEDS), 'Seeds.')
flags.DEFINE_integer('rounds', ROUNDS, 'Rounds a run.')
flags.DEFINE_bool('smoke', False, 'Check that it works: 1 seed, 2 rounds, the reference\'s value '
                  'on every axis (one cell an algorithm); written beside the runs.')
flags.DEFINE_bool('dry_run', False, 'Print the cells, the number of runs and the estimate; train '
                  'nothing.')
flags.DEFINE_bool('product', False, 'Every axis against every other (no stage 2).')
flags.DEFINE_multi_string('axis', [], 'Replace an axis\'s values: algorithm.field=v1,v2 '
                          '(e.g. fedexp.eps=1e-3,1e-2).')
flags.DEFINE_string('output_dir', '/tmp/tff_decorr_server_defaults', 'Where the runs go.')
flags.DEFINE_string('output', '', 'Results JSON (default: bench/results/server_defaults.json; '
                    '--smoke: <output_dir>/server_defaults_smoke.json).')


def _parse(value: str, like: Any) -> Any:
  if isinstance(like, bool):
    if value.lower() not in ('true', 'false'):
      raise ValueError(f'{value!r} is not true or false')
    return value.lower() == 'true'
  return type(like)(value)


def apply_overrides(plans: Dict[str, Plan], overrides: Sequence[str]) -> Dict[str, Plan]:
  """`plans` with each `algorithm.field=v1,v2` replacing that axis's values."""
  plans = dict(plans)
  for item in overrides:
    try:
      key, values = item.split('=', 1)
      name, field = key.split('.', 1)
      plan = plans[name]
    except (ValueError, KeyError):
      raise app.UsageError(f'--axis={item}: expected algorithm.field=v1,v2 with an algorithm of '
                           f'{", ".join(plans)}.') from None
    axes = {a.field: a for a in plan.stage1 + plan.stage2}
    if field not in axes:
      raise app.UsageError(f'--axis={item}: {name} has no axis {field} (it has '
                           f'{", ".join(axes) or "none"}).')
    axis = axes[field]
    new = dataclasses.replace(axis, values=tuple(_parse(v, axis.reference)
                                                 for v in values.split(',')))
    plans[name] = dataclasses.replace(
        plan, stage1=tuple(new if a is axis else a for a in plan.stage1),
        stage2=tuple(new if a is axis else a for a in plan.stage2))
  return plans


def smoke_plan(plan: Plan) -> Plan:
  """One point an axis: the reference's value (so one cell an algorithm)."""
  one = lambda axes: tuple(dataclasses.replace(a, values=(a.reference,)) for a in axes)
  return dataclasses.replace(plan, stage1=one(plan.stage1), stage2=one(plan.stage2))


def product_plan(plan: Plan) -> Plan:
  return Plan(stage1=plan.stage1 + plan.stage2)


def stage1_cells(plan: Plan) -> List[Dict[str, Any]]:
  """The settings of stage 1's cells ({field: value}), fixed fields included."""
  fixed = dict(plan.fixed)
  return [{**fixed, **dict(zip([a.field for a in plan.stage1], values))}
          for values in itertools.product(*[a.values for a in plan.stage1])]


def stage2_cells(plan: Plan, best: Dict[str, Any]) -> List[Dict[str, Any]]:
  """Each stage-2 axis swept alone from stage 1's best cell (the cells stage 1 already ran are
  left out)."""
  cells = []
  for axis in plan.stage2:
    for value in axis.values:
      cell = {**best, axis.field: value}
      if cell != best and cell not in cells:
        cells.append(cell)
  return cells


def count_cells(plan: Plan) -> int:
  """Cells of both stages (stage 2's number does not depend on which cell stage 1 picks)."""
  fixed = dict(plan.fixed)
  n = len(stage1_cells(plan))
  for axis in plan.stage2:
    n += sum(1 for v in axis.values if not (axis.field in fixed and v == fixed[axis.field]))
  return n


def reference_settings(plan: Plan) -> Dict[str, Any]:
  return {a.field: a.reference for a in plan.stage1 + plan.stage2}


def default_settings(name: str, fields: Sequence[str]) -> Dict[str, Any]:
  """The code's current defaults of `fields` (the HParams', not a task's)."""
  from tff_decorr import algorithms  # pylint: disable=g-import-not-at-top
  hp = algorithms.hparams_class(name)()
  return {f: getattr(hp, f) for f in fields}


def cell_key(name: str, settings: Dict[str, Any]) -> str:
  return '-'.join([name] + [f'{k}={settings[k]}' for k in sorted(settings)])


def make_config(name: str, settings: Dict[str, Any], seed: int, rounds: int, output_dir: str):
  from tff_decorr.configs import config as config_lib  # pylint: disable=g-import-not-at-top
  return config_lib.make(
      **SETTING, algorithm=name, rounds=rounds, eval_every=rounds, seed=seed,
      **{f'{name}_{k}': v for k, v in settings.items()},
      output_dir=os.path.join(output_dir, f'r{rounds}', cell_key(name, settings), f's{seed}'),
      cache_dir=os.path.join(output_dir, 'cache'))


def run_cell(name: str, settings: Dict[str, Any], seeds: Sequence[int], rounds: int,
             output_dir: str) -> Dict[str, Any]:
  """Trains the cell once a seed (finished runs are read back); its results."""
  configs = [make_config(name, settings, seed, rounds, output_dir) for seed in seeds]
  return {'algorithm': name, 'settings': settings, 'seeds': list(seeds),
          **_common.run_seeds(configs, cell_key(name, settings))}


def measure(name: str, entry: Dict[str, Any], settings: Dict[str, Any], stage: int,
            seeds: Sequence[int], rounds: int, write) -> Dict[str, Any]:
  """Runs one cell into `entry` (the algorithm's part of the report), marked with its stage and
  whether it holds the reference's setting and the current default; then `write()`s the report."""
  result = run_cell(name, settings, seeds, rounds, FLAGS.output_dir)
  result['stage'] = stage
  result['reference'] = all(settings.get(k) == v for k, v in entry['reference'].items())
  result['default'] = all(settings.get(k) == v for k, v in entry['default'].items())
  entry['cells'].append(result)
  write()
  return result


def estimate_seconds(plans: Dict[str, Plan], seeds: int, rounds: int) -> float:
  return sum(count_cells(p) * seeds * COST.get(name, 1.0) * (SECONDS_FIXED
                                                            + SECONDS_PER_ROUND * rounds)
             for name, p in plans.items())


def best_cell(cells: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """The cell of the highest mean accuracy (the first of equal ones)."""
  return max(cells, key=lambda c: c['mean'])


def _fmt(acc: Dict[str, Any]) -> str:
  return f'{acc["mean"]:.3f} ± {acc["std"]:.3f}'


def main(argv):
  del argv
  unknown = [a for a in FLAGS.algorithms if a not in PLANS]
  if unknown:
    raise app.UsageError(f'--algorithms: unknown {unknown}; choose from {", ".join(PLANS)}.')
  plans = apply_overrides({a: PLANS[a] for a in FLAGS.algorithms}, FLAGS.axis)
  seeds, rounds = [int(s) for s in FLAGS.seeds], FLAGS.rounds
  if FLAGS.smoke:
    plans = {a: smoke_plan(p) for a, p in plans.items()}
    seeds, rounds = seeds[:1], 2
  if FLAGS.product:
    plans = {a: product_plan(p) for a, p in plans.items()}
  output = FLAGS.output or (os.path.join(FLAGS.output_dir, 'server_defaults_smoke.json')
                            if FLAGS.smoke else
                            os.path.join(_common.ROOT, 'bench', 'results',
                                         'server_defaults.json'))
  cells = {a: count_cells(p) for a, p in plans.items()}
  runs = sum(cells.values()) * len(seeds)
  estimate = estimate_seconds(plans, len(seeds), rounds)
  print('cells: ' + ', '.join(f'{a} {n}' for a, n in cells.items()))
  print(f'{sum(cells.values())} cells x {len(seeds)} seed(s) = {runs} runs of {rounds} rounds; '
        f'estimate {estimate / 60:.0f} min ({SECONDS_FIXED:.0f} s + {SECONDS_PER_ROUND:.1f} s a '
        f'round a run, FedSAM twice)', flush=True)
  if FLAGS.dry_run:
    for name, plan in plans.items():
      later = (f'; then {", ".join(a.field for a in plan.stage2)} at the best of them'
               if count_cells(plan) > len(stage1_cells(plan)) else '')
      print(f'  {name}: {len(stage1_cells(plan))} cells of '
            f'{" x ".join(f"{a.field} {list(a.values)}" for a in plan.stage1) or "its defaults"}'
            f'{later}')
    return
  t0 = time.time()
  report = {'command': ' '.join(['.venv/bin/python -m bench.accuracy.server_defaults']
                                + [shlex.quote(a) for a in sys.argv[1:]]),
            'setting': {**SETTING, 'rounds': rounds}, 'seeds': seeds,
            'design': 'product' if FLAGS.product else 'staged', 'smoke': FLAGS.smoke,
            'planned_runs': runs, 'estimate_s': estimate, 'machine': _common.machine(),
            'algorithms': {}}

  def write():
    report['wall_time_s'] = time.time() - t0
    report['machine']['load_avg_end'] = os.getloadavg()
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, 'w') as f:
      json.dump(report, f, indent=2)

  for name, plan in plans.items():
    axes = plan.stage1 + plan.stage2
    fields = [a.field for a in axes]
    entry = report['algorithms'][name] = {
        'axes': {a.field: {'values': list(a.values), 'reference': a.reference, 'source': a.source}
                 for a in axes},
        'reference': reference_settings(plan), 'default': default_settings(name, fields),
        'cells': []}
    print(f'{name}:', flush=True)
    stage1 = [measure(name, entry, s, 1, seeds, rounds, write) for s in stage1_cells(plan)]
    if plan.stage2:
      for s in stage2_cells(plan, best_cell(stage1)['settings']):
        measure(name, entry, s, 2, seeds, rounds, write)
    entry['best'] = best_cell(entry['cells'])['settings']
    write()

  print(f'\nFinal test accuracy, mean ± std over seeds {",".join(map(str, seeds))} ({rounds} '
        'rounds; R = the reference\'s setting, D = the current default, * = the best)')
  print('| algorithm | settings | accuracy | |')
  print('| --- | --- | --- | --- |')
  for name, entry in report['algorithms'].items():
    for c in entry['cells']:
      marks = ''.join(m for m, on in (('R', c['reference']), ('D', c['default']),
                                      ('*', c['settings'] == entry['best'])) if on)
      settings = ', '.join(f'{k}={v}' for k, v in sorted(c['settings'].items())) or '-'
      print(f'| {name} | {settings} | {_fmt(c)} | {marks} |')
  write()
  print(f'{runs} runs in {(time.time() - t0) / 60:.1f} min; wrote {output}')


if __name__ == '__main__':
  app.run(main)
