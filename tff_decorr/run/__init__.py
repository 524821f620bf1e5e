"""The paths of before the training program was named tff_decorr.program.

Deprecated; removed in 0.4.0 (CHANGELOG.md). Each module here is the module of the same name in
tff_decorr.program (`tff_decorr.run.composition` is `tff_decorr.program.experiment`); importing
one warns once, naming the new path. "run" now means one thing: one training run and its directory
(docs/DESIGN.md, "Words").
"""
