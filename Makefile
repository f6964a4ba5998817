# luce: `make serve` serves the default model, `make test` runs the tests. Both install what
# they need into .venv first (Python 3.10+ and a C compiler are the only prerequisites).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.luce-installed
PYTEST_ARGS ?=
# `make test` runs the tests file by file over this many processes (pytest-xdist; `auto`: one a
# core): a single process used one of a 2-core machine's cores for ~9 of make test's ~20 minutes.
# A file's tests share one process, so a module's emulated kernel library is built once. At most
# PYTEST_MAX_JOBS processes under `auto` (each holds its tiny models and emulator libraries).
PYTEST_JOBS ?= auto
PYTEST_MAX_JOBS ?= 8
KERNEL_BENCH_ARGS ?=
# clang for the HIP build check (tools/build_check.py); `make hip-toolchain` installs it with
# what the check links against (hip/hip_build.py --missing-apt names the Debian packages).
HIP_CLANG ?= clang++-22
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: all install build test test-real test-gpu models serve bench clean compile-check hip-toolchain cross-headers cuda-deps cuda-toolchain

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): setup.py pyproject.toml | $(PY)
	$(PY) -m pip install -q "cython>=3.0" "numpy>=1.24" "setuptools>=64" wheel
	LUCE_EDITABLE_NO_BUILD=1 $(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@

install: $(STAMP)

# Rebuilds the Cython extension and, when nvcc exists, the CUDA kernel library for the local GPU
# (incremental; tools/cuda_build.py).
build: $(STAMP) cuda-toolchain
	$(PY) setup.py -q build_ext --inplace

# Only when nvidia-smi lists a GPU: nvcc from the CUDA wheels of the driver's version when there is
# no toolkit, and cuda-python, into .venv (tools/cuda_build.py ensure; nothing without a GPU).
cuda-toolchain: $(STAMP)
	@$(PY) tools/cuda_build.py ensure

test: build compile-check
	$(PY) tools/check_tree.py
	$(PY) -m pytest -q -m "not real" -n $(PYTEST_JOBS) --maxprocesses $(PYTEST_MAX_JOBS) --dist loadfile $(PYTEST_ARGS) tests

# No literal warp width; the HIP library builds and links for $(HIP_CHECK_ARCHS) (clang-22
# on stand-in headers, no ROCm or AMD GPU needed), exports every entry point of cuda/luce_ops*.h,
# has every kernel in each arch's code object and loads; when nvcc exists, every kernel compiles
# to device code for sm_86/sm_89/sm_90/sm_120 and the library from `build` exports every entry
# point. Objects are cached in build/hip_check/, CUDA passes in build/cuda_check/.
# RDNA3 (gfx1100) by default: gfx1151 (RDNA3.5) and gfx1201 (RDNA4) compile the same source (no
# arch-specific code in cuda/ or hip/) and each cost `make test` 2-5 minutes more on a 2-core
# machine (gfx1201: 2.3 minutes, which took a clean clone's `make test` past 20 minutes in session
# 17); `make compile-check HIP_CHECK_ARCHS="gfx1100;gfx1151;gfx1201"` checks them all (a HIP
# build itself takes LUCE_HIP_ARCHS, all three by default).
HIP_CHECK_ARCHS ?= gfx1100
compile-check: build hip-toolchain cross-headers
	LUCE_HIP_ARCHS="$(HIP_CHECK_ARCHS)" $(PY) tools/build_check.py --clang $(HIP_CLANG) -j 2
	$(PY) tools/cpu_cross_check.py --clang $(subst clang++,clang,$(HIP_CLANG))

# aarch64 C headers for the cpu backend's cross-compile check (tools/cpu_cross_check.py)
cross-headers:
	@test -f /usr/aarch64-linux-gnu/include/stdlib.h || { \
	  echo "luce: installing libc6-dev-arm64-cross for the aarch64 check of the cpu kernels"; \
	  $(SUDO) apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends libc6-dev-arm64-cross >/dev/null; }

hip-toolchain:
	@pkgs="$$(HIP_CLANG=$(HIP_CLANG) $(PYTHON) hip/hip_build.py --missing-apt)"; \
	if [ -n "$$pkgs" ]; then \
	  echo "luce: installing $$pkgs for the HIP build check"; \
	  $(SUDO) apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$pkgs >/dev/null; fi

test-real: build models
	$(PY) -m pytest -q -m real $(PYTEST_ARGS) tests

test-gpu: build cuda-deps
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS) tests

models: $(STAMP)
	$(PY) tools/fetch_models.py

serve: build models
	$(VENV)/bin/luce-serve

# Kernel benchmarks at Qwen3.6-27B shapes (tools/bench.py; KERNEL_BENCH_ARGS="--json" etc.).
bench: build cuda-deps
	$(PY) tools/bench.py $(KERNEL_BENCH_ARGS)

# cuda-python for device memory and graphs (GPU tests, bench); CuPy, if present, adds GEMM ceilings.
cuda-deps: $(STAMP)
	@$(PY) -c "import cuda.bindings" 2>/dev/null || $(PY) -m pip install -q "cuda-python>=12.6"

clean:
	rm -rf build luce/lib luce/*.so luce/_cuda*.c *.egg-info

# CPU benchmark beside llama.cpp (tools/bench_cpu.py; docs/PERF.md): the peer runs from a venv of
# the prebuilt xllamacpp wheel (made here on first use) and ../shared/peers/cpu_llamacpp.py.
PEER_VENV ?= .peer
CPU_BENCH_ARGS ?=
.PHONY: bench-cpu peer-cpu
$(PEER_VENV)/.installed:
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q xllamacpp==2026.10.11549
	touch $@

peer-cpu: $(PEER_VENV)/.installed

bench-cpu: build models peer-cpu
	$(PY) tools/bench_cpu.py --peer-python $(PEER_VENV)/bin/python $(CPU_BENCH_ARGS)

# Serving benchmark against a running OpenAI-compatible server (docs/BENCHMARKS.md), e.g.
#   make bench-serving BENCH_ARGS="--url http://127.0.0.1:8080 --plot /tmp/bench.png"
BENCH_ARGS ?= --url http://127.0.0.1:8080
.PHONY: bench-serving
$(VENV)/.luce-bench-installed: $(STAMP)
	$(PY) -m pip install -q --no-build-isolation -e ".[bench]"
	touch $@

bench-serving: $(VENV)/.luce-bench-installed
	$(PY) tools/bench_serving.py $(BENCH_ARGS)

# Decode benchmark on synthetic weights at Qwen3.6-27B shape (tools/bench_decode.py, docs/PERF.md):
#   make bench-decode SYNTH_MIX=q4_k_m DECODE_BENCH_ARGS="--sections ar,verify --json /tmp/d.json"
SYNTH_DIR ?= $(HOME)/.cache/luce/synthetic
SYNTH_MIX ?= iq4_xs
DECODE_BENCH_ARGS ?=
.PHONY: bench-decode
$(SYNTH_DIR)/qwen36-27b-%.gguf: | $(STAMP)
	@mkdir -p $(SYNTH_DIR)
	$(PY) tools/make_synthetic_model.py qwen36-27b $@ --mix $*

$(SYNTH_DIR)/dflash-27b-for-%.gguf: $(SYNTH_DIR)/qwen36-27b-%.gguf
	$(PY) tools/make_synthetic_model.py dflash-27b $@ --target $<

bench-decode: build cuda-deps $(SYNTH_DIR)/qwen36-27b-$(SYNTH_MIX).gguf $(SYNTH_DIR)/dflash-27b-for-$(SYNTH_MIX).gguf
	$(PY) tools/bench_decode.py $(word 3,$^) --backend cuda --draft $(word 4,$^) $(DECODE_BENCH_ARGS)
