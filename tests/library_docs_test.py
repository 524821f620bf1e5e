"""docs/library.md runs as written: its Python blocks, in order, as one program.

Each block is executed in the same namespace, as a reader pasting them one after the other would;
what they print is checked against what the page says they compute.
"""

import contextlib
import io
import os
import re

from absl.testing import absltest
import numpy as np

from tests import testutil
from tff_decorr.worker import tff_context

_PAGE = os.path.join(testutil.REPO_ROOT, 'docs', 'library.md')


def _blocks():
  with open(_PAGE) as f:
    return re.findall(r'```python\n(.*?)```', f.read(), re.S)


class LibraryDocsTest(absltest.TestCase):

  @classmethod
  def tearDownClass(cls):
    tff_context.stop_all()  # The page's tff_context.install() started a worker.
    super().tearDownClass()

  def test_the_page_runs(self):
    blocks = _blocks()
    self.assertLen(blocks, 5)
    namespace = {'__name__': 'library_docs'}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      for block in blocks:
        exec(compile(block, _PAGE, 'exec'), namespace)  # pylint: disable=exec-used
    printed = out.getvalue()
    # Section 2: the clients hold every training example once.
    sizes = [int(n) for n in re.search(r'examples per client: \[(.*)\]', printed)[1].split(',')]
    self.assertEqual(sum(sizes), 200)
    self.assertLen(sizes, namespace['NUM_CLIENTS'])
    # Section 3: the decorrelation loss of the printed batch, against NumPy (the reference's
    # formula: standardised columns, mean squared off-diagonal of z^T z, divided by N).
    z = namespace['out']['representation'].numpy().astype(np.float64)
    n, d = z.shape
    zs = (z - z.mean(0)) / np.sqrt(z.var(0, ddof=1) + 1e-8)
    k = zs.T @ zs
    expected = (np.sum(k ** 2) - np.sum(np.diag(k) ** 2)) / (d * (d - 1)) / n
    got = float(re.search(r'decorrelation loss: (\S+)', printed)[1])
    self.assertAlmostEqual(got, expected, delta=1e-5 * max(1.0, expected))
    # Section 4: three rounds, each with a positive FedDecorr term.
    rounds = re.findall(r'round (\d): loss (\S+), FedDecorr term (\S+)', printed)
    self.assertEqual([r[0] for r in rounds], ['1', '2', '3'])
    self.assertTrue(all(float(r[2]) > 0 for r in rounds), rounds)
    # Section 5: the accuracy printed is the global model's on the test split, recomputed here;
    # the effective rank is within [1, d].
    model, test_x, test_y = namespace['global_model'], namespace['test_x'], namespace['test_y']
    accuracy = np.mean(np.argmax(model(test_x)['logits'].numpy(), axis=1) == test_y)
    self.assertAlmostEqual(float(re.search(r'test accuracy: (\S+)', printed)[1]), accuracy)
    rank, dim = re.search(r'effective rank: (\S+) of (\d+)', printed).groups()
    self.assertBetween(float(rank), 1.0, float(dim))
    self.assertEqual(int(dim), 8)


if __name__ == '__main__':
  absltest.main()
