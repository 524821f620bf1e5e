"""`bin/train --track_collapse`: the global model's representation spectrum during training.

Every `--eval_every` rounds (and at the end) the global model's representations over the test split
are reduced to the scalars the papers discuss: effective rank and the number of singular values of
the covariance above tau (tff_decorr.analysis; docs/analysis.md defines both). The full spectrum is
saved as well (`collapse/round_<r>.npy`), so curves can be plotted later with bin/analyze's plots.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from tff_decorr import analysis


def tracker(exp, evaluator, test_dataset, eval_every: int, rounds: int,
            max_examples: Optional[int] = 10000) -> Callable[[int, object], dict]:
  """Returns an `on_round_end(round, server_state) -> metrics` hook for `program.run`.

  It reuses the evaluator's Keras model, whose weights the evaluation of the same round has just
  set to the global model's (the program evaluates before calling this hook).
  """
  out_dir = os.path.join(exp.config.output_dir, 'collapse')

  def on_round_end(round_num: int, server_state) -> dict:
    if round_num % max(eval_every, 1) and round_num != rounds:
      return {}
    weights = exp.algorithm.global_weights(server_state)
    from tff_decorr import export  # pylint: disable=g-import-not-at-top
    export.set_weights(evaluator.model, weights)
    cov = analysis.representation_covariance(evaluator.model, test_dataset,
                                             max_examples=max_examples)
    sv = analysis.singular_values(cov)
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, f'round_{round_num}.npy'), sv)
    return {'effective_rank': float(analysis.effective_rank(sv)),
            'num_significant_sv': float(analysis.num_significant(sv))}

  return on_round_end
