"""The benchmarks' named settings, each defined once, as bin/train's flags.

`fidelity`: the setting at which the project is compared with the PyTorch reference's own main.py
(bench/accuracy/fidelity.py, bench/reference/reference_main.py): ResNet20 on the shared CIFAR-10
(10,000 train images, the 10,000 test images), Dirichlet alpha 0.05 over 10 clients all taking
part, 10 rounds x 1 local epoch, SGD lr 0.01 with momentum 0.9 and weight decay 1e-5, batch 64;
FedDecorr's beta 0.1 (the reference's CIFAR-10 scripts).

`reproduction`: the fidelity setting with the paper's amount of local work a round. On the 10k
split a client takes about 16 steps an epoch; the paper's 50k images take about 78 (its E = 1), so
E = 5 here is the paper's E = 1, and 30 rounds x 5 epochs is 150 local epochs a client
(bench/accuracy/reproduction.py, docs/reproduction.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

FEDDECORR_BETA = 0.1

FIDELITY: Dict[str, Any] = {
    'task': 'cifar10', 'model': 'resnet20', 'partition': 'dirichlet', 'dirichlet_alpha': 0.05,
    'num_clients': 10, 'clients_per_round': 10, 'rounds': 10, 'local_epochs': 1,
    'client_lr': 0.01, 'momentum': 0.9, 'weight_decay': 1e-5, 'batch_size': 64,
}

REPRODUCTION: Dict[str, Any] = {**FIDELITY, 'rounds': 30, 'local_epochs': 5}

SETTINGS = {'fidelity': FIDELITY, 'reproduction': REPRODUCTION}


def flags(setting: Mapping[str, Any], **overrides: Any) -> List[str]:
  """bin/train's (and bin/study's) flags for `setting`, `overrides` replacing its values."""
  values = {**setting, **overrides}
  return [f'--{name}={value}' for name, value in values.items()]
