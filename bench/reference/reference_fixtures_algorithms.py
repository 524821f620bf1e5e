"""Makes the reference-equivalence fixtures of the federated algorithms: what the PyTorch
reference's own `approach/*.py` classes compute over a few rounds, as NumPy arrays.

Run ONCE, in an environment with PyTorch (not a dependency of this project) and a checkout of the
reference (github.com/bytedance/FedDecorr, commit 973e4af), after
bench/reference/reference_fixtures.py (this script reads its `batches.npz` and ResNet20's initial
weights from `resnet20.npz`):

  python3.11 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.1.2 numpy==1.25.2
  /tmp/torchenv/bin/python bench/reference/reference_fixtures_algorithms.py \
      --reference_dir=/path/to/FedDecorr --out=tests/testdata/reference/algorithms [--only=fednova]

How the reference runs here. Each run builds the reference's approach class (FedProx, MOON, FedNova,
FedOptim, FedExp, FedLogitCal, FedRS, FedSAM) exactly as its main.py does and calls its own
`run_fed()`; nothing of its training or aggregation is re-implemented. Only the surroundings are
replaced: `.cuda()` is the identity (CPU), the logger discards, checkpoints are never due, and the
data loaders are PyTorch DataLoaders (no shuffling, no augmentation) over fixed CIFAR-10 images:
three clients holding images [0, 97), [97, 161), [161, 191) of batches.npz (batch 32: 4, 2 and 1
local steps per epoch, client 0's last batch a single example), normalised as the reference's
loader (float32, then cast to float64). Everything runs in float64 (`net.double()`).
Common settings (the `settings` entry of every file, JSON): ResNet20 (10 classes) starting from
`init/` of resnet20.npz; 3 clients, all sampled every round (party_list_rounds = [[0, 1, 2]] * R);
1 local epoch (FedExp: 2); client SGD lr 0.01, momentum 0.9, weight decay 1e-5; batch 32. Every
party's network starts as a copy of the global one (main.py initialises each party's network
separately, which matters only for MOON's first-round previous model, see below).

What every file `<run>.npz` contains. "fp" = an array [len(keys), 3] holding, for each state_dict
key in `keys` order, bench/reference/reference_fixtures.fingerprint(key, tensor) (sum, sum of
squares and the dot product with a vector seeded by the key); "stats" = the BN running_mean and
running_var tensors of `stat_keys`, raveled and concatenated in that order (float64, whole):
- `settings`: JSON of the run's settings (above, plus the approach's own arguments);
  `keys`, `stat_keys`: JSON lists of state_dict keys (num_batches_tracked left out);
  `client{i}/indices`: the images of batches.npz client i holds.
- `global{r}` (fp) and `global{r}/stats`, r = 0..R: the global state_dict after r rounds
  (global0 = the start; for FedOptim, after its server update).
- `round{r}/client{i}` (fp), r = 1..R: client i's state_dict as `global_aggregation` receives it
  (for FedNova: already normalised by the reference, x + (y_i - x) / a_i).
- `round{r}/client{i}/stats`: client i's own statistics after its local training, y_i (for
  FedNova de-normalised here: x + a_i * (received - x)).
- `round{r}/client{i}/steps`: its local SGD steps (all epochs); `round{r}/client{i}/a`
  (FedNova): its a_i.
- `round{r}/averaged` (fp): the global state_dict right after `global_aggregation` (for
  FedOptim: before the server update, so delta = averaged - global{r-1}).
- FedOptim: `round{r}/moment_first`, `round{r}/moment_second` (fp): run_fed's server
  moments after round r's update (read from run_fed's frame when it loads the new global state).
  FedNova: `round{r}/tau_eff`; FedExp: `round{r}/eta_g` (read from `global_aggregation`'s frame).
- MOON: `round{r}/client{i}/sims` [examples, 2]: the cosine similarities of each step's batch
  to the global and to the previous local model, as the reference computes them, before any
  temperature, steps concatenated (batches of 32, the last one smaller); `round2/client0/z`,
  `.../z_global`, `.../z_prev` [32, 64]: the three representations of round 2's first step of
  client 0.

The runs (name: approach, its arguments, rounds):
- `fedprox_asis`: FedProx, mu 1.0, FedDecorr 0.1, 1 round, the reference unchanged. Its proximal
  term is always zero: its `global_weight_collector` is a list of the very parameter objects being
  trained, so each difference it takes is 0 (docs/reference.md §5); the result is FedAvg's
  (resnet20.npz f64/fedavg/global).
- `fedprox_fixed`: the same with that defect repaired from outside: the first `net.parameters()`
  call of each client's `_local_training` (the one that fills `global_weight_collector`) returns
  detached copies of the broadcast weights, so the reference's own loop computes the paper's
  (mu/2) sum ||w - w_global||^2 over all parameters (BN gamma and beta included).
- `moon_asis`: MOON (no projection head), mu 1.0, FedDecorr 0.1, 2 rounds, unchanged: the
  contrastive logits are the cosine similarities themselves, `--temperature` is never used.
- `moon_t0.5`: the same with the temperature applied as in the MOON paper (eq. 3,
  exp(sim / tau)): the `torch.nn.CosineSimilarity` the reference builds returns sim / 0.5.
  For both MOON runs the previous local model of round 1 is the initial global model (as this
  project initialises it; main.py's separately initialised party networks would make it a random
  network), so round 1's contrastive gradient is 0 (z_global = z_prev) and round 2 exercises it.
  The wrapper's new classifier is drawn with torch.manual_seed(1) and stored whole as
  `init/classifier.weight` and `init/classifier.bias` (keys `features.*` are ResNet20's).
- `fednova`: FedNova, FedDecorr 0.1, 3 rounds. The reference normalises the whole state_dict,
  running statistics included (an extrapolation, see docs/algorithms.md); the per-client
  statistics above let a test apply another rule to the same clients.
- `fedoptim_{gd,adam,yogi,adagrad}`: FedOptim (FedAvgM for gd), 3 rounds, no FedDecorr,
  server_momentum 0.9, server_momentum_second 0.99, server_learning_rate 0.01 (not used by gd,
  whose step is fixed to 1), tau 1e-3. The server rule acts on the whole state_dict.
- `fedexp`: FedExp, eps 1e-3, 3 rounds, no FedDecorr, on the label-skewed clients below with 2
  local epochs, so that the clients' updates disagree. `round{r}/avg_sqr_delta` and
  `round{r}/sqr_avg_delta` are its sum_i p_i ||Delta_i||^2 and ||sum_i p_i Delta_i||^2 over the
  whole state_dict, `round{r}/eta_g` the server step it took (at least 1). Their whole
  state_dict includes BatchNorm's integer step counters (num_batches_tracked, which move by the
  client's local steps k_i; the reference sums their part in float32) and the BN running
  statistics. In this run the counters make up 59% of both sums in round 1 and the statistics
  41%, the weights 0.05%; the ratio halved, eta_g before its floor of 1, is 0.59 for the counters
  (E_p[k^2] / (2 E_p[k]^2)) and 0.56 for the statistics, so eta_g is 1 (FedAvg's step) in all
  three rounds, while over the weights alone the ratio is 0.87, 1.32 and 1.63 in rounds 1-3
  (without eps; eta_g would be 1, about 1.3 and about 1.6).
  Key by key (`sqr_keys`: every state_dict key, counters included): `round{r}/client{i}/sqr_delta`
  ||y_i - x||^2 and `round{r}/sqr_avg_delta_per_key` ||sum_i p_i y_i - x||^2 (computed here in
  float64 from the clients' states), so that a test can form the sums over any set of keys.
  Its `round{r}/averaged` is after its eta_g step (= global{r}).
- `fedexp_nocounters`: the same with the counters removed from every BatchNorm (its
  num_batches_tracked set to None: the forward is unchanged, the state_dict has no such key), so
  the sums are over the weights and running statistics only (eta_g is still 1 here: the
  statistics dominate).
- `fedlogitcal`: FedLogitCal, calibration_temp 0.1, 2 rounds (its class counts are computed in
  float32 by the reference: `torch.zeros(n_class)`), no FedDecorr (the reference has none there).
- `fedrs`: FedRS, restricted_strength 0.5, 2 rounds.
  FedLogitCal and FedRS act only on classes a client lacks, so these two runs (and fedexp) use
  label-skewed clients instead: client i holds the first 97, 64, 30 images of batches.npz (its
  640) whose label is in {0..5}, {3..7}, {7, 8, 9} respectively (overlapping images;
  `client{i}/indices` and `settings` give them).
- `fedsam`: FedSAM, SAM rho 0.05 (`--rho` of the approach; the momentum is main.py's --rho 0.9),
  2 rounds.
- `<run>_partial` (PARTIAL_RUNS: fedprox_fixed, moon_t0.5, fedexp, fedlogitcal, fedrs, fedsam,
  fedoptim_{gd,adam,yogi,adagrad}, and two runs made only in this form, PARTIAL_ONLY: `fedavg`,
  the reference's FedAvg class with FedDecorr 0.1, and `fednova_fixed`, FedNova, FedDecorr 0.1,
  with its party index repaired (patch 'nova_index': the reference's tau_eff takes p_i by party id
  from a list over the round's parties, an IndexError under partial participation,
  docs/reference.md §5; the reference's own global_aggregation is compiled again from its source
  with that one expression indexed by position)): the run's approach and arguments with partial
  participation: 5 label-skewed clients (the first 97, 64, 30, 48 and 40 images of batches.npz
  with labels in {0..5}, {3..7}, {7, 8, 9}, {0, 1, 8, 9}, {2, 4, 6}), 3 of them sampled in each
  of 3 rounds (PARTICIPATION: [0, 1, 2], [1, 3, 4], [0, 2, 4], the reference's party_list_rounds,
  also stored as `participation`, JSON), 2 local epochs. Only the sampled clients have
  `round{r}/client{i}` entries (fedexp's per-client sums too, and its
  `round{r}/sqr_avg_delta_per_key` is over them); moon_t0.5_partial has no `round2/client0/z*`
  (client 0 sits out round 2). MOON's previous local model is each party's own, kept by the
  reference between the rounds it takes part in. The runs are independent (each starts from the
  same weights and seed), so they may be made in separate processes.
tests/reference_algorithms_test.py reads the FedAvg, FedProx, MOON and FedNova runs,
tests/reference_optimizers_test.py the others.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import json
import logging
import os
import sys
import tempfile
import textwrap
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE_DATA = os.path.normpath(os.path.join(HERE, '..', '..', 'tests', 'testdata', 'reference'))
LR, MOMENTUM, WEIGHT_DECAY, BETA, BATCH = 0.01, 0.9, 1e-5, 0.1, 32
CLIENT_SIZES = (97, 64, 30)
SKEW_CLASSES = ((0, 1, 2, 3, 4, 5), (3, 4, 5, 6, 7), (7, 8, 9))
SKEWED_RUNS = ('fedlogitcal', 'fedrs', 'fedexp', 'fedexp_nocounters')
EPOCHS = {'fedexp': 2, 'fedexp_nocounters': 2}  # Default 1.
# Partial participation: 5 label-skewed clients, 3 sampled a round, 2 local epochs, 3 rounds.
PARTIAL_SIZES = (97, 64, 30, 48, 40)
PARTIAL_CLASSES = SKEW_CLASSES + ((0, 1, 8, 9), (2, 4, 6))
PARTICIPATION = ([0, 1, 2], [1, 3, 4], [0, 2, 4])


def _load_sibling(name):
  """bench/reference/<name>.py by path (importing the `bench` package would import TensorFlow)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_base = _load_sibling('reference_fixtures')
fingerprint, MEAN, STD = _base.fingerprint, _base.MEAN, _base.STD

# name: (module, class, approach arguments, rounds, FedDecorr on, patch)
RUNS = {
    'fedprox_asis': ('fedprox', 'FedProx', dict(mu=1.0), 1, True, None),
    'fedprox_fixed': ('fedprox', 'FedProx', dict(mu=1.0), 1, True, 'prox'),
    'moon_asis': ('moon', 'MOON', dict(mu=1.0, temperature=0.5, use_proj_head=False,
                                       proj_dim=256), 2, True, None),
    'moon_t0.5': ('moon', 'MOON', dict(mu=1.0, temperature=0.5, use_proj_head=False,
                                       proj_dim=256), 2, True, 'temperature'),
    'fednova': ('fednova', 'FedNova', {}, 3, True, None),
    'fedexp': ('fedexp', 'FedExp', dict(eps=1e-3), 3, False, None),
    'fedexp_nocounters': ('fedexp', 'FedExp', dict(eps=1e-3), 3, False, 'no_counters'),
    'fedlogitcal': ('fedlogitcal', 'FedLogitCal', dict(calibration_temp=0.1), 2, False, None),
    'fedrs': ('fedrs', 'FedRS', dict(restricted_strength=0.5), 2, False, None),
    'fedsam': ('fedsam', 'FedSAM', dict(rho=0.05), 2, False, None),
}
for _opt in ('gd', 'adam', 'yogi', 'adagrad'):
  RUNS[f'fedoptim_{_opt}'] = ('fedoptim', 'FedOptim', dict(
      server_optimizer=_opt, server_momentum=0.9, server_momentum_second=0.99,
      server_learning_rate=0.01, tau=1e-3), 3, False, None)
# Runs made only with partial participation: FedAvg (FedDecorr 0.1, the paper's method; its
# full-participation round is bench/reference/reference_fixtures.py's), and FedNova with its party
# index repaired ('nova_index': the reference's fails under partial participation,
# docs/reference.md §5; with every client in every round the index is right, so `fednova` needs no
# repair).
PARTIAL_ONLY = {
    'fedavg': ('fedavg', 'FedAvg', {}, None, True, None),
    'fednova_fixed': ('fednova', 'FedNova', {}, None, True, 'nova_index'),
}
# The runs that show the reference unchanged next to a repaired one need no partial form.
PARTIAL_RUNS = tuple(f'{r}_partial' for r in (*RUNS, *PARTIAL_ONLY)
                     if r not in ('fednova', 'fedexp_nocounters') and not r.endswith('_asis'))
for _run in PARTIAL_RUNS:
  _module, _cls, _kw, _, _decorr, _patch = {**RUNS, **PARTIAL_ONLY}[_run[:-len('_partial')]]
  RUNS[_run] = (_module, _cls, _kw, len(PARTICIPATION), _decorr, _patch)
  EPOCHS[_run] = 2


def _is_stat(key):
  return key.endswith('running_mean') or key.endswith('running_var')


def _repair_party_index(appr, appr_cls) -> None:
  """FedNova's global_aggregation with its one defect repaired: tau_eff = sum_i p_i a_i takes
  p_i from `fed_avg_freqs`, a list over the round's parties, by party id (an IndexError, or the
  wrong p_i, unless the round's parties are 0, 1, ...). The reference's own function, compiled
  again from its source with that one expression indexed by position instead."""
  src = textwrap.dedent(inspect.getsource(appr_cls.global_aggregation))
  bug = 'fed_avg_freqs[r]*all_a[r] for r in nets_this_round'
  assert src.count(bug) == 1, 'the reference changed'
  src = src.replace(bug, 'fed_avg_freqs[j]*all_a[r] for j, r in enumerate(nets_this_round)')
  namespace = {}
  exec(compile(src, inspect.getsourcefile(appr_cls), 'exec'),  # pylint: disable=exec-used
       vars(sys.modules[appr_cls.__module__]), namespace)
  appr.global_aggregation = types.MethodType(namespace['global_aggregation'], appr)


def _main(args) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  from torch.utils import data as tdata  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, args.reference_dir)
  import networks  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(2)
  # CPU: the reference moves every network and batch to the GPU.
  torch.Tensor.cuda = lambda self, *a, **k: self
  torch.nn.Module.cuda = lambda self, *a, **k: self
  logger = logging.getLogger('reference_fixtures_algorithms')
  logger.addHandler(logging.NullHandler())
  logger.propagate = False

  batches = np.load(os.path.join(args.fixtures, 'batches.npz'))
  init = np.load(os.path.join(args.fixtures, 'resnet20.npz'))
  init = {k[len('init/'):]: init[k] for k in init if k.startswith('init/')}

  def to_tensor(x):  # ToTensor() then Normalize(mean, std) in float32, then float64.
    x = (x.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).double()

  class Arrays(tdata.Dataset):
    """What the reference's loaders hold, with the `.target` FedLogitCal and FedRS read."""

    def __init__(self, images, labels):
      self.x, self.target = to_tensor(images), labels.astype(np.int64)

    def __len__(self):
      return len(self.target)

    def __getitem__(self, i):
      return self.x[i], int(self.target[i])

  offsets = np.cumsum((0,) + CLIENT_SIZES)
  contiguous = [np.arange(offsets[i], offsets[i] + n) for i, n in enumerate(CLIENT_SIZES)]
  skewed = [np.flatnonzero(np.isin(batches['labels'], classes))[:n]
            for classes, n in zip(SKEW_CLASSES, CLIENT_SIZES)]
  partial = [np.flatnonzero(np.isin(batches['labels'], classes))[:n]
             for classes, n in zip(PARTIAL_CLASSES, PARTIAL_SIZES)]
  loader = lambda ds: tdata.DataLoader(ds, batch_size=BATCH, shuffle=False)
  global_train = Arrays(batches['images'][:offsets[-1]], batches['labels'][:offsets[-1]])
  test = Arrays(batches['test_images'], batches['test_labels'])
  os.makedirs(args.out, exist_ok=True)
  only = set(args.only.split(',')) if args.only else set(RUNS)

  for run, (module, cls_name, appr_kw, rounds, decorr, patch) in RUNS.items():
    if run not in only:
      continue
    indices = skewed if run in SKEWED_RUNS else contiguous
    participation = [list(range(len(CLIENT_SIZES)))] * rounds
    if run in PARTIAL_RUNS:
      indices, participation = partial, [list(p) for p in PARTICIPATION]
    client_sets = [Arrays(batches['images'][ix], batches['labels'][ix]) for ix in indices]
    appr_cls = getattr(__import__(f'approach.{module}', fromlist=[cls_name]), cls_name)
    base = networks.resnet20(10)
    base.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()}, strict=False)
    base = base.double()
    party2nets = {i: copy.deepcopy(base) for i in range(len(indices))}
    ckpt = tempfile.mkdtemp()
    train_args = types.SimpleNamespace(
        lr=LR, rho=MOMENTUM, weight_decay=WEIGHT_DECAY, epochs=EPOCHS.get(run, 1),
        n_comm_round=rounds,
        print_interval=10**9, save_interval=10**9, ckptdir=ckpt, approach=module,
        log_file_name='fixture')
    appr_args = types.SimpleNamespace(feddecorr=decorr, feddecorr_coef=BETA, **appr_kw)
    torch.manual_seed(1)  # MOON's wrapper draws new classifiers.
    appr = appr_cls(train_args, appr_args, logger, participation, party2nets, base,
                    {i: loader(ds) for i, ds in enumerate(client_sets)},
                    loader(global_train), loader(test))
    for net in [appr.global_net, *appr.party2nets.values(),
                *getattr(appr, 'party2prevnets', {}).values()]:
      net.double()  # MOON's wrapper adds float32 layers.
    if patch == 'no_counters':  # BatchNorm without its step counter (momentum 0.1 is set).
      for net in [appr.global_net, *appr.party2nets.values()]:
        for m in net.modules():
          if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):  # pylint: disable=W0212
            m.num_batches_tracked = None
    if patch == 'nova_index':  # tau_eff indexes the round's list of p_i by party id.
      _repair_party_index(appr, appr_cls)
    if module == 'moon':  # The previous local model of round 1: the initial global model.
      for prev in appr.party2prevnets.values():
        prev.load_state_dict(appr.global_net.state_dict())
    out = {}
    settings = dict(model='resnet20', num_classes=10,
                    client_sizes=[len(ix) for ix in indices],
                    client_indices=[ix.tolist() for ix in indices],
                    client_classes=[sorted(set(ds.target.tolist())) for ds in client_sets],
                    batch_size=BATCH, epochs=EPOCHS.get(run, 1), rounds=rounds, lr=LR,
                    momentum=MOMENTUM,
                    weight_decay=WEIGHT_DECAY, feddecorr_coef=BETA if decorr else 0.0,
                    dtype='float64', approach=module, patch=patch, **appr_kw)
    out['settings'] = np.array(json.dumps(settings))
    out['participation'] = np.array(json.dumps(participation))
    for k, v in appr.global_net.state_dict().items():
      if k.startswith('classifier.') and module == 'moon':  # The wrapper's own classifier.
        out[f'init/{k}'] = v.detach().numpy().copy()
    for i, ix in enumerate(indices):
      out[f'client{i}/indices'] = ix

    def record_state(prefix, sd, stats=True):
      keys = [k for k in sd if not k.endswith('num_batches_tracked')]
      if 'keys' not in out:
        out['keys'] = np.array(json.dumps(keys))
        out['stat_keys'] = np.array(json.dumps([k for k in keys if _is_stat(k)]))
      assert json.dumps(keys) == str(out['keys']), prefix
      out[prefix] = np.stack([fingerprint(k, sd[k].detach().double().numpy()) for k in keys])
      if stats:
        out[f'{prefix}/stats'] = np.concatenate(
            [sd[k].detach().double().numpy().ravel() for k in keys if _is_stat(k)])

    state = {'round': 0, 'start': None, 'party': None}
    original_local = appr.local_training
    original_load = appr.global_net.load_state_dict

    def local_training(comm_round):
      state['round'] = r = comm_round + 1
      state['start'] = copy.deepcopy(appr.global_net.state_dict())
      record_state(f'global{r - 1}', state['start'])
      result = original_local(comm_round)
      nets, all_a = result if isinstance(result, tuple) else (result, None)
      for i, net in nets.items():
        sd = net.state_dict()
        record_state(f'round{r}/client{i}', sd, stats=False)
        out[f'round{r}/client{i}/steps'] = np.array(len(appr.party2loaders[i]) *
                                                    train_args.epochs)
        a = 1.0 if all_a is None else all_a[i]
        if all_a is not None:
          out[f'round{r}/client{i}/a'] = np.array(a, np.float64)
        if module == 'fedexp':  # What its two sums are made of, key by key.
          out[f'round{r}/client{i}/sqr_delta'] = np.array(
              [float(((sd[k].double() - state['start'][k].double())**2).sum()) for k in sd])
        out[f'round{r}/client{i}/stats'] = np.concatenate(
            [(x + a * (v.double() - x)).numpy().ravel()
             for x, v in ((state['start'][k].double(), sd[k]) for k in sd if _is_stat(k))])
      if module == 'fedexp':
        p = np.array([len(appr.party2loaders[i].dataset) for i in nets], np.float64)
        p /= p.sum()
        states = [net.state_dict() for net in nets.values()]
        out[f'round{r}/sqr_avg_delta_per_key'] = np.array([float(((sum(
            pi * s[k].double() for pi, s in zip(p, states)) - state['start'][k].double())**2).sum())
                                                          for k in states[0]])
        out['sqr_keys'] = np.array(json.dumps(list(states[0])))
      return result

    def load_state_dict(sd, *a, **k):
      caller = sys._getframe(1)  # pylint: disable=protected-access
      r, local = state['round'], caller.f_locals
      if caller.f_code.co_name == 'global_aggregation':
        record_state(f'round{r}/averaged', sd, stats=False)
        for name in ('tau_eff', 'eta_g', 'avg_sqr_delta', 'sqr_avg_delta'):
          if name in local:
            out[f'round{r}/{name}'] = np.array(float(local[name]), np.float64)
      elif caller.f_code.co_name == 'run_fed' and 'moment_first' in local:
        record_state(f'round{r}/moment_first', local['moment_first'], stats=False)
        record_state(f'round{r}/moment_second', local['moment_second'], stats=False)
      return original_load(sd, *a, **k)

    appr.local_training = local_training
    appr.global_net.load_state_dict = load_state_dict

    if patch == 'prox':
      original_client = appr._local_training  # pylint: disable=protected-access

      def fixed_client(party_id):
        net = appr.party2nets[party_id]
        real, calls = net.parameters, [0]

        def parameters(*a, **k):
          calls[0] += 1
          if calls[0] == 1:  # global_weight_collector: the broadcast weights, not aliases.
            return iter([p.detach().clone() for p in real(*a, **k)])
          return real(*a, **k)

        net.parameters = parameters
        try:
          original_client(party_id)
        finally:
          del net.parameters
        assert calls[0] > 2, calls

      appr._local_training = fixed_client  # pylint: disable=protected-access

    client_step = appr._local_training  # pylint: disable=protected-access

    def tracked_client(party_id):
      state['party'] = party_id
      return client_step(party_id)

    appr._local_training = tracked_client  # pylint: disable=protected-access

    real_cos = torch.nn.CosineSimilarity
    if module == 'moon':
      temperature = appr_kw['temperature'] if patch == 'temperature' else None
      sims = {}

      class Cosine(real_cos):
        """Records the similarities the reference computes (and divides by T if patched)."""

        def forward(self, x1, x2):
          s = super().forward(x1, x2)
          r = state['round']
          party = state['party']
          key = f'round{r}/client{party}'
          sims.setdefault(key, []).append(s.detach().numpy().copy())
          if r == 2 and party == 0 and len(sims[key]) <= 2:
            out[f'{key}/z'] = x1.detach().numpy().copy()
            out[f'{key}/z_global' if len(sims[key]) == 1 else f'{key}/z_prev'] = (
                x2.detach().numpy().copy())
          return s if temperature is None else s / temperature

      torch.nn.CosineSimilarity = Cosine
    try:
      appr.run_fed()
    finally:
      torch.nn.CosineSimilarity = real_cos
    record_state(f'global{rounds}', appr.global_net.state_dict())
    if module == 'moon':
      for key, values in sims.items():
        out[f'{key}/sims'] = np.concatenate([np.stack(values[j:j + 2], -1)
                                             for j in range(0, len(values), 2)])
    path = os.path.join(args.out, f'{run}.npz')
    np.savez_compressed(path, **out)
    print(f'wrote {path} ({os.path.getsize(path) / 1e3:.0f} kB, {len(out)} entries)', flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--reference_dir', required=True, help='checkout of bytedance/FedDecorr')
  parser.add_argument('--fixtures', default=REFERENCE_DATA,
                      help='where bench/reference/reference_fixtures.py wrote batches.npz and '
                      'resnet20.npz')
  parser.add_argument('--out', default=os.path.join(REFERENCE_DATA, 'algorithms'))
  parser.add_argument('--only', default='', help='comma-separated run names (default: all)')
  _main(parser.parse_args())


if __name__ == '__main__':
  main()
