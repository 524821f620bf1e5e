r"""Runs the PyTorch reference's own main.py at the fidelity setting on this machine, timed.

The reference (github.com/bytedance/FedDecorr, commit 973e4af, unmodified) trains with
`python main.py --approach=... <arguments>`. This script runs that main.py in-process, its own
code from its own checkout, on the shared CIFAR-10 (10,000 train images in official order, the
10,000 test images), and writes what it measured as JSON. It has two halves:

1. With this project's venv (TensorFlow; the project's task loader reads the TFDS files):

     .venv/bin/python -m bench.reference.reference_main --export=/tmp/ref_cifar10.npz \
         [--data_dir=...]

   writes the train and test images (uint8 NHWC, official order) and labels into one .npz.

2. With PyTorch (not a dependency of this project):

     python3.11 -m venv /tmp/torchenv
     /tmp/torchenv/bin/pip install torch==2.1.2 numpy==1.25.2
     /tmp/torchenv/bin/pip install --no-deps torchvision==0.16.2 pillow==10.1.0 scipy==1.11.4 \
         requests==2.31.0 urllib3==2.1.0 idna==3.6 charset-normalizer==3.3.2 certifi==2023.11.17
     nice -n 19 /tmp/torchenv/bin/python bench/reference/reference_main.py \
         --reference_dir=/tmp/FedDecorr --data=/tmp/ref_cifar10.npz --out=/tmp/ref.json \
         -- <main.py arguments>

   or, instead of `-- <main.py arguments>`, `--algorithm=fedprox --seed=1 [--rounds=10]
   [--alpha=0.05] [--regularizer=feddecorr]`: the fidelity setting's arguments for that algorithm
   (`fidelity_args`, `reference_argv` below). torchvision 0.16.2 is the release made for torch
   2.1.2; it is installed without dependencies (so pip cannot replace torch), which is why SciPy
   (the reference's data_aug_utils.py imports it), Pillow
   (the reference's transforms use it) and requests (torchvision imports it) are listed.

The fidelity setting (bench/settings.py's FIDELITY), as main.py spells it (`fidelity_args`):
--model=resnet20 --dataset=cifar10 --partition=noniid (NIID-Bench's Dirichlet, the same branch as
noniid-labeldir) --alpha=0.05 --n_parties=10 --sample_fraction=1.0 --n_comm_round=10 --epochs=1
--lr=0.01 --rho=0.9 (main.py's SGD momentum; docs/algorithms.md, fedsam, on the collision with
FedSAM's radius) --weight_decay=1e-5 --batch-size=64 --init_seed=<seed>; FedDecorr is `--feddecorr
--feddecorr_coef=0.1` where the approach has it (fedavg, fedprox, fedoptim, fednova, moon, fedexp;
fedlogitcal, fedrs and fedsam reject the flag). main.py has no device option: it calls `.cuda()`.

What is changed, all from outside, in this process, before main.py starts:
 (i) Data: `CIFAR10` as the reference's `datasets/cifar.py` sees it (it imports torchvision's
     class by name) is replaced by a class serving the .npz arrays (`.data` uint8 NHWC, `.targets`
     a list), so nothing is downloaded and no md5 is checked. Everything the reference builds on
     top (`CIFAR10_truncated`, its partition, its transforms and DataLoaders) is its own.
 (ii) Evaluations that do not feed training: main.py's approaches call `utils.compute_accuracy`
     four times per client per round inside `_local_training` (the client's train set and the
     whole test set, before training and again after it; only logged) and twice in `run_fed` for
     the global model (the train set, augmented, and the test set). `--evals` says which run
     (the others return NaN without computing; the log then says nan):
       test (default)    only the global test evaluation kept, every round: the fidelity
                         setting's reference runs (bench/accuracy/fidelity.py,
                         bench/speed/whole_run_ratio.py), and the work the project's run does (a
                         test evaluation per round);
       global            the per-client ones removed, run_fed's global train and test
                         evaluations kept;
       no_pre            only the per-client pre-training ones removed;
       all               none removed (the reference as published).
     Removing an evaluation changes no weight, but every pass over a shuffled DataLoader, and
     every DataLoader with workers, draws from torch's global RNG, so a seed's later shuffles and
     augmentations differ between modes: the same distribution, not the same draw.
 (iii) Device: `torch.Tensor.cuda` and `torch.nn.Module.cuda` are the identity. Without it nothing
     runs here: main.py has no device flag and this machine has no GPU ("Found no NVIDIA driver").
Nothing else: main.py parses its arguments, partitions, builds its DataLoaders (6 workers each,
as written), models and approach, and runs `run_fed()`. It runs with a fresh temporary directory
as working directory (its ./logs/, ./models/ checkpoints and unused ./data/ go there; its log is
copied beside the JSON, <out>.log). Do not pass --log_file_name: main.py then fails before
training (`argument_path` is only assigned when it is None).

The JSON (`--out`, written atomically): `argv` (this script's), `main_argv`, versions, the
patches, `evals` and how many evaluations of each kind were skipped, `rounds` (per round: the
global test accuracy and loss, the train accuracy where kept, the seconds since main started),
`final_test_accuracy` (a fraction, the last round's), `wall_s` (from this script's first line:
imports and data loading included), `wall_s_main` (from main.py's start), `cpu_s` and
`cpu_s_main` (user + system of this process and its waited-for children, i.e. the DataLoader
workers: resource.getrusage SELF + CHILDREN), the load average at start and end.
bench/accuracy/fidelity.py runs this as a subprocess per seed (`--sides=reference`).
"""

import time

_T0 = time.time()  # Wall time from the script's first line (imports and data loading included).

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import dataclasses
import json
import os
import resource
import sys
from typing import Any, Dict, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA_DIR = os.path.join(os.path.dirname(ROOT), 'shared', 'data', 'tfds')
DEFAULT_REFERENCE_DIR = '/tmp/FedDecorr'
FEDDECORR_BETA = 0.1

# The fidelity setting (bench/settings.py's FIDELITY) in main.py's own flag names, in this order;
# the seed goes to --init_seed. Spelled out here: this script runs without the project on its path.
FIDELITY = (('--model', 'resnet20'), ('--dataset', 'cifar10'), ('--partition', 'noniid'),
           ('--alpha', '0.05'), ('--n_parties', '10'), ('--sample_fraction', '1.0'),
           ('--n_comm_round', '10'), ('--epochs', '1'), ('--lr', '0.01'), ('--rho', '0.9'),
           ('--weight_decay', '1e-5'), ('--batch-size', '64'))


def fidelity_args(approach: str, seed: int, extra: Sequence[str] = ()) -> list:
  """main.py's argv (without the program name) for `approach` at the fidelity setting.

  `extra` items are '--flag=value' or a bare '--flag' (store_true flags); one naming a flag of the
  setting replaces that flag's value (e.g. '--n_comm_round=1'), the others are appended in order.
  """
  values = dict(FIDELITY)
  values['--approach'] = approach
  values['--init_seed'] = str(int(seed))
  appended = []
  for item in extra:
    flag, sep, value = item.partition('=')
    if not flag.startswith('--'):
      raise ValueError(f'fidelity_args: {item!r}: give --flag=value or --flag.')
    if sep and flag in values:
      values[flag] = value
    else:
      appended.append(item)
  return [f'{flag}={value}' for flag, value in values.items()] + appended


@dataclasses.dataclass(frozen=True)
class Mapping:
  """One project algorithm as the reference runs it, with the same values on both sides."""
  approach: str                  # main.py --approach
  reference: Tuple[str, ...]     # the approach's own arguments
  project: Dict[str, Any]        # config_lib.make keywords (component settings by flag name)
  feddecorr: bool                # the reference's approach takes --feddecorr
  note: str = ''                 # where the two sides do not compute the same thing


# Values: the reference's CIFAR-10 run scripts (run_scripts/cifar10_*.sh) and, where a script does
# not set one, its argparse default (approach/*.py extra_parser); the project side is given the
# same value explicitly, so neither side's default matters.
ALGORITHMS = {
    'fedavg': Mapping('fedavg', (), {}, True),
    # cifar10_fedprox.sh --mu=0.001 (also the default).
    'fedprox': Mapping('fedprox', ('--mu=0.001',), {'fedprox_mu': 0.001}, True,
                       'the reference\'s proximal term is always zero (docs/reference.md §5): '
                       'its runs are FedAvg\'s; the project\'s acts'),
    # cifar10_fedavgm.sh: fedoptim, gd, --server_momentum=0.9 (server step fixed at 1); the whole
    # state_dict through the momentum, as the project's form and bn 'reference'.
    'fedavgm': Mapping('fedoptim', ('--server_optimizer=gd', '--server_momentum=0.9'),
                       {'fedavgm_form': 'reference', 'fedavgm_bn': 'reference',
                        'fedavgm_server_momentum': 0.9}, True,
                       'the project clamps moving variances at 0 (the reference has no guard)'),
    # cifar10_fedadam.sh (which runs adagrad): --server_learning_rate=0.01, --server_momentum=0.9,
    # --server_momentum_second=0.99; --tau default 1e-3.
    'fedadam': Mapping('fedoptim', ('--server_optimizer=adam', '--server_momentum=0.9',
                                    '--server_momentum_second=0.99',
                                    '--server_learning_rate=0.01', '--tau=0.001'),
                       {'fedadam_server_lr': 0.01, 'fedadam_beta1': 0.9, 'fedadam_beta2': 0.99,
                        'fedadam_tau': 0.001, 'fedadam_bn': 'reference'}, True,
                       'the reference also steps num_batches_tracked; the project clamps '
                       'moving variances at 0'),
    # cifar10_fedexp.sh --eps=1e-3 (also the default).
    # The reference evaluates the last iterate (the project's default, the paper's, averages the
    # last two).
    'fedexp': Mapping('fedexp', ('--eps=0.001',), {'fedexp_eps': 0.001, 'fedexp_bn': 'reference',
                                                   'fedexp_step_counters': True,
                                                   'fedexp_evaluate': 'last'},
                      True, 'both sides\' eta_g include BN\'s num_batches_tracked (the project '
                      'adds their terms, Keras has no such counter), which holds it near 1'),
    # cifar10_moon.sh / cifar10_moon_feddecorr.sh: --mu=1.0 --use_proj_head (--proj_dim default
    # 256, the project's CIFAR-10 head). The reference never applies --temperature, so its logits
    # are the cosine similarities themselves: temperature 1.0 on the project side (the project's
    # default applies the paper's 0.5).
    'moon': Mapping('moon', ('--mu=1.0', '--use_proj_head'), {'moon_mu': 1.0,
                                                             'moon_temperature': 1.0}, True,
                    'the reference\'s temperature is never applied (the project side is given '
                    '1.0); in round 1 its previous local models are the parties\' own initial '
                    'networks, the project\'s the initial global model'),
    # cifar10_fedlogitcal.sh --calibration_temp=0.1 (also the default).
    'fedlc': Mapping('fedlogitcal', ('--calibration_temp=0.1',), {'fedlc_tau': 0.1}, False),
    # cifar10_rs.sh --restricted_strength=0.5 (also the default).
    'fedrs': Mapping('fedrs', ('--restricted_strength=0.5',), {'fedrs_alpha': 0.5}, False),
    # The SAM radius cannot be set: main.py's --rho (here 0.9, the momentum) takes the flag, so
    # the approach's own --rho keeps its default 0.05 (cifar10_fedsam.sh's --rho=0.05 sets the
    # momentum to 0.05 instead; the fidelity setting's momentum 0.9 is kept here, as for every
    # algorithm).
    'fedsam': Mapping('fedsam', (), {'fedsam_rho': 0.05}, False),
}


def reference_argv(algorithm: str, seed: int, regularizer: str = 'none', alpha: float = 0.05,
                   rounds: int = 10, epochs: int = 1) -> list:
  """main.py's argv for a project algorithm (ALGORITHMS) at the fidelity setting (`epochs` local
  epochs a round: 5 is bench/settings.py's reproduction setting)."""
  m = ALGORITHMS[algorithm]
  if regularizer not in ('none', 'feddecorr'):
    raise ValueError(f'regularizer {regularizer!r}: the reference has none and feddecorr.')
  if regularizer == 'feddecorr' and not m.feddecorr:
    raise ValueError(f'the reference\'s {m.approach} has no FedDecorr.')
  extra = [*m.reference, f'--alpha={alpha}', f'--n_comm_round={int(rounds)}',
           f'--epochs={int(epochs)}']
  if regularizer == 'feddecorr':
    extra += ['--feddecorr', f'--feddecorr_coef={FEDDECORR_BETA}']
  return fidelity_args(m.approach, seed, extra)


def load_cifar10(data_dir: str):
  """(train images, train labels, test images, test labels) with the project's task loader."""
  sys.path.insert(0, ROOT)
  from tff_decorr.tasks import registry
  task = registry.get('cifar10')
  x, y, _ = task.load_split('train', data_dir)
  xt, yt, _ = task.load_split('test', data_dir)
  return x, y, xt, yt


def export(path: str, data_dir: str) -> None:
  import numpy as np
  x, y, xt, yt = load_cifar10(data_dir)
  tmp = path + '.tmp.npz'
  np.savez(tmp, train_images=x, train_labels=y, test_images=xt, test_labels=yt)
  os.replace(tmp, path)
  print(f'wrote {path}: train {x.shape} {x.dtype}, test {xt.shape} {xt.dtype}')


def _cpu_seconds() -> float:
  return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                resource.getrusage(resource.RUSAGE_CHILDREN)))


def _write_json(path: str, obj: dict) -> None:
  with open(path + '.tmp', 'w') as f:
    json.dump(obj, f, indent=2)
  os.replace(path + '.tmp', path)


def run_reference(reference_dir: str, data: str, out: str, main_argv: Sequence[str],
                  evals: str = 'test', progress: str | None = None) -> dict:
  """Runs main.py with `main_argv` (the module docstring's changes applied); writes `out`.

  With `progress`, the rounds measured so far are also written there after every global test
  evaluation, so a run cut short (a session's end) still leaves its curve.
  """
  import runpy
  import shutil
  import tempfile
  import numpy as np
  import torch
  import torchvision

  load_start = os.getloadavg()
  reference_dir = os.path.abspath(reference_dir)
  sys.path.insert(0, reference_dir)

  # (iii) Device: main.py moves every network and batch to the GPU.
  torch.Tensor.cuda = lambda self, *a, **k: self
  torch.nn.Module.cuda = lambda self, *a, **k: self

  # (i) Data: the class datasets/cifar.py calls as CIFAR10(root, train, transform,
  # target_transform, download), serving the .npz arrays.
  import datasets.cifar as ref_cifar  # The reference's module (its checkout is on sys.path).
  arrays = np.load(data)

  class NpzCIFAR10:
    """torchvision's CIFAR10 as the reference reads it: `.data` uint8 NHWC, `.targets` a list."""

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
      del root, download
      split = 'train' if train else 'test'
      self.train, self.transform, self.target_transform = train, transform, target_transform
      self.data = np.ascontiguousarray(arrays[f'{split}_images'], dtype=np.uint8)
      self.targets = [int(t) for t in arrays[f'{split}_labels']]

  ref_cifar.CIFAR10 = NpzCIFAR10

  # (ii) Evaluations. The approaches import compute_accuracy by name from utils when main.py
  # imports them, after this replacement.
  import utils as ref_utils
  real_compute_accuracy = ref_utils.compute_accuracy
  skipped = {'client_pre': 0, 'client_post': 0, 'global_train': 0, 'global_test': 0}
  keep = {'global': ('global_train', 'global_test'), 'test': ('global_test',),
          'no_pre': ('client_post', 'global_train', 'global_test'),
          'all': tuple(skipped)}[evals]
  rounds = []
  main_start = [0.0]

  def compute_accuracy(model, dataloader):
    caller = sys._getframe(1)  # pylint: disable=protected-access
    if caller.f_code.co_name == '_local_training':  # Per client, before or after its training.
      kind = 'client_post' if 'optimizer' in caller.f_locals else 'client_pre'
    else:  # run_fed: the global model on the train set (augmented) or the test set.
      kind = 'global_train' if getattr(dataloader.dataset, 'train', False) else 'global_test'
    if kind not in keep:
      skipped[kind] += 1
      return float('nan'), float('nan')
    t = time.time()
    acc, loss = real_compute_accuracy(model, dataloader)
    if kind == 'global_train':
      rounds.append({'train_accuracy': acc, 'train_loss': loss, 'train_eval_s': time.time() - t})
    elif kind == 'global_test':
      if not rounds or 'test_accuracy' in rounds[-1]:
        rounds.append({})
      rounds[-1].update(test_accuracy=acc, test_loss=loss, test_eval_s=time.time() - t,
                        s_since_main=time.time() - main_start[0])
      if progress:
        _write_json(progress, {'main_argv': list(main_argv), 'rounds': rounds, 'finished': False,
                               'torch_threads': torch.get_num_threads()})
    return acc, loss

  ref_utils.compute_accuracy = compute_accuracy

  workdir = tempfile.mkdtemp(prefix='reference_main_')
  cwd, argv = os.getcwd(), sys.argv
  sys.argv = [os.path.join(reference_dir, 'main.py'), *main_argv]
  cpu_before_main = _cpu_seconds()
  main_start[0] = time.time()
  try:
    os.chdir(workdir)
    runpy.run_path(os.path.join(reference_dir, 'main.py'), run_name='__main__')
  finally:
    os.chdir(cwd)
    sys.argv = argv
  end = time.time()
  cpu = _cpu_seconds()
  out_abs = os.path.abspath(out)
  logs = [os.path.join(workdir, 'logs', f) for f in sorted(os.listdir(os.path.join(workdir, 'logs')))
          if f.endswith('.log')]
  if logs:
    shutil.copyfile(logs[-1], os.path.splitext(out_abs)[0] + '.log')
  shutil.rmtree(workdir, ignore_errors=True)
  result = {
      'argv': [sys.executable, *argv], 'main_argv': list(main_argv),
      'reference_dir': reference_dir, 'data': os.path.abspath(data),
      'versions': {'python': sys.version.split()[0], 'torch': torch.__version__,
                   'torchvision': torchvision.__version__, 'numpy': np.__version__},
      'torch_threads': torch.get_num_threads(),
      'patches': ['datasets.cifar.CIFAR10 serves the .npz (no download, no md5 check)',
                  f'utils.compute_accuracy: evaluations kept {list(keep)}, the others skipped',
                  'torch.Tensor.cuda and torch.nn.Module.cuda are the identity (CPU)'],
      'evals': evals, 'evaluations_skipped': skipped,
      'rounds': rounds,
      'final_test_accuracy': rounds[-1]['test_accuracy'] if rounds else None,
      'wall_s': end - _T0, 'wall_s_main': end - main_start[0],
      'cpu_s': cpu, 'cpu_s_main': cpu - cpu_before_main,
      'load_avg_start': load_start, 'load_avg_end': os.getloadavg(),
  }
  os.makedirs(os.path.dirname(out_abs), exist_ok=True)
  _write_json(out_abs, result)
  return result


def main() -> None:
  argv = sys.argv[1:]
  main_argv = argv[argv.index('--') + 1:] if '--' in argv else None
  own = argv[:argv.index('--')] if '--' in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--export', help='(project venv) write the shared CIFAR-10 to this .npz')
  parser.add_argument('--data_dir', default=DEFAULT_DATA_DIR, help='TFDS dir holding cifar10')
  parser.add_argument('--reference_dir', default=DEFAULT_REFERENCE_DIR,
                      help='checkout of bytedance/FedDecorr')
  parser.add_argument('--data', help='the .npz written by --export')
  parser.add_argument('--out', help='the JSON to write')
  parser.add_argument('--progress', help='also write the rounds so far here, every round')
  parser.add_argument('--evals', default='test', choices=('test', 'global', 'no_pre', 'all'),
                      help='which compute_accuracy calls run (module docstring, change ii)')
  parser.add_argument('--algorithm', choices=sorted(ALGORITHMS),
                      help='instead of -- <main.py arguments>: the fidelity setting\'s for this '
                      'algorithm')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--alpha', type=float, default=0.05)
  parser.add_argument('--regularizer', default='none', choices=('none', 'feddecorr'))
  args = parser.parse_args(own)
  if args.export:
    export(args.export, args.data_dir)
    return
  if (main_argv is None) == (args.algorithm is None):
    parser.error('give either -- <main.py arguments> or --algorithm (not both).')
  if not args.data or not args.out:
    parser.error('--data and --out are required to run the reference.')
  if main_argv is None:
    main_argv = reference_argv(args.algorithm, args.seed, args.regularizer, args.alpha,
                               args.rounds)
  r = run_reference(args.reference_dir, args.data, args.out, main_argv, args.evals, args.progress)
  print(f'final test accuracy {r["final_test_accuracy"]}, wall {r["wall_s"]:.1f} s '
        f'(main {r["wall_s_main"]:.1f} s), cpu {r["cpu_s"]:.1f} s; wrote {args.out}', flush=True)


if __name__ == '__main__':
  main()
