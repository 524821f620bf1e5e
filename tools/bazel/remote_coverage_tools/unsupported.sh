#!/bin/sh
echo "bazel coverage is not available offline in this project; use 'bazel test'." >&2
exit 1
