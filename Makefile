# loopscope: two commands on a fresh clone.
#   make demo   install what loopscope runs with, run a short control-loop experiment
#               across four network-namespace hosts (as root; otherwise the one-host noise lab)
#   make test   install that plus the test tools and optional parts, run the Rust and Python tests
# Python packages install into ./.venv, pinned with hashes by requirements*.lock;
# the build tool into ./target/tools; Rust builds into ./target. Debian packages
# come from scripts/install-deps.sh (needs root; without it, what needs them skips).

VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
# The build tool (maturin) lives in a venv of its own: the demo's venv holds
# what loopscope runs with and nothing else.
TOOLS   := target/tools
CARGO   ?= cargo
# trace.dat v7's zstd: the system's libzstd (libzstd-dev, from install-deps.sh)
# when pkg-config finds it, else zstd-sys compiles its bundled copy, which was
# the longest step of a fresh build (59 s of 110 s here). Evaluated when each
# recipe runs, after `deps` installed it, never set empty (zstd-sys reads an
# empty value as set). Without make's own MAKEFLAGS: a cargo handed make's job
# server without its descriptors (make -j) warns that it cannot use it.
ZSTD_ENV = env -u MAKEFLAGS -u MFLAGS $$(pkg-config --exists libzstd 2>/dev/null && echo ZSTD_SYS_USE_PKG_CONFIG=1)
CDIR    := python/loopscope/_c
# Pinned, hashed Python dependencies (scripts/lock regenerates them).
PIPI    := install --quiet --disable-pip-version-check --require-hashes --no-deps

.PHONY: all install install-test install-ssh install-perfetto install-ansible deps deps-demo build clib demo test test-rust test-python tiers typecheck fmt fmt-check check bench clean

all: install

# Debian packages: the demo's few, or everything the tests and benchmarks use
# (the script prints each package it installs and why).
deps-demo:
	@scripts/install-deps.sh demo
deps:
	@scripts/install-deps.sh test

$(PY):
	python3 -m venv $(VENV)

$(VENV)/.pydeps: requirements.lock | $(PY)
	@echo "installing loopscope's Python dependencies (requirements.lock) into $(VENV) …"
	$(PIP) $(PIPI) -r requirements.lock
	touch $@

# Test tools and the optional parts (ssh, perfetto): requirements-test.lock.
$(VENV)/.testdeps: requirements-test.lock $(VENV)/.pydeps
	@echo "installing the test tools and optional parts (requirements-test.lock) into $(VENV) …"
	$(PIP) $(PIPI) -r requirements-test.lock
	touch $@

$(TOOLS)/.ok: requirements-build.lock
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip $(PIPI) -r requirements-build.lock
	touch $@

# The C library and header C programs link against, inside the package.
clib:
	@echo "building libloopscope (C API) …"
	@$(ZSTD_ENV) $(CARGO) build --release --quiet -p loopscope-capi
	@mkdir -p $(CDIR)/lib/pkgconfig $(CDIR)/include
	@cp target/release/libloopscope.a target/release/libloopscope.so $(CDIR)/lib/
	@cp include/loopscope.h $(CDIR)/include/
	@cp include/loopscope.pc $(CDIR)/lib/pkgconfig/

build: $(VENV)/.pydeps $(TOOLS)/.ok clib
	@echo "building loopscope._native (cargo --release) and installing the package into $(VENV) …"
	@VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH \
		$(ZSTD_ENV) $(TOOLS)/bin/maturin develop --release > $(VENV)/build.log 2>&1 \
		|| { tail -40 $(VENV)/build.log; echo "loopscope: error: building the Python package failed; full log: $(VENV)/build.log"; exit 1; }
	@$(PY) -c "import loopscope._native" || { echo "loopscope: error: loopscope._native does not import; see $(VENV)/build.log"; exit 1; }
	@# the package is installed editable: its bytecode is written once here, since a process
	@# started with PYTHONDONTWRITEBYTECODE set (as some CI machines do) writes none and then
	@# compiles every module it imports at every start (0.81 -> 0.65 s for the lab's imports)
	@$(PY) -m compileall -q python/loopscope > /dev/null

# `make install`: what loopscope runs with; `install-test`: and the tests'
# tools with every optional part; `install-ssh`/`install-perfetto`/`install-ansible`: one part.
install: deps-demo build
install-test: deps build $(VENV)/.testdeps
install-ssh install-perfetto install-ansible: install-%: install
	$(PIP) $(PIPI) -r requirements-$*.lock

# The main job: examples/control-loop.yaml, shortened (2 s per probe and
# phase, 2 repetitions). Network namespaces need root; without it the demo
# is the one-host noise lab.
demo: install
	@if [ "$$(id -u)" -eq 0 ]; then \
		$(VENV)/bin/loopscope run examples/control-loop.yaml --duration 2s --repetitions 2; \
	else \
		echo "loopscope: not root, so no network namespaces: running the one-host noise lab instead"; \
		$(VENV)/bin/loopscope run examples/demo.yaml; \
	fi

RUST_TESTS = --profile test-ci --quiet -p loopscope-trace -p loopscope-probes -p loopscope-loads -p loopscope-netem -p loopscope-channels -p loopscope-ktrace -p loopscope-capi -p loopscope-os

test-rust:
	$(ZSTD_ENV) $(CARGO) test $(RUST_TESTS)

# mypy, strict, on the packages pyproject.toml's [tool.mypy] lists (the
# contracts: spec, kinds, lab, analysis, the run directory, the errors).
typecheck:
	$(VENV)/bin/mypy --no-incremental

# One formatting for everything: ruff format (pyproject.toml's [tool.ruff]) and
# rustfmt (rustfmt.toml). `make fmt` formats; `make test` and `make check` fail on
# a file it would change.
fmt:
	$(VENV)/bin/ruff format --quiet python tests
	$(CARGO) fmt --all

fmt-check:
	$(VENV)/bin/ruff format --check --quiet python tests || { echo "loopscope: error: these files are not formatted; run 'make fmt'"; exit 1; }
	@if $(CARGO) fmt --version >/dev/null 2>&1; then \
		$(CARGO) fmt --all --check >/dev/null || { $(CARGO) fmt --all --check | grep '^Diff in' | head -20; echo "loopscope: error: Rust files are not formatted; run 'make fmt'"; exit 1; }; \
	else echo "loopscope: note: rustfmt is not installed (rustup component add rustfmt): the Rust formatting is not checked"; fi

# `make test`: the build, then the Rust tests (alone: one of them holds a
# pacing schedule to its median departure error, which a build beside it
# broke in a fresh clone), then the Python tests.
test: install-test test-rust test-python

test-python: typecheck fmt-check
	$(VENV)/bin/ruff check --quiet python tests
	$(VENV)/bin/lint-imports --no-cache --no-logo
	@$(MAKE) --no-print-directory tiers
	$(VENV)/bin/pytest -q --tier alone --durations=12

# The beside tier, and beside it the fast tier (its output when both end).
# (The Rust tests' build beside the beside tier saved a minute, but that
# tier's tests met it as load: an emulator rate search found nothing, and a
# preflight said another thing; the build runs before the tiers again.)
tiers:
	@echo "$(VENV)/bin/pytest -q --tier fast -n 2   (beside the beside tier; its output when both end)"
	@$(VENV)/bin/pytest -q --tier fast -n 2 > $(VENV)/fast-tier.log 2>&1 & fast=$$!; \
	echo "$(VENV)/bin/pytest -q --tier beside -n 2 --dist worksteal --durations=5"; \
	$(VENV)/bin/pytest -q --tier beside -n 2 --dist worksteal --durations=5; beside=$$?; \
	wait $$fast; fast=$$?; echo "the fast tier, run beside it:"; cat $(VENV)/fast-tier.log; \
	test $$fast -eq 0 && test $$beside -eq 0

# The fast tier, while working: lint, the import contracts, the types and the
# tests that start no lab (tests/tiers.py), on the tree `make install-test` built; it
# builds nothing. `make test` (what CI runs) before stopping.
check:
	@test -x $(VENV)/bin/pytest || { echo "loopscope: error: no test tools in $(VENV); run 'make install-test' once"; exit 2; }
	@$(MAKE) --no-print-directory fmt-check
	$(VENV)/bin/ruff check --quiet python tests
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/mypy --no-incremental
	$(VENV)/bin/pytest -q --tier fast -n 2 --durations=5

bench: install
	$(VENV)/bin/loopscope bench trace
	$(VENV)/bin/loopscope bench timer
	$(VENV)/bin/loopscope bench emulator

clean:
	rm -rf $(VENV) target $(CDIR) python/loopscope/_native*.so
