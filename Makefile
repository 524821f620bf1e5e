# Two commands do everything on a fresh Debian machine with Python 3.11:
#   make train   set up, then run the main job (bazel run //bin:train; pass flags with ARGS="...")
#   make test    set up (and test-system-packages: Chromium), then run the whole test suite
#                (bazel test //...; among them tests/wheel_test.py: the wheel built, installed in a
#                scratch venv and run from outside the checkout)
#   make wheel   the wheel and the sdist into dist/
# `make setup` alone installs system packages (apt), creates .venv, installs the pinned lock and
# builds the library that keeps TFF's worker on loopback where it cannot have a network namespace
# of its own (`unshare`, util-linux: tff_decorr/worker/netns.py, loopback.py).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The interpreter that creates the venv: Python 3.11 is required by TFF 0.87 / TF 2.14.
PYTHON311 ?= $(shell command -v python3.11 || command -v python3)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP := $(VENV)/.requirements.sha256
# An OpenSSH server for tests/ssh_tunnel_test.py, unpacked from Debian's package, never installed.
OPENSSH := $(VENV)/opt/openssh
ARGS ?=
BAZEL_TEST_ARGS ?=

.PHONY: setup system-packages test-system-packages venv train test wheel clean

setup: system-packages venv

# apt runs only when something is missing, so a second `make` takes seconds.
system-packages:
	@missing=""; \
	command -v bazel >/dev/null || missing="$$missing bazel-bootstrap"; \
	command -v cc >/dev/null || missing="$$missing gcc libc6-dev"; \
	command -v unshare >/dev/null || missing="$$missing util-linux"; \
	command -v $(firstword $(PYTHON311) python3) >/dev/null || missing="$$missing python3 python3-venv"; \
	[ -x "$(PY)" ] || $(PYTHON311) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@$(PYTHON311) -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || \
	  { echo "setup: Python 3.11 is required (TFF 0.87 supports < 3.12); set PYTHON311=/path/to/python3.11" >&2; exit 1; }

# What only the tests need, not training: a browser for tests/report_test.py, which renders
# bin/report's page in headless Chromium, and OpenSSH for tests/ssh_tunnel_test.py.
test-system-packages:
	@missing=""; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="$$missing chromium"; \
	command -v ssh >/dev/null || missing="$$missing openssh-client"; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing test system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@# sshd for the tunnel test: the package's files only (installing openssh-server would start a
	@# system sshd on every interface's port 22); libwrap0 is the one library it needs that a
	@# Debian base lacks.
	@[ -x $(OPENSSH)/usr/sbin/sshd ] || { \
	  d=$$(mktemp -d); \
	  (cd $$d && apt-get download -qq openssh-server libwrap0 2>/dev/null) || \
	    { $(SUDO) apt-get update -qq && (cd $$d && apt-get download -qq openssh-server libwrap0 2>/dev/null); }; \
	  mkdir -p $(OPENSSH); for f in $$d/*.deb; do dpkg-deb -x $$f $(OPENSSH); done; rm -rf $$d; \
	  if [ -x $(OPENSSH)/usr/sbin/sshd ]; then echo "setup: unpacked sshd into $(OPENSSH)"; else \
	    echo "setup: could not download openssh-server and libwrap0 with apt-get download" \
	      "(tests/ssh_tunnel_test.py needs them): check apt's sources" >&2; exit 1; fi; }

# The lock is installed with --no-deps: pip's resolver cannot satisfy TFF 0.87's own pins
# (jaxlib 0.4.14 is gone from the index; protobuf constraints conflict), see requirements.txt.
venv:
	@[ -x "$(PY)" ] || { echo "setup: creating $(VENV)"; $(PYTHON311) -m venv $(VENV); }
	@want=$$(sha256sum requirements.txt | cut -d' ' -f1); \
	if [ "$$(cat $(STAMP) 2>/dev/null)" != "$$want" ]; then \
	  echo "setup: installing pinned packages (about 1-2 minutes)"; \
	  $(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements.txt && \
	  $(PY) -c 'import importlib.util as u, tensorflow, tensorflow_datasets, matplotlib; assert u.find_spec("tensorflow_federated")' && \
	  echo "$$want" > $(STAMP); \
	else echo "setup: $(VENV) is up to date"; fi
	@# The library that keeps TFF's worker on loopback (tff_decorr/worker/loopback.py).
	@$(PY) -m tff_decorr.worker.loopback >/dev/null

train: setup
	bazel run //bin:train -- $(ARGS)

# The wheel and the sdist into dist/ (pyproject.toml; README, "Use it in your own environment").
# `make test` checks them: tests/wheel_test.py builds both from a copy of the checkout, installs the
# wheel into a scratch venv (the lock from this venv, --no-deps) and, from outside the checkout,
# imports it and trains one round with its console script.
# build/ goes first: setuptools copies into it and never deletes, so a module removed since the
# last build would still be packaged.
wheel: venv
	rm -rf build
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w dist .
	$(PY) -c 'from setuptools import build_meta as b; print("dist/" + b.build_sdist("dist"))'

# Bazel's own summary is not a line CI tools read, so the line after it restates it as
# "N passed, N failed" (counted from Bazel's per-target result lines); then tools/count_skips.py
# prints the number of skipped tests and fails the target unless it is 0 (a test may skip only
# for what no machine here has, a GPU: testutil.skip_without_gpu).
test: setup test-system-packages
	@set -o pipefail; bazel test //... $(BAZEL_TEST_ARGS) 2>&1 | tee .bazel-test.log; rc=$$?; \
	passed=$$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' .bazel-test.log); \
	failed=$$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' .bazel-test.log); \
	echo "bazel test: $$passed passed, $$failed failed"; \
	$(PY) -m tools.count_skips --bazel_log=.bazel-test.log bazel-testlogs || rc=1; exit $$rc

clean:
	bazel clean
	rm -rf $(VENV) .bazel-test.log build dist tff_decorr.egg-info
