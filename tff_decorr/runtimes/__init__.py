"""The round and the runtimes that execute an algorithm's TF functions: `rounds` (one round
composed once) and its faces `tff_runtime` (TFF), `tf_runtime` (in-process) and `learning` (the
tff.learning API: a LearningProcess)."""
