# tessera's front door. `make train` and `make test` install what is missing (scripts/install.sh,
# idempotent), configure and build, then train or test.
SHELL := /bin/bash
BUILD ?= build
RUN ?= runs/tiny_gpt
CONFIG ?= configs/tiny_gpt.toml
DATA ?= $(BUILD)/data/kjv
JOBS ?= $(shell nproc)

.PHONY: deps build build-tessera train test test-sanitize test-tsan fuzz bench fault-matrix clean

deps:
	@bash scripts/install.sh

$(BUILD)/build.ninja:
	@venv="$$(bash scripts/install.sh | tee /dev/stderr | sed -n 's/^TESSERA_VENV=//p')" && \
	cmake -S . -B $(BUILD) -G Ninja -DTESSERA_PYTHON=$$venv/bin/python

build: $(BUILD)/build.ninja
	@bash scripts/install.sh >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Only the `tessera` binary and the libraries it links: what `make train` needs (the tests are built
# by `make test` / `make build`, libFuzzer's targets by `make fuzz`, the benchmark programs by `make bench`).
build-tessera: $(BUILD)/build.ninja
	@bash scripts/install.sh >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target tessera

$(DATA)/train.bin: | build-tessera
	@$(BUILD)/tessera prepare --input data/kjv/genesis_to_ruth.txt --out $(DATA) --tokenizer byte

train: build-tessera $(DATA)/train.bin
	@$(BUILD)/tessera train --config $(CONFIG) --set data.path=$(DATA) --out $(RUN) --overwrite
	@$(BUILD)/tessera generate --checkpoint $(RUN) --prompt "And God said" --max-tokens 300 --seed 1
	@echo "loss curves: $$(python3 scripts/plot_losses.py $(RUN) --out $(RUN)/loss.svg --title '$(RUN)')"

# CTest's output is kept in $(BUILD)/ctest.log; its ten slowest tests are printed at the end.
# DefaultRun checks the run `make train` left in $(RUN) when that is the default run of this build's
# binary (tests/cli/test_cli.cpp says why not, and then trains it itself).
# CTest runs JOBS + 2 entries at once: fewer leave the cores idle (timeouts, sleeping ranks and
# peers, process starts). On 2 cores, 2026-12-04 (195 entries, after `make train`): 368 s for the
# suite at -j3 (1.68 cores busy), 291 s at -j4, 317 s at -j5 (earlier, 2026-11-30: 330 s at -j2,
# 277 s at -j3, 259 s at -j4). The entries that time themselves run alone (RUN_SERIAL).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) + 2 )))
test: build
	@cd $(BUILD) && set -o pipefail && TESSERA_DEFAULT_RUN=$(abspath $(RUN)) ctest -j $(TEST_JOBS) --output-on-failure 2>&1 | tee ctest.log; status=$$?; \
	  python3 $(CURDIR)/scripts/slowest_tests.py ctest.log; exit $$status

# libFuzzer's coverage-guided runs of every fuzz target (tests/fuzz/run.sh: clang with ASan and UBSan,
# at -O0, in build/fuzz/O0/), FUZZ_SECONDS each from its seed corpus; findings stop it. `make test`
# replays the same targets' corpora with mutants in its own build instead (tests/fuzz/replay.cpp):
# libFuzzer's clang build of them cost a bare machine's first `make test` about 80 s of its 10 minutes.
FUZZ_SECONDS ?= 3
fuzz:
	@bash scripts/install.sh >/dev/null
	@TESSERA_FUZZ_OPT=-O0 tests/fuzz/run.sh --build
	@for target in $$(tests/fuzz/run.sh --list); do \
	  TESSERA_FUZZ_OPT=-O0 tests/fuzz/run.sh $$target 1000000 $(FUZZ_SECONDS) || exit 1; done

# The in-process unit and distributed tests built with AddressSanitizer and UndefinedBehaviorSanitizer
# (CMakeLists.txt, TESSERA_SANITIZE) in their own build folder; any finding fails its test.
SANITIZE_BUILD ?= build-sanitize
# Reports go to files (log_path), printed after CTest's summary when a test failed
# (scripts/sanitizer_reports.sh): a report inside a worker's log of a multi-process test would be
# cut from the output CI keeps.
SANITIZE_REPORTS = $(CURDIR)/$(SANITIZE_BUILD)/sanitizer-reports
SANITIZE_OPTIONS ?= ASAN_OPTIONS=detect_leaks=0:strict_init_order=1:log_path=$(SANITIZE_REPORTS)/asan \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(SANITIZE_REPORTS)/ubsan
$(SANITIZE_BUILD)/build.ninja:
	@venv="$$(bash scripts/install.sh | sed -n 's/^TESSERA_VENV=//p')" && \
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DTESSERA_PYTHON=$$venv/bin/python -DTESSERA_SANITIZE=ON

test-sanitize: $(SANITIZE_BUILD)/build.ninja
	@bash scripts/install.sh >/dev/null
	@cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	@rm -rf $(SANITIZE_REPORTS) && mkdir -p $(SANITIZE_REPORTS)
	@cd $(SANITIZE_BUILD) && env $(SANITIZE_OPTIONS) ctest -j $(JOBS) --output-on-failure || \
	  { bash $(CURDIR)/scripts/sanitizer_reports.sh $(SANITIZE_REPORTS); exit 1; }

# ThreadSanitizer over the tests of tessera's own threads (CMakeLists.txt, tests/CMakeLists.txt:
# THREADS). Not part of make test (its build is a third one of the sources). Reports do not stop
# their process; after CTest, scripts/tsan_reports.py fails the run on every report it cannot prove
# lies inside OpenDHT (the one race a suppression cannot name without hiding tessera's callbacks).
TSAN_BUILD ?= build-tsan
TSAN_REPORTS = $(CURDIR)/$(TSAN_BUILD)/sanitizer-reports
TSAN_RUN_OPTIONS ?= TSAN_OPTIONS=halt_on_error=0:exitcode=0:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp:log_path=$(TSAN_REPORTS)/tsan
$(TSAN_BUILD)/build.ninja:
	@venv="$$(bash scripts/install.sh | sed -n 's/^TESSERA_VENV=//p')" && \
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DTESSERA_PYTHON=$$venv/bin/python -DTESSERA_TSAN=ON

test-tsan: $(TSAN_BUILD)/build.ninja
	@bash scripts/install.sh >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	@cd $(TSAN_BUILD) && env $(TSAN_RUN_OPTIONS) ctest -j $(JOBS) --output-on-failure; status=$$?; \
	  python3 $(CURDIR)/scripts/tsan_reports.py $(TSAN_REPORTS) || status=1; exit $$status

bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target bench-tools
	@bash bench/run_all.sh $(BUILD)

# Every cell of the fault matrix (tests/cli/test_fault_matrix.cpp; make test runs one cell per kind
# of failure, tests/cli/CMakeLists.txt), about 15 minutes on 2 cores, then its tables
# (docs/reliability.md).
FAULT_RESULTS ?= $(BUILD)/fault_matrix.jsonl
fault-matrix: build
	@rm -f $(FAULT_RESULTS)
	@TESSERA_FAULT_MATRIX_RESULTS=$(abspath $(FAULT_RESULTS)) $(BUILD)/tests/cli/test_fault_matrix \
	  --gtest_brief=1 > $(BUILD)/fault_matrix.log 2>&1; status=$$?; \
	  python3 bench/fault_matrix_table.py $(FAULT_RESULTS); echo "log: $(BUILD)/fault_matrix.log"; exit $$status

clean:
	rm -rf $(BUILD)
