# The two commands of the README:
#   make run   build, serve the bundled model, send one chat request, print the answer
#   make test  build, fetch the test oracle (llama.cpp from npm), run every test
BUILD_DIR ?= build
PRESET ?= default
JOBS ?= $(shell nproc)

.PHONY: all build run test test-setup clean

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
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

clean:
	rm -rf $(BUILD_DIR)
