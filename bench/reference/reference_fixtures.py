"""Makes the reference-equivalence fixtures: what the PyTorch reference computes, as NumPy arrays.

Run ONCE, in an environment with PyTorch (not a dependency of this project) and a checkout of the
reference (github.com/bytedance/FedDecorr, commit 973e4af):

  python3.11 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.1.2 numpy==1.25.2
  .venv/bin/python -m bench.reference.reference_fixtures --export_images=/tmp/cifar_sample.npz \
      --data_dir=../shared/data/tfds                     # CIFAR-10 images, with TF (this venv)
  /tmp/torchenv/bin/python bench/reference/reference_fixtures.py \
      --reference_dir=/path/to/FedDecorr --images=/tmp/cifar_sample.npz \
      --out=tests/testdata/reference

The second step imports the reference's own `networks` and `loss` modules (so the fixtures are
what its code computes, not our reading of it) and records, for ResNet20 and MobileNetV2:
- the network's initial state_dict (torch.manual_seed(0), the reference's own initialisation);
- eval- and train-mode outputs of the initial network on one batch;
- local training exactly as `approach/fedavg.py` runs it: SGD(lr 0.01, momentum 0.9, weight decay
  1e-5), loss = CE + beta * FedDecorrLoss(features), on fixed batches (no augmentation, no
  shuffling): per-step CE and FedDecorr values, the first step's gradients, and the weights after
  1, 10 and 100 steps;
- (ResNet20) one FedAvg round of three clients of 97, 64 and 30 examples (batch 32: partial last
  batches, one of a single example), averaged as `FedAvg.global_aggregation` does (the whole
  state_dict, BN statistics included, weighted by client size), and the global model's eval-mode
  logits on a test batch.
MobileNetV2 (2.3M parameters) keeps its fixtures small: its initial weights are rounded to
float16-representable values before anything runs (both sides start from the same exact numbers),
and its later weights and gradients are stored as per-tensor fingerprints (sum, sum of squares,
and the dot product with a seeded random vector that the test regenerates with NumPy). ResNet20
keeps whole arrays for its start, the FedDecorr run's first gradients and first step, and the FedAvg
round; fingerprints for the rest.
tests/reference_equivalence_test.py and bench/accuracy/fidelity.py read the result.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np

MEAN = np.array([125.3, 123.0, 113.9], np.float32) / 255.0
STD = np.array([63.0, 62.1, 66.7], np.float32) / 255.0
LR, MOMENTUM, WEIGHT_DECAY, BETA = 0.01, 0.9, 1e-5, 0.1
SNAPSHOTS = (1, 10, 100)
CLIENT_SIZES = (97, 64, 30)


def fingerprint(name: str, array: np.ndarray) -> np.ndarray:
  """(sum, sum of squares, dot with a vector seeded by the tensor's name): 3 float64 numbers that
  move with any change of the tensor. tests/testutil.py has the same function."""
  a = np.asarray(array, np.float64).ravel()
  seed = int.from_bytes(name.encode()[:8].ljust(8, b'\0'), 'little') ^ a.size
  r = np.random.default_rng(seed).standard_normal(a.size)
  return np.array([a.sum(), (a * a).sum(), (a * r).sum()])


def _export_images(path: str, data_dir: str, count: int) -> None:
  """With TF (this project's venv): the first `count` CIFAR-10 train images in official order and
  the first 64 test images, as uint8 NHWC."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from tff_decorr.tasks import registry  # pylint: disable=g-import-not-at-top
  task = registry.get('cifar10')
  x, y, _ = task.load_split('train', data_dir)
  xt, yt, _ = task.load_split('test', data_dir)
  np.savez(path, images=x[:count], labels=y[:count], test_images=xt[:64], test_labels=yt[:64])
  print(f'wrote {path}')


def _main_torch(args) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, args.reference_dir)
  import loss as ref_loss  # pylint: disable=g-import-not-at-top
  import networks  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(2)
  data = np.load(args.images)
  images, labels = data['images'], data['labels'].astype(np.int64)
  test_images, test_labels = data['test_images'], data['test_labels'].astype(np.int64)

  dtype = [torch.float32]  # The run's float type; float64 runs cast the normalised images.

  def to_tensor(x):  # ToTensor() then Normalize(mean, std), as the reference's loader.
    x = (x.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(dtype[0])

  decorr = ref_loss.FedDecorrLoss()
  os.makedirs(args.out, exist_ok=True)
  np.savez_compressed(os.path.join(args.out, 'batches.npz'), images=images, labels=labels,
                      test_images=test_images, test_labels=test_labels)

  def state(net):
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()
            if not k.endswith('num_batches_tracked')}  # float64 in float64 runs.

  def train(net, xs, ys, batch_size, steps, beta, record):
    """approach/fedavg.py's inner loop over fixed batches; returns per-step records."""
    net.train()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=LR,
                          momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    ce_fn = torch.nn.CrossEntropyLoss()
    n = len(ys)
    starts = [(t * batch_size) % n for t in range(steps)] if steps else \
        list(range(0, n, batch_size))
    ces, decorrs, grads, snaps = [], [], None, {}
    for t, s in enumerate(starts, 1):
      x, y = to_tensor(xs[s:s + batch_size]), torch.from_numpy(ys[s:s + batch_size])
      opt.zero_grad()
      out, features = net(x, return_features=True)
      ce = ce_fn(out, y)
      d = decorr(features)
      d = d if torch.is_tensor(d) else torch.tensor(d)
      loss = ce + beta * d
      loss.backward()
      if t == 1:
        grads = {k: p.grad.detach().double().numpy() for k, p in net.named_parameters()}
      opt.step()
      ces.append(float(ce))
      decorrs.append(float(d))
      if t in record:
        snaps[t] = state(net)
    return np.array(ces), np.array(decorrs), grads, snaps

  for name, batch_size, steps, full in (('resnet20', 32, 100, True),
                                        ('mobilenetv2', 32, 100, False)):
    dtype[0] = torch.float32
    torch.manual_seed(0)
    net = getattr(networks, name)(10)
    if not full:  # Exact float16-representable start (smaller fixture), same on both sides.
      with torch.no_grad():
        for v in net.state_dict().values():
          if v.dtype == torch.float32:
            v.copy_(v.half().float())
    init = state(net)
    out = {f'init/{k}': (v.astype(np.float16) if not full else v) for k, v in init.items()}
    x0 = to_tensor(images[:batch_size])
    probe = copy.deepcopy(net).eval()
    with torch.no_grad():
      logits, feats = probe(x0, return_features=True)
      out['eval_logits'], out['eval_features'] = logits.numpy(), feats.numpy()
      probe.train()
      out['train_logits'] = probe(x0).numpy()
    runs = [(torch.float32, 0.0, 'plain'), (torch.float32, BETA, 'decorr'),
            (torch.float64, 0.0, 'f64/plain'), (torch.float64, BETA, 'f64/decorr')]
    for dtype[0], beta, tag in runs:
      ces, decorrs, grads, snaps = train(copy.deepcopy(net).to(dtype[0]), images, labels,
                                         batch_size, steps, beta, SNAPSHOTS)
      out[f'{tag}/ce'], out[f'{tag}/decorr'] = ces, decorrs
      # Whole arrays where a difference must be located, else fingerprints.
      exact = full and tag == 'decorr'
      for k, g in grads.items():
        out[f'{tag}/grad1/{k}'] = g if exact else fingerprint(k, g)
      for t, snap in snaps.items():
        for k, v in snap.items():
          out[f'{tag}/step{t}/{k}'] = v if exact and t == 1 else fingerprint(k, v)
      print(f'{name} {tag}: ce {ces[0]:.4f} -> {ces[-1]:.4f}, decorr {decorrs[0]:.4f} -> '
            f'{decorrs[-1]:.4f}')
    for dtype[0], prefix in ((torch.float32, ''), (torch.float64, 'f64/')):
      if not full:
        break
      # One FedAvg round, as FedAvg.local_training + global_aggregation.
      offsets = np.cumsum((0,) + CLIENT_SIZES)
      client_states = []
      for i, size in enumerate(CLIENT_SIZES):
        client = copy.deepcopy(net).to(dtype[0])
        sl = slice(int(offsets[i]), int(offsets[i]) + size)
        ces, _, _, _ = train(client, images[sl], labels[sl], batch_size, 0, BETA, ())
        out[f'{prefix}fedavg/client{i}/ce'] = ces
        client_states.append(state(client))
      freqs = np.array(CLIENT_SIZES, np.float64) / sum(CLIENT_SIZES)
      global_state = {k: sum(f * s[k] for f, s in zip(freqs, client_states)).astype(v.dtype)
                      for k, v in client_states[0].items()}
      for k, v in global_state.items():
        out[f'{prefix}fedavg/global/{k}'] = v if not prefix else fingerprint(k, v)
      g = copy.deepcopy(net).to(dtype[0])
      g.load_state_dict({k: torch.from_numpy(v) for k, v in global_state.items()}, strict=False)
      g.eval()
      with torch.no_grad():
        out[f'{prefix}fedavg/test_logits'] = g(to_tensor(test_images)).double().numpy()
    path = os.path.join(args.out, f'{name}.npz')
    np.savez_compressed(path, **out)
    print(f'wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--export_images', help='with TF: write CIFAR-10 sample images here')
  parser.add_argument('--data_dir', default='../shared/data/tfds')
  parser.add_argument('--count', type=int, default=640)
  parser.add_argument('--reference_dir', help='checkout of bytedance/FedDecorr (with torch)')
  parser.add_argument('--images', help='the file --export_images wrote')
  parser.add_argument('--out', default='tests/testdata/reference')
  args = parser.parse_args()
  if args.export_images:
    _export_images(args.export_images, args.data_dir, args.count)
  elif args.reference_dir and args.images:
    _main_torch(args)
  else:
    parser.error('give --export_images (with TF) or --reference_dir and --images (with torch)')


if __name__ == '__main__':
  main()
