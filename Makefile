# meshp2p build. `make demo` runs a 3-node swarm on loopback; `make test` runs the tests.
#
# SIMD: llama.cpp is compiled through cgo by the Go toolchain; by default with
# -march=native. For portable release artifacts: `make build SIMD=x86-64-v3`.
# The flag string is kept byte-for-byte stable so the Go build cache stays warm
# (changing it recompiles all of llama.cpp: about 4 minutes on 2 cores).
#
# AMX is off on x86-64 (NOAMX). On an AMX CPU (Intel Sapphire Rapids and later)
# -march=native defines __AMX_INT8__, and ggml-cpu then calls
# ggml_backend_amx_buffer_type(), whose sources (ggml-cpu/amx/) the ollama
# module's cgo package does not compile: the link fails with "undefined
# reference to ggml_backend_amx_buffer_type()". We cannot compile them without
# copying llama.cpp sources into this repository, and ggml's AMX path only
# speeds up some quantized matmuls in batched prompt processing. Reasons and
# measurements: patches/README.md. `make build-check-amx` (run by `make test`)
# proves a build for an AMX target links on any x86-64 machine.

SIMD       ?= native
CGO_ARCH   := $(shell GOTOOLCHAIN=local go env GOARCH)
ifeq ($(CGO_ARCH),amd64)
NOAMX      ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
# -UGGML_USE_LLAMAFILE: batch invariance (docs/architecture.md). The ollama
# module's cgo directive defines GGML_USE_LLAMAFILE in CPPFLAGS; CGO_CFLAGS
# come later on the compiler's command line, so this undefines it and every
# matrix product takes ggml's vec_dot path, whatever its row count. The
# engine refuses to start without it (engine.ErrNotInvariant).
INVARIANT  := -UGGML_USE_LLAMAFILE
CGO_FLAGS  := $(strip -O3 -march=$(SIMD) $(NOAMX) $(INVARIANT))
export CGO_CFLAGS   := $(CGO_FLAGS)
export CGO_CXXFLAGS := $(CGO_FLAGS)
export CGO_ENABLED  := 1
# Never let a module download pick a different Go toolchain behind our back.
export GOTOOLCHAIN  := local

VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    = -X github.com/neuron-tai/meshp2p/engine.Version=$(VERSION) -X main.buildSIMD=$(SIMD) -X "main.buildNoAMX=$(NOAMX)"
BIN        := bin/meshp2p
GENERATED  := engine/zz_cgo_include.go
# Per test binary (go test -timeout): a guard against a hang, not a speed
# goal. On 2 cores under load ./engine took 34 min and ./cmd/meshp2p 24
# of fresh-clone make test runs (load 9-14, 2026-12-05; about 10 min each
# on CI), so 50m keeps a busy machine from failing them and still stops a
# hang well inside CI's 90 minutes.
TEST_TIMEOUT ?= 50m
# Fuzz budget per target. A count ("Nx"), not a duration: with a duration, Go's
# fuzz coordinator can fail a target with "context deadline exceeded" and no
# failing input when a starved worker is still mid-call as -fuzztime expires
# (a race in internal/fuzz seen here on a loaded 2-core machine). A count has
# no deadline: a loaded machine only makes it slower. 10000 execs take 1-7 s
# per target here, plus the build; 50000 made the step 11 of make test's
# minutes. `make fuzz FUZZTIME=5m` fuzzes for a duration (before a release).
FUZZTIME   ?= 10000x

# Linter: staticcheck (honnef.co/go/tools), built from the Go module proxy at
# this pinned version into .cache/bin (gitignored) the first time `make lint`
# runs (~1 min). Its checks are chosen in staticcheck.conf. v0.8.2 (2026.2.2)
# was the newest release when pinned; it builds and runs with Go 1.26.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := .cache/bin/staticcheck-$(STATICCHECK_VERSION)/staticcheck
# Dead code: golang.org/x/tools/cmd/deadcode at a pinned version, built the
# same way (scripts/deadcode.sh says what it checks).
DEADCODE_VERSION ?= v0.53.0
DEADCODE := .cache/bin/deadcode-$(DEADCODE_VERSION)/deadcode

.PHONY: all build build-check-amx cross cross-deps dist test-platforms test-platforms-run test-platforms-unit vet-cross generate test test-short vet lint lint-counts fmt fuzz bench bench-micro demo clean deps soak gpu gpu-lib gpu-tolerance placement-sim \
	image testnet-docker testnet-docker-fit testnet-docker-down test-docker

all: build

# A GPU backend library from the pinned module (docs/gpu.md): GPU=vulkan
# (the default; Debian's packages, installed here) or GPU=cuda (needs the
# CUDA toolkit). It lands in .cache/gpu/lib with its stamp and is copied
# beside the binary (bin/lib), where meshp2p looks for it. make build
# stays CPU-only.
GPU ?= vulkan
gpu: build gpu-lib
	mkdir -p bin/lib
	# copy, then rename: a running node keeps the library it mapped
	for f in libggml-$(GPU).so libggml-$(GPU).so.meshp2p; do cp .cache/gpu/lib/$$f bin/lib/$$f.tmp && mv bin/lib/$$f.tmp bin/lib/$$f; done

# The backend library alone (.cache/gpu/lib; cmake rebuilds only what
# changed).
gpu-lib:
	sh scripts/gpu-$(GPU).sh

# Placement across models (issue 28): 1000 nodes, 10 models, a day of
# shifting demand, against nobody moving (make test runs 100 nodes, 4
# models): the figures in docs/placement.md.
placement-sim:
	MESHP2P_PLACEMENT_SIM=full go test -count=1 -v -run TestModelSimulation ./placement

# The mixed CPU/Vulkan tolerance over every test model (about 8 minutes
# on lavapipe; make test runs two models): the figures in docs/gpu.md.
gpu-tolerance: gpu-lib $(GENERATED)
	MESHP2P_GPU_TESTS=require MESHP2P_GPU_TOLERANCE=full go test -count=1 -timeout 30m -v -run 'TestMixedRouteTolerance' ./engine

deps:
	go mod download
	sh scripts/build-deps.sh
	sh testnet/deps.sh
	sh scripts/browser-deps.sh
	sh scripts/node-deps.sh
	sh testnet/docker/dockerd.sh install

$(GENERATED): go.mod go.sum internal/gencgo/main.go
	sh scripts/build-deps.sh
	go mod download github.com/ollama/ollama
	go generate ./engine

generate: $(GENERATED)

build: $(GENERATED)
	@echo "building $(BIN) with SIMD level -march=$(SIMD) (first build compiles llama.cpp: ~4 min on 2 cores)"
	go build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshp2p
	@$(BIN) version

# Link check for an AMX target: builds ./cmd/meshp2p with -march=$(AMX_SIMD)
# (which enables AMX) plus $(NOAMX), to a throwaway binary that is never run
# (this machine may lack the target's AVX-512/AMX instructions). Fails if the
# link fails. Its own flag string, so its own cached llama.cpp build (~4 min
# on 2 cores the first time, seconds afterwards). Skipped off x86-64.
AMX_SIMD   ?= sapphirerapids
AMX_FLAGS  := $(strip -O3 -march=$(AMX_SIMD) $(NOAMX) $(INVARIANT))
build-check-amx: $(GENERATED)
ifeq ($(CGO_ARCH),amd64)
	@echo "link check: ./cmd/meshp2p with '$(AMX_FLAGS)' (first time compiles llama.cpp again: ~4 min on 2 cores)"
	CGO_CFLAGS='$(AMX_FLAGS)' CGO_CXXFLAGS='$(AMX_FLAGS)' go build -ldflags '$(LDFLAGS) -X main.buildSIMD=$(AMX_SIMD)' -o bin/meshp2p-$(AMX_SIMD) ./cmd/meshp2p
	@echo "link check ok: bin/meshp2p-$(AMX_SIMD) (not run)"
else
	@echo "link check for -march=$(AMX_SIMD) skipped: GOARCH=$(CGO_ARCH), not amd64"
endif

# Other platforms (docs/platforms.md). make cross builds
# bin/cross/meshp2p-<platform>[.exe] for PLATFORMS with Debian's cross
# compilers (scripts/cross-deps.sh: make cross-deps, run first) at a portable SIMD
# level: amd64 -march=$(AMD64_SIMD), arm64 -march=$(ARM64_SIMD), always
# -UGGML_USE_LLAMAFILE. Each platform compiles llama.cpp once (5-14 min on
# 2 cores; docs/platforms.md), seconds afterwards. make dist packs them
# into dist/meshp2p-$(VERSION)-<platform>.tar.gz/.zip with README, the
# license files and dist/SHA256SUMS. make test-platforms builds and runs
# them: Windows under wine, ARM64 (and amd64 on an older emulated CPU)
# under qemu-user, a mixed loopback swarm, the archives. It installs its
# own Debian packages (scripts/cross-deps.sh). make test runs the same
# tests (test-platforms-run) on a make dist it starts in the background
# at nice 19 (scripts/test.sh): a cold Go cache compiles llama.cpp three
# times (10-35 min on 2 cores), a warm one relinks (minutes).
PLATFORMS  ?= linux-amd64 linux-arm64 windows-amd64
AMD64_SIMD ?= x86-64-v3
ARM64_SIMD ?= armv8.2-a+fp16+dotprod
cross: cross-deps $(GENERATED)
	AMD64_SIMD='$(AMD64_SIMD)' ARM64_SIMD='$(ARM64_SIMD)' sh scripts/cross.sh $(VERSION) bin/cross $(PLATFORMS)

dist: cross-deps $(GENERATED)
	AMD64_SIMD='$(AMD64_SIMD)' ARM64_SIMD='$(ARM64_SIMD)' sh scripts/dist.sh $(VERSION) $(PLATFORMS)

cross-deps:
	sh scripts/cross-deps.sh

# go vet for Windows and ARM64 (their build tags and cgo files).
vet-cross: cross-deps $(GENERATED)
	CROSS_VET=1 CROSS_SKIP_MISSING=1 AMD64_SIMD='$(AMD64_SIMD)' ARM64_SIMD='$(ARM64_SIMD)' sh scripts/cross.sh $(VERSION) bin/cross $(filter-out linux-amd64,$(PLATFORMS))

# The platform code's own Go tests (pure Go, no llama.cpp), cross-compiled
# and run under wine and qemu-user (about 1 minute, 3-4 the first time on
# a machine; docs/platforms.md), without the release binaries.
test-platforms-unit: cross-deps
	-sh scripts/wine/prefix.sh .cache/wine
	MESHP2P_PLATFORM_UNIT=1 MESHP2P_WINEPREFIX=$(abspath .cache/wine) \
	  go test -count=1 -timeout 10m -v -run '^TestPlatformUnitTests$$' ./cmd/meshp2p

test-platforms: vet-cross
	CROSS_SKIP_MISSING=1 AMD64_SIMD='$(AMD64_SIMD)' ARM64_SIMD='$(ARM64_SIMD)' sh scripts/dist.sh $(VERSION) $(PLATFORMS)
	$(MAKE) --no-print-directory test-platforms-run

# Every platform test (the unit tests above, version, the CPU check,
# shard verify, the mixed swarm, the Windows data dir, the archives) on
# what make dist left in bin/cross and dist: make test's last step.
test-platforms-run: cross-deps
	-sh scripts/wine/prefix.sh .cache/wine
	MESHP2P_CROSS_BIN=$(abspath bin/cross) MESHP2P_WINEPREFIX=$(abspath .cache/wine) MESHP2P_DIST='$(abspath dist) $(VERSION)' \
	  go test -count=1 -timeout 20m -v -run '^TestPlatform' ./cmd/meshp2p

vet: $(GENERATED) lint
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

$(STATICCHECK):
	GOBIN=$(abspath $(dir $(STATICCHECK))) go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(DEADCODE):
	GOBIN=$(abspath $(dir $(DEADCODE))) go install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

# staticcheck over every package and its tests, with the checks of staticcheck.conf,
# and the counts the structure review keeps from growing (internal/codecount):
# functions over 80 lines, the methods of node.Node and of the interface
# node.windowHost (the placement seam), at most the ceilings
# below. Lower a ceiling in the commit that lowers its count.
MAX_LONG_FUNCS   ?= 0
MAX_NODE_METHODS ?= 26
MAX_WINDOW_HOST ?= 6
MAX_TEST_ONLY_FUNCS ?= 23
lint: $(GENERATED) $(STATICCHECK) $(DEADCODE)
	$(STATICCHECK) ./...
	go run ./internal/codecount -max-long $(MAX_LONG_FUNCS) -max-node-methods $(MAX_NODE_METHODS) -max-window-host $(MAX_WINDOW_HOST)
	scripts/deadcode.sh $(DEADCODE) $(MAX_TEST_ONLY_FUNCS)

# The counts of make lint with the long functions listed.
lint-counts:
	go run ./internal/codecount -v

# The test command of the README and .ci/run.
# The GPU code path is tested on every machine: make test builds the
# Vulkan backend library (Mesa's lavapipe runs it on the CPU) and requires
# the GPU tests to run, not skip (internal/testgpu).
# scripts/test.sh runs the test steps, every one even after a failure, and
# ends with a one-line summary of each failed test and its package.
# Not root and Debian's Vulkan packages missing (the script exits 3): the
# GPU tests skip, saying why; any other failure of the build fails.
test: deps build build-check-amx vet
	@MAKE='$(MAKE)' TEST_TIMEOUT='$(TEST_TIMEOUT)' FUZZTIME='$(FUZZTIME)' sh scripts/test.sh

test-short: $(GENERATED)
	go test -short -count=1 ./...

# Churn soak: 6 loopback nodes (3 ranges x 2 replicas), 8 clients
# generating greedily, one random node SIGKILLed and restarted every 20-40 s.
# `make test` runs a 5-minute one after the other packages (scripts/test.sh).
# SOAK_DURATION=25m by default; MESHP2P_SOAK_SEED and MESHP2P_SOAK_REPORT=file.json pass through.
SOAK_DURATION ?= 25m
soak: $(GENERATED)
	MESHP2P_SOAK_DURATION=$(SOAK_DURATION) go test -run TestChurnSoak -timeout 35m -v -count=1 ./soak

# Runs every fuzz target briefly (CI: FUZZTIME execs each) or longer: make fuzz FUZZTIME=5m
# (scripts/fuzz.sh: one instrumented test binary per package).
fuzz: $(GENERATED)
	@sh scripts/fuzz.sh '$(FUZZTIME)'

# Containers (testnet/compose, docs/reference.md "Containers"). `make image` builds the
# offline image FROM scratch (no registry); the Dockerfile is for machines
# with registry access. testnet-docker brings the compose testnet up (and
# starts dockerd, host networking untouched, if none runs) and checks it;
# it stays up until testnet-docker-down. test-docker is the Go test of the
# whole cycle, run by `make test` after the other packages so it never
# overlaps the namespace NAT tests; it skips where Docker cannot run.
IMAGE ?= meshp2p:local
image: build
	sh testnet/docker/image.sh $(BIN) $(IMAGE)

testnet-docker: build
	sh testnet/compose/testnet.sh up
	sh testnet/compose/testnet.sh check

testnet-docker-fit: testnet-docker
	sh testnet/compose/testnet.sh fit

testnet-docker-down:
	sh testnet/compose/testnet.sh down

test-docker: $(GENERATED)
	MESHP2P_DOCKER_TEST=1 go test -count=1 -timeout 8m -v -run 'TestComposeTestnet' ./testnet/compose

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

# One table of issue 16's figures with ratios against baselines measured in
# the same run (internal/perfbench; docs/performance.md). It synthesizes a
# 154M-parameter model into the user cache (~300 MB, once). Knobs:
# MESHP2P_BENCH_ONLY, _ROUNDS, _TOKENS, _THREADS (see bench_test.go).
# The invariance section compares against today's engine, a second build of
# llama.cpp without $(INVARIANT) (its own cached compile: ~4 min the first time).
BASELINE_FLAGS := $(strip -O3 -march=$(SIMD) $(NOAMX))
bench: $(GENERATED)
	CGO_CFLAGS='$(BASELINE_FLAGS)' CGO_CXXFLAGS='$(BASELINE_FLAGS)' go test -c -o bin/perfbench-baseline.test ./internal/perfbench
	MESHP2P_BENCH_BASELINE=$(abspath bin/perfbench-baseline.test) go test -run '^$$' -bench '^BenchmarkPerf$$' -benchtime 1x -timeout 60m ./internal/perfbench

# The per-package micro benchmarks (engine chains, swarm decode, planning, framing).
bench-micro: $(GENERATED)
	go test -run '^$$' -bench . -benchtime 3x ./engine/... ./node ./route ./proto/...

demo: build
	sh scripts/demo.sh

clean:
	rm -rf bin $(GENERATED)

include proto/proto.mk
