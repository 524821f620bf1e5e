"""FedSAM (Qu et al. 2022, "Generalized Federated Learning via Sharpness Aware Minimization";
Caldarola et al. 2022): FedAvg whose clients take sharpness-aware (SAM, Foret et al. 2021) local
steps, as the FedDecorr reference runs it (approach/fedsam.py, the SAM optimiser of
github.com/davda54/sam with adaptive=False over PyTorch's SGD).

Each local step on a batch, from weights w (all trainable variables):
  g   = grad L(w)                                    (first forward pass, train mode)
  e   = rho * g / (||g||_2 + 1e-12)                  (||g|| over all trainable variables)
  g_s = grad L(w + e)                                (second forward pass, train mode)
  w  <- the momentum SGD step of client_update from w with g_s (weight decay at w, buffer g_s+wd w)
L is the whole local loss (cross-entropy + regulariser), the reference's L its cross-entropy alone
(its FedSAM has no FedDecorr option). Both passes run in training mode, so BatchNorm's moving
statistics are updated twice per step, the second time at w + e, as in the reference (SAM restores
the parameters only; BN buffers keep the second update). rho = 0 is FedAvg exactly.
Server: as FedAvg. The reference's default rho is 0.05 (docs/algorithms.md: its script's --rho
sets the client momentum instead).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tff_decorr import hparams
from tff_decorr.algorithms import base, fedavg


@dataclasses.dataclass(frozen=True)
class FedSAMHParams(hparams.HParams):
  component: ClassVar[str] = 'fedsam'
  rho: float = hparams.field(0.05, 'SAM neighbourhood radius: each local gradient is taken at '
                             'w + rho g/|g| (the reference: 0.05).', minimum=0.0)


class FedSAM(fedavg.FedAvg):
  name = 'fedsam'
  HParams = FedSAMHParams

  @property
  def rho(self) -> float:
    return self.hparams.rho

  def _client_step(self, ws, broadcast, dataset, client_state):
    res = self._train(ws, broadcast['weights'], dataset, sam_rho=self.rho)
    return base.ClientOutput(base.weighted(res.weights, res.num_examples), res.num_examples,
                             client_state, res.metrics)
