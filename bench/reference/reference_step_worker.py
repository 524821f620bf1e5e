r"""The reference's client step in a persistent PyTorch process, timed on request.

Run by `bench.speed.step_speed --mode=reference` with the PyTorch environment's Python (see
bench/reference/reference_main.py for its install); not by hand. It builds the reference's own
network (bytedance/FedDecorr `networks/`, from --reference_dir) and runs the body of its
local-training loop (approach/fedavg.py `_local_training`: zero_grad, forward with features,
cross-entropy plus coef * FedDecorrLoss when coef > 0, backward, `optim.SGD(lr, momentum,
weight_decay)`) on batches of random data held in memory. For each line `N` on stdin it runs N
steps and answers one JSON line {"cpu_s": ..., "wall_s": ..., "loss": ...} (CPU = this process's
user + system time); it exits at end of input. torch's threads: its default (one per core), as
main.py runs.
"""

import argparse
import json
import os
import sys
import time


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--reference_dir', required=True)
  p.add_argument('--model', required=True, choices=('resnet20', 'mobilenetv2'))
  p.add_argument('--batch_size', type=int, default=64)
  p.add_argument('--batches', type=int, default=4)
  p.add_argument('--coef', type=float, default=0.0)
  a = p.parse_args()
  sys.path.insert(0, os.path.abspath(a.reference_dir))
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  import networks  # pylint: disable=g-import-not-at-top  (the reference's own)
  from loss import FedDecorrLoss  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  net = getattr(networks, a.model)(num_classes=10)
  net.train()
  opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
  criterion, decorr = nn.CrossEntropyLoss(), FedDecorrLoss()
  g = torch.Generator().manual_seed(0)
  xs = torch.randn(a.batches, a.batch_size, 3, 32, 32, generator=g)
  ys = torch.randint(0, 10, (a.batches, a.batch_size), generator=g)

  def step(i):
    opt.zero_grad()
    out, features = net(xs[i % a.batches], return_features=True)
    loss = criterion(out, ys[i % a.batches].long())
    if a.coef > 0:
      loss = loss + a.coef * decorr(features)
    loss.backward()
    opt.step()
    return loss.item()

  print(json.dumps({'ready': True, 'torch': torch.__version__, 'threads': torch.get_num_threads()}),
        flush=True)
  for line in sys.stdin:
    n = int(line)
    c0, t0 = sum(os.times()[:2]), time.perf_counter()
    loss = 0.0
    for i in range(n):
      loss = step(i)
    print(json.dumps({'cpu_s': sum(os.times()[:2]) - c0, 'wall_s': time.perf_counter() - t0,
                      'loss': loss}), flush=True)


if __name__ == '__main__':
  main()
