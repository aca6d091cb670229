# teraio — front door.  `make demo` and `make test` do all set-up themselves.
#   make         build build/lib/libteraio.so and build/bin/teraio
#   make test    C unit tests, CLI error tests, ASan+UBSan run, fuzz smoke, pytest
#   make demo    train a real model with tensors offloaded to SSD (build/demo/)
#   make demo-sweep  the same model at capacities 0.9 .. 0.1 of its peak (build/demo-sweep/)
#   make demo-compiled  the same model compiled, with teraio's torch.compile path (build/demo-compiled/)
#   make bench   benchmarks (ratios against references measured in the same run)
#   make paper   the TERAIO paper's configurations simulated (traces cached in
#                build/paper-traces/<profile>/ by make paper-traces)
#   make test-slow  the slow tests (two-node training job in network namespaces)
SHELL := /bin/bash
PY := .venv/bin/python
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 5
CMAKE_GEN := -G Ninja

.PHONY: all deps build test test-c test-asan test-tsan test-fuzz test-python test-slow test-pip demo \
	demo-sweep demo-compiled bench paper paper-traces clean

all: build

deps:
	@scripts/deps

build: deps
	@cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

test: build test-c test-asan test-tsan test-fuzz test-python test-pip

test-c: build
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B build-asan $(CMAKE_GEN) -DTIO_SANITIZE=address,undefined >/dev/null
	@cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

# ThreadSanitizer over the modules that run threads (engine, runtime; more as they come).
TSAN_TESTS ?= engine|runtime|pager|data|tok|staging|cufile|advise
test-tsan: deps
	@cmake -S . -B build-tsan $(CMAKE_GEN) -DTIO_SANITIZE=thread -DTIO_BUILD_CLI=OFF >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	TIO_SOAK_SCALE=small ctest --test-dir build-tsan --output-on-failure -R '$(TSAN_TESTS)'

# The fuzz build is also the build without CUDA support (TIO_CUDA=OFF).
test-fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz $(CMAKE_GEN) -DTIO_FUZZ=ON -DTIO_CUDA=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/fuzz-smoke build-fuzz $(FUZZ_SECONDS) $(JOBS)

# One pytest worker per core (pytest-xdist), the longest tests spread by work stealing.
test-python: build
	$(PY) -m pytest -q -rs -n $(JOBS) --dist worksteal tests/python

# Slow tests (also part of `make test` when TERAIO_SLOW=1).
test-slow: build
	TERAIO_SLOW=1 $(PY) -m pytest -q -rs tests/python/test_dist_two_nodes.py

# `pip install .` into a fresh venv: import teraio and the teraio command work.
test-pip: deps
	@scripts/test-pip

demo: build
	$(PY) -m teraio.demo --out build/demo

# The same model trained with torch.compile, with and without teraio's compiled path (minutes: compiling).
demo-compiled: build
	$(PY) -m teraio.demo --compile --out build/demo-compiled

# The capacity sweep: 0.9 .. 0.1 of the peak (a few minutes); sweep.md is the README's table.
demo-sweep: build
	$(PY) -m teraio.demo --sweep --out build/demo-sweep

bench: build
	@scripts/bench

PAPER_HW ?= hw/h100-nvl-paper.conf
PAPER_TRACES := build/paper-traces/$(basename $(notdir $(PAPER_HW)))

paper-traces: build
	$(PY) -m teraio.paper trace $(PAPER_TRACES) --hw $(PAPER_HW)

paper: paper-traces
	build/bin/teraio eval paper --traces $(PAPER_TRACES)

clean:
	rm -rf build build-asan build-fuzz
