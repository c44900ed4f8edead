# arena - build, test and install. 'make help' lists the targets.
#
# Variables: BUILD (build folder, default build), V=1 (show commands),
# SAN=1 (AddressSanitizer + UBSan; SAN=thread: ThreadSanitizer), WERROR=1 (warnings are errors),
# CUDA_HOME (CUDA toolkit with nvcc, default /usr/local/cuda; CUDA=0 disables),
# PREFIX (install prefix, default /usr/local), FUZZ_TIME (seconds, make fuzz).

BUILD    ?= build
comma    := ,
PREFIX   ?= /usr/local
CC       ?= cc
PYTHON   ?= python3
CUDA_HOME ?= /usr/local/cuda
FUZZ_TIME ?= 60

ifeq ($(V),1)
Q :=
else
Q := @
endif

CFLAGS   ?= -O2 -g
WARN     := -Wall -Wextra -Wshadow -Wpointer-arith -Wformat=2 -Wstrict-prototypes \
            -Wmissing-prototypes -Wundef -Wcast-qual -Wno-unused-parameter
# -fvisibility=hidden: libarena.so exports what include/arena.h marks ARENA_API, nothing else.
CFLAGS   += -std=c11 -fPIC -pthread -fvisibility=hidden $(WARN)
# The libraries arena links: the system's (Debian's -dev packages) unless
# given; `make wheel` (scripts/wheel.sh) gives static builds of their sources
# (DEP_CPPFLAGS, DEP_LIBS), a C++ runtime of its toolchain's (CXX_LIBS) and
# DEPS_CHECK=0 (no probe of the system's packages).
DEP_CPPFLAGS ?=
DEP_LIBS ?= -ljansson -lxxhash -lzstd
CXX_LIBS ?= -lstdc++
DEPS_CHECK ?= 1
# libarena.so exports nothing of the libraries linked into it (GNU ld's flag;
# the wheel's linker takes scripts/libarena.ver instead).
SO_EXPORTS ?= -Wl,--exclude-libs,ALL
CPPFLAGS += -D_GNU_SOURCE -Iinclude $(DEP_CPPFLAGS) -MMD -MP
LDLIBS   := $(DEP_LIBS) -lpthread -lm -ldl
ifeq ($(WERROR),1)
CFLAGS   += -Werror
endif
ifeq ($(SAN),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=address,undefined
endif
ifeq ($(SAN),thread)
CFLAGS   += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS  += -fsanitize=thread
endif

# --- CUDA probe ------------------------------------------------------------
HAVE_CUDA :=
ifneq ($(CUDA),0)
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
ifneq ($(wildcard $(CUDA_HOME)/lib64/libcudart_static.a),)
ifneq ($(wildcard $(CUDA_HOME)/bin/nvcc),)
HAVE_CUDA := 1
endif
endif
endif
endif
ifeq ($(HAVE_CUDA),1)
# The runtime is linked statically: binaries need only the driver at run time
# and say "no CUDA device" on a machine without one. The kernels' host code
# is C++ (nvcc's launch stubs use thread-safe statics): -lstdc++.
CPPFLAGS += -DARENA_HAVE_CUDA -isystem $(CUDA_HOME)/include
LDLIBS   += $(CUDA_HOME)/lib64/libcudart_static.a -ldl -lrt $(CXX_LIBS)
CUDA_MSG := CUDA backend: built with $(CUDA_HOME) (static runtime)
# Kernels (device/*.cu): sm_90 (H100, H200) and sm_80 code, plus compute_80 PTX
# that the driver compiles for newer GPUs.
NVCC      := $(CUDA_HOME)/bin/nvcc
NVCCFLAGS := -O2 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -MMD -MP \
             -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=[sm_80,compute_80] \
             -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
ifeq ($(WERROR),1)
NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
endif
else ifeq ($(CUDA),0)
CUDA_MSG := CUDA backend: not built (CUDA=0)
else
CUDA_MSG := CUDA backend: not built (no $(CUDA_HOME)/include/cuda_runtime.h, lib64/libcudart_static.a and bin/nvcc; set CUDA_HOME)
endif
ifeq ($(MAKELEVEL),0)
ifeq ($(filter help clean deps,$(MAKECMDGOALS)),)
$(info arena: $(CUDA_MSG))
endif
endif

# --- sources ----------------------------------------------------------------
LIB_SRC  := $(wildcard common/*.c formats/*.c convert/*.c device/*.c engine/*.c runtime/*.c)
CU_SRC   :=
ifeq ($(HAVE_CUDA),1)
CU_SRC   := $(wildcard device/*.cu)
else
LIB_SRC  := $(filter-out %_cuda.c,$(LIB_SRC))
endif
CLI_SRC  := $(wildcard cli/*.c)
UNIT_SRC := $(wildcard tests/unit/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_OBJ := $(UNIT_SRC:%.c=$(BUILD)/obj/%.o)
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

ifeq ($(DEPS_CHECK),0)
DEPS_OK  :=
else
DEPS_OK  := $(BUILD)/.deps-ok
endif

.PHONY: all lib cli examples wheel test-wheel unit test check test-unit test-cli test-api test-python test-asan test-tsan tsan-run test-fuzz demo fuzz install clean help deps
.DEFAULT_GOAL := all

all: cli lib examples
cli: $(BUILD)/arena
lib: $(BUILD)/libarena.a $(BUILD)/libarena.so
# examples/stream.c: a program of a user's, built against arena.h and
# libarena.so alone (tests/api/run.sh runs it).
examples: $(BUILD)/examples/stream
$(BUILD)/examples/stream: examples/stream.c include/arena.h $(BUILD)/libarena.so
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -std=c11 $(WARN) $(if $(filter 1,$(WERROR)),-Werror) -Iinclude $(LDFLAGS) -o $@ $< \
		-L$(BUILD) -l:libarena.so -Wl,-rpath,'$$ORIGIN/..' -pthread

help:
	@echo "arena make targets:"
	@echo "  make            build $(BUILD)/arena, $(BUILD)/libarena.a, $(BUILD)/libarena.so,"
	@echo "                  $(BUILD)/examples/stream (examples/stream.c)"
	@echo "  make demo       the main job on a small Flux-shaped model, in a fresh $(BUILD)/demo:"
	@echo "                  synth it, convert it to an image (plain, hb4, zstd), verify, inspect,"
	@echo "                  load it measured, plan it for a small device and run it there"
	@echo "                  streamed (bench stream: a trace and a plan picture), export it"
	@echo "                  back to safetensors, byte for byte"
	@echo "  make wheel      the self-contained wheel (manylinux_2_28) in $(BUILD)/wheel/dist"
	@echo "  make test-wheel the wheel installed into a venv without build tools, and run"
	@echo "  make test       unit, CLI and Python interop tests, fuzz corpus replay, then"
	@echo "                  unit tests and fuzz corpus again under ASan/UBSan, threads under TSan,"
	@echo "                  then the wheel (make test-wheel)"
	@echo "  make check      the quick tier for the edit loop (2 to 3 minutes on 2 cores): unit, CLI,"
	@echo "                  API and Python tests without the cases marked slow; no sanitizers,"
	@echo "                  fuzz replay or wheel"
	@echo "  make fuzz       run the libFuzzer targets for FUZZ_TIME seconds each (clang)"
	@echo "  make bench      bench/'s C programs: dequant_rules (CUDA), codec_bench (make bench-cpu: it alone)"
	@echo "  make install    install CLI, library, header, pkg-config file under PREFIX"
	@echo "  make deps       install missing Debian build dependencies (as root)"
	@echo "  make clean      remove build folders"
	@echo "variables: V=1 SAN=1 WERROR=1 BUILD=dir CUDA_HOME=dir CUDA=0 PREFIX=dir FUZZ_TIME=s"

deps $(DEPS_OK): scripts/deps.sh
	$(Q)CC="$(CC)" sh scripts/deps.sh
	$(Q)mkdir -p $(BUILD) && touch $(BUILD)/.deps-ok

# Objects are rebuilt when the compiler or its flags change (SAN=1, WERROR=1,
# CUDA=0 ... into the same BUILD): the command line is kept in a stamp.
FLAGS_STAMP := $(BUILD)/.flags
FLAGS_LINE := $(CC) $(CPPFLAGS) $(CFLAGS) | $(NVCC) $(NVCCFLAGS)
.PHONY: FORCE
$(FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP) | $(DEPS_OK)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libarena.a: $(LIB_OBJ)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/libarena.so: $(LIB_OBJ)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libarena.so.0 $(SO_EXPORTS) $(LDFLAGS) -o $@ $^ $(LDLIBS)
	$(Q)ln -sf libarena.so $(BUILD)/libarena.so.0

$(BUILD)/arena: $(CLI_OBJ) $(BUILD)/libarena.a
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libarena.a $(LDLIBS)

$(BUILD)/tests/unit: $(UNIT_OBJ) $(BUILD)/libarena.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $(UNIT_OBJ) $(BUILD)/libarena.a -lcriterion $(LDLIBS)

# Fuzz targets as corpus replayers: a plain main() that runs every file.
$(BUILD)/tests/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(BUILD)/libarena.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The C programs bench/RESULTS.md cites: bench/codec_bench.c (the chunk codecs
# on an image's data, one thread; no GPU) and, with CUDA, bench/dequant_rules.c
# (the device's dequantization against the element rules, every source value).
.PHONY: bench bench-cpu
bench-cpu: $(BUILD)/bench/codec_bench
ifeq ($(HAVE_CUDA),1)
bench: bench-cpu $(BUILD)/bench/dequant_rules
else
bench:
	@echo "make bench: needs CUDA; $(CUDA_MSG) ('make bench-cpu' builds codec_bench)" >&2; exit 1
endif
$(BUILD)/bench/%: bench/%.c $(BUILD)/libarena.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libarena.a $(LDLIBS)

unit: $(BUILD)/tests/unit $(BUILD)/arena $(FUZZ_TARGETS:%=$(BUILD)/tests/replay_%)

ifeq ($(SAN),1)
RUNCHECK := sh scripts/sancheck.sh
endif

# Each test section prints one line per test and, when it passes, leaves what
# it checked in $(SUMMARY)/<section> (and what it skipped, and why, in
# <section>.skipped): 'test' prints them as its last line (tests/summary.sh).
SUMMARY := $(BUILD)/test-summary

test-unit: unit
	$(Q)sh tests/unit/run.sh $(BUILD) $(RUNCHECK)

# CLI_CPP: the preprocessor with the build's flags, which tests/cli/t_docs.sh
# reads the commands' option tables with.
test-cli: cli
	$(Q)mkdir -p $(SUMMARY)
	$(Q)CLI_CPP="$(CC) -E $(filter-out -MMD -MP,$(CPPFLAGS))" sh tests/cli/run.sh $(BUILD)/arena $(SUMMARY)/cli

# The public API alone: a program built against arena.h, linked to libarena.so
# only; and (not under a sanitizer) `make install` into a folder, a program
# built there with pkg-config's flags, dynamic and static (tests/api/install.sh).
test-api: cli lib
	$(Q)mkdir -p $(BUILD)/tests
	$(Q)CC="$(CC)" sh tests/api/run.sh $(BUILD) $(if $(filter 1,$(SAN)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer)
ifeq ($(SAN),)
	$(Q)CC="$(CC)" MAKE="$(MAKE)" sh tests/api/install.sh $(BUILD) $(if $(filter 1,$(WERROR)),WERROR=1)
endif

# tests/python/run_torch.sh exits 77 when it skips (torch, diffusers and peft
# cannot be installed in $(BUILD)/venv-torch) and leaves the reason in
# $(SUMMARY)/torch.skipped; tests/python/run.sh likewise, for the reference
# packages, in $(SUMMARY)/python.skipped. run_torch.sh first: run.sh's int4
# checks use the torch it installs. On a failure of the adapter's tests their
# reports ($(SUMMARY)/torch.failed) are printed again last.
test-python: cli lib
	$(Q)rc=0; \
	sh tests/python/run_torch.sh $(BUILD) || { r=$$?; [ $$r = 77 ] && [ -s $(SUMMARY)/torch.skipped ] || rc=1; }; \
	sh tests/python/run.sh $(BUILD) || { r=$$?; [ $$r = 77 ] && [ -s $(SUMMARY)/python.skipped ] || rc=1; }; \
	[ $$rc = 0 ] || [ ! -s $(SUMMARY)/torch.failed ] || { echo "--- the adapter's failures again:"; cat $(SUMMARY)/torch.failed; }; \
	exit $$rc

test-fuzz: unit
	$(Q)mkdir -p $(SUMMARY); rm -f $(SUMMARY)/fuzz; n=0; \
	for t in $(FUZZ_TARGETS); do \
		out=$$($(RUNCHECK) $(BUILD)/tests/replay_$$t tests/fuzz/corpus/$$t) || { echo "$$out"; \
			echo "fuzz: replaying tests/fuzz/corpus/$$t failed"; exit 1; }; \
		echo "$$out" | sed "s|^replayed|fuzz: tests/fuzz/corpus/$$t: replayed|"; \
		i=$$(echo "$$out" | sed -n 's/^replayed \([0-9]*\) inputs$$/\1/p'); n=$$((n + $${i:-0})); done; \
	echo "fuzz $$n inputs ($(words $(FUZZ_TARGETS)) corpora)" >$(SUMMARY)/fuzz

test-asan:
	$(Q)mkdir -p $(SUMMARY); rm -f $(SUMMARY)/asan $(SUMMARY)/asan.skipped
	$(Q)$(MAKE) --no-print-directory BUILD=$(BUILD)/asan SAN=1 CUDA=0 test-unit test-api test-fuzz
	$(Q)a=$(BUILD)/asan/test-summary; \
	echo "ASan/UBSan ($$(cat $$a/unit), $$(sed 's/ + .*//' $$a/api), $$(sed 's/ (.*//' $$a/fuzz))" >$(SUMMARY)/asan; \
	if [ -s $$a/unit.skipped ]; then echo "ASan/UBSan $$(cat $$a/unit.skipped)" >$(SUMMARY)/asan.skipped; fi

# Threads under ThreadSanitizer: the disk tier's stager, the disk tier end
# to end, and the engine's looks at its learned profile (planned on a thread
# of their own) end to end (programs of their own: criterion's runner does not run under
# TSan).
test-tsan:
	$(Q)mkdir -p $(SUMMARY); rm -f $(SUMMARY)/tsan
	$(Q)$(MAKE) --no-print-directory BUILD=$(BUILD)/tsan SAN=thread CUDA=0 tsan-run
	$(Q)cp $(BUILD)/tsan/test-summary/tsan $(SUMMARY)/tsan

TSAN_PROGRAMS := stager_stress disk_stress look_stress

tsan-run: $(TSAN_PROGRAMS:%=$(BUILD)/tests/%) $(BUILD)/arena
	$(Q)mkdir -p $(SUMMARY); rm -f $(SUMMARY)/tsan
	$(Q)TSAN_OPTIONS=halt_on_error=1 $(BUILD)/tests/stager_stress
	$(Q)$(BUILD)/arena convert -q --force --chunk-size 64K fixtures/tiny_flux.safetensors -o $(BUILD)/tests/tsan-plain.arena
	$(Q)$(BUILD)/arena convert -q --force --chunk-size 64K --codec hb4 fixtures/tiny_flux.safetensors -o $(BUILD)/tests/tsan-hb4.arena
	$(Q)TSAN_OPTIONS=halt_on_error=1 ARENA_WIRE_SEGMENT=4K ARENA_WIRE_POOL=16K $(BUILD)/tests/disk_stress \
		$(BUILD)/tests/tsan-plain.arena $(BUILD)/tests/tsan-hb4.arena
	$(Q)TSAN_OPTIONS=halt_on_error=1 ARENA_WIRE_SEGMENT=4K ARENA_WIRE_POOL=16K $(BUILD)/tests/look_stress \
		$(BUILD)/tests/tsan-plain.arena $(BUILD)/tests/tsan-hb4.arena
	$(Q)echo "TSan $(words $(TSAN_PROGRAMS)) programs" >$(SUMMARY)/tsan

$(BUILD)/tests/%_stress: tests/tsan/%_stress.c tests/tsan/stress_step.h $(BUILD)/libarena.a
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libarena.a $(LDLIBS)

# The last line: what ran (counts from each section) and what was skipped, and
# why. Under CI=true a skipped Python or wheel section fails (its script says so).
test: test-unit test-cli test-api test-python test-fuzz test-asan test-tsan test-wheel
	@sh tests/summary.sh $(SUMMARY) unit cli api python torch fuzz asan tsan wheel

# The quick tier, for the edit loop: the unit, CLI, public API and Python
# sections on sim, each without its cases marked slow (slow_test() in a unit
# test, `slow` in tests/cli, @slow in tests/python: the runners skip them
# where ARENA_TEST_QUICK is set, and say how many); no sanitizers, fuzz replay
# or wheel. Its last line says what ran and what was left to 'make test'.
# ARENA_TEST_QUICK is set on the inner make's command line only: the
# assignment below keeps one in the environment from making 'make test' quick.
ARENA_TEST_QUICK :=
check:
	$(Q)$(MAKE) --no-print-directory ARENA_TEST_QUICK=1 test-unit test-cli test-api test-python
	@sh tests/summary.sh -n "make check" $(SUMMARY) unit cli api python torch

demo: cli
	$(Q)sh scripts/demo.sh $(BUILD)

# The self-contained wheel (scripts/wheel.sh): manylinux_2_28, libarena.so
# and the arena command linked with all they use but the C runtime; built
# by zig for glibc 2.28 in $(BUILD)/wheel, with the sources of jansson,
# xxHash and zstd from Debian's archive. WHEEL_ARCH=aarch64: the simulator only.
wheel:
	$(Q)WERROR=$(WERROR) CUDA=$(CUDA) CUDA_HOME=$(CUDA_HOME) sh scripts/wheel.sh $(BUILD)

# The wheel as a user gets it (tests/wheel/run.sh): built, installed into a
# venv, run there without build tools or a library path (convert, verify,
# arena.convert ..., examples/sample_flux.py --tiny). Exit 77: skipped (zig,
# the sources or PyPI unreachable), with the reason in $(SUMMARY)/wheel.skipped.
test-wheel:
	$(Q)WERROR=$(WERROR) CUDA=$(CUDA) CUDA_HOME=$(CUDA_HOME) sh tests/wheel/run.sh $(BUILD) || \
		{ [ $$? = 77 ] && [ -s $(SUMMARY)/wheel.skipped ]; }

# libFuzzer builds (clang), for longer runs than the replay in 'make test'.
# The CUDA backend is left out: libFuzzer builds need no device and no toolkit.
fuzz:
	$(Q)for t in $(FUZZ_TARGETS); do \
		mkdir -p $(BUILD)/fuzz/$$t-corpus && \
		clang -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -fsanitize=fuzzer,address,undefined \
		  -o $(BUILD)/fuzz/$$t tests/fuzz/fuzz_$$t.c $(filter-out %_cuda.c,$(LIB_SRC)) $(filter-out $(CUDA_HOME)%,$(LDLIBS)) -ldl -lrt || exit 1; \
		$(BUILD)/fuzz/$$t -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
		  $(BUILD)/fuzz/$$t-corpus tests/fuzz/corpus/$$t || exit 1; done

# arena.pc's Libs.private: LDLIBS, with the CUDA runtime as -L... -lcudart_static.
PC_LIBS := $(patsubst $(CUDA_HOME)/lib64/libcudart_static.a,-L$(CUDA_HOME)/lib64 -lcudart_static,$(LDLIBS))

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(BUILD)/arena $(DESTDIR)$(PREFIX)/bin/arena
	install -m 644 $(BUILD)/libarena.a $(DESTDIR)$(PREFIX)/lib/libarena.a
	install -m 755 $(BUILD)/libarena.so $(DESTDIR)$(PREFIX)/lib/libarena.so.0
	ln -sf libarena.so.0 $(DESTDIR)$(PREFIX)/lib/libarena.so
	install -m 644 include/arena.h $(DESTDIR)$(PREFIX)/include/arena.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(shell sed -n 's/^#define ARENA_VERSION_STRING "\(.*\)"/\1/p' include/arena.h)|g' \
	  -e 's|@LIBS@|$(PC_LIBS)|g' arena.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/arena.pc

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(UNIT_OBJ:.o=.d)
