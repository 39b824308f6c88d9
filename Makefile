# The two commands of the README:
#   make run   build, serve the bundled model, send one chat request, print the answer
#   make test  build, fetch the test oracle (llama.cpp from npm), run every test
# and for hardening:
#   make fuzz  build the libFuzzer targets with clang in $(FUZZ_BUILD_DIR), run each for
#              FUZZ_SECONDS on its corpus (tests/fuzz/)
#   make asan  the unit and server tests under ASan + UBSan (preset `asan`, in build-asan/): builds
#              only their executables and what they start (target unit_server_tests)
#   make asan-leaks  the same tests (after make asan) with LeakSanitizer on, but for those that
#              load Mesa's Vulkan drivers or Open MPI (ASAN_LEAK_EXCLUDE): both leak from
#              libraries unloaded before exit (the Vulkan loader closes the drivers), which
#              LeakSanitizer cannot name, so no suppression file can single them out
BUILD_DIR ?= build
PRESET ?= default
JOBS ?= $(shell nproc)
# ctest's parallelism: many tests wait on servers and child processes, so one more than the
# cores keeps both busy.
TEST_JOBS ?= $(shell echo $$(( $(JOBS) + 1 )))
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
# Tests whose processes load Mesa's Vulkan drivers (the plugin tests on vulkan, and those that
# probe every plugin), or Open MPI; and the ones `make asan` leaves out too.
ASAN_LEAK_VULKAN := PluginTest\..*/vulkan|^DevicesComm\.|^ServePluginDiscovery\.
ASAN_LEAK_VULKAN := $(ASAN_LEAK_VULKAN)|^CliTest\.DevicesSkipsAProbeThatCrashesOrHangs$$
ASAN_LEAK_EXCLUDE ?= $(ASAN_LEAK_VULKAN)|^ConformanceMpirun\.|^InstalledTest\.|^template_build_out_of_tree$$

.PHONY: all build run test test-setup fuzz asan asan-leaks clean

all: build

$(BUILD_DIR)/build.ninja:
	cmake --preset $(PRESET)

build: $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The demo needs only the binary and the plugins, not the test executables.
run: $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target polychip plugins
	scripts/run-demo.sh

test-setup:
	tests/setup/setup-test-deps.sh

test: build test-setup
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(TEST_JOBS) --timeout 900

fuzz:
	scripts/fuzz.sh --build-dir $(FUZZ_BUILD_DIR) --seconds $(FUZZ_SECONDS) --jobs $(JOBS)

asan: test-setup
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(TEST_JOBS)

asan-leaks:
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest -L 'unit|server' -E '$(ASAN_LEAK_EXCLUDE)' --output-on-failure -j $(JOBS) --timeout 900

clean:
	rm -rf $(BUILD_DIR)
