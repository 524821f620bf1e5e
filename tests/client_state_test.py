"""The on-disk client-state store: round trip, initial states, atomic versions, manifests."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl.testing import absltest
import numpy as np

from tff_decorr.run_files import client_state


def _initial():
  return {'control': [np.zeros((2, 3), np.float32), np.zeros((3,), np.float32)]}


def _state(v):
  return {'control': [np.full((2, 3), v, np.float32), np.arange(3, dtype=np.float32) + v]}


class ClientStateStoreTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self.create_tempdir().full_path
    self.store = client_state.ClientStateStore(os.path.join(self.dir, 'states'), _initial)

  def _assert_state(self, got, v):
    want = _state(v)
    np.testing.assert_array_equal(got['control'][0], want['control'][0])
    np.testing.assert_array_equal(got['control'][1], want['control'][1])

  def test_unknown_client_gets_initial_state(self):
    got = self.store.load('never_seen')
    np.testing.assert_array_equal(got['control'][0], np.zeros((2, 3)))
    np.testing.assert_array_equal(got['control'][1], np.zeros((3,)))
    self.assertNotIn('never_seen', self.store)

  def test_round_trip_and_latest_version_wins(self):
    self.store.save('client/a b', _state(1.0), round_num=0)  # ids with '/' and spaces are quoted
    self.store.save('client/a b', _state(2.0), round_num=3)
    self._assert_state(self.store.load('client/a b'), 2.0)
    self.assertLen(self.store, 1)
    files = os.listdir(os.path.join(self.dir, 'states', 'client%2Fa%20b'))
    self.assertCountEqual(files, ['r0.npz', 'r3.npz'])  # no temporary files left

  def test_manifest_restores_a_consistent_set_and_prunes(self):
    self.store.save('a', _state(1.0), 0)
    self.store.save('b', _state(5.0), 0)
    manifest = os.path.join(self.dir, 'ckpt', 'client_states.json')
    self.store.save_manifest(manifest)
    self.store.save('a', _state(2.0), 1)  # a round that is never checkpointed
    fresh = client_state.ClientStateStore(os.path.join(self.dir, 'states'), _initial)
    np.testing.assert_array_equal(fresh.load('a')['control'][0], np.zeros((2, 3)))
    fresh.load_manifest(manifest)
    self._assert_state(fresh.load('a'), 1.0)  # the checkpoint's version, not round 1's
    self._assert_state(fresh.load('b'), 5.0)
    # A later manifest prunes versions older than the ones it references.
    self.store.save_manifest(manifest)
    self.assertCountEqual(os.listdir(os.path.join(self.dir, 'states', 'a')), ['r1.npz'])

  def test_bad_inputs(self):
    with self.assertRaisesRegex(ValueError, 'initial_fn'):
      client_state.ClientStateStore(self.dir, None)
    bad = os.path.join(self.dir, 'bad.json')
    with open(bad, 'w') as f:
      f.write('{"clients": {"x": 4}, "version": 1}')
    with self.assertRaisesRegex(ValueError, 'missing client state'):
      self.store.load_manifest(bad)
    other = client_state.ClientStateStore(os.path.join(self.dir, 'states'),
                                          lambda: np.int32(0))
    self.store.save('a', _state(1.0), 0)
    other._latest['a'] = 0  # pylint: disable=protected-access
    with self.assertRaisesRegex(ValueError, 'another algorithm'):
      other.load('a')


if __name__ == '__main__':
  absltest.main()
