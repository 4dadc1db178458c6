# loopscope: two commands on a fresh clone.
#   make demo   install everything, run a short control-loop experiment across four
#               network-namespace hosts (as root; otherwise the one-host noise lab)
#   make test   install everything, run the Rust and Python tests
# Everything installs into ./.venv (Python) and ./target (Rust); Debian
# packages the tests and benchmarks compare against come from
# scripts/install-deps.sh (needs root; without it, the affected tests skip).

VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
CARGO   ?= cargo
CDIR    := python/loopscope/_c

.PHONY: all install deps build clib demo test test-rust test-python bench clean

all: install

deps:
	@scripts/install-deps.sh

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.pydeps: pyproject.toml | $(PY)
	$(PIP) install --quiet "maturin>=1.7,<2" numpy polars pyarrow click rich pydantic pyyaml scipy jinja2 matplotlib asyncssh perfetto protobuf pytest hypothesis ruff selenium jsonschema import-linter
	touch $@

# The C library and header C programs link against, inside the package.
clib:
	@echo "building libloopscope (C API) …"
	@$(CARGO) build --release --quiet -p loopscope-capi
	@mkdir -p $(CDIR)/lib $(CDIR)/include
	@cp target/release/libloopscope.a target/release/libloopscope.so $(CDIR)/lib/
	@cp include/loopscope.h $(CDIR)/include/

build: $(VENV)/.pydeps clib
	@echo "building loopscope._native (cargo --release) and installing the package into $(VENV) …"
	@VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH \
		$(VENV)/bin/maturin develop --release --extras test > $(VENV)/build.log 2>&1 \
		|| { tail -40 $(VENV)/build.log; echo "loopscope: error: building the Python package failed; full log: $(VENV)/build.log"; exit 1; }
	@$(PY) -c "import loopscope._native" || { echo "loopscope: error: loopscope._native does not import; see $(VENV)/build.log"; exit 1; }

install: deps build

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

test-rust:
	$(CARGO) test --release --quiet -p loopscope-trace -p loopscope-probes -p loopscope-loads -p loopscope-netem -p loopscope-channels -p loopscope-ktrace -p loopscope-capi -p loopscope-os

test-python:
	$(VENV)/bin/ruff check --quiet python tests
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/pytest -q --durations=12

test: install test-rust test-python

bench: install
	$(VENV)/bin/loopscope bench trace
	$(VENV)/bin/loopscope bench timer
	$(VENV)/bin/loopscope bench emulator

clean:
	rm -rf $(VENV) target $(CDIR) python/loopscope/_native*.so
