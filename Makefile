# meshp2p build. `make demo` runs a 3-node swarm on loopback; `make test` runs the tests.
#
# SIMD: llama.cpp is compiled through cgo by the Go toolchain; by default with
# -march=native. For portable release artifacts: `make build SIMD=x86-64-v3`.
# The flag string is kept byte-for-byte stable so the Go build cache stays warm
# (changing it recompiles all of llama.cpp: about 2 minutes on 2 cores).

SIMD       ?= native
CGO_FLAGS  := -O3 -march=$(SIMD)
export CGO_CFLAGS   := $(CGO_FLAGS)
export CGO_CXXFLAGS := $(CGO_FLAGS)
export CGO_ENABLED  := 1
# Never let a module download pick a different Go toolchain behind our back.
export GOTOOLCHAIN  := local

VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS    := -X github.com/neuron-tai/meshp2p/engine.Version=$(VERSION) -X main.buildSIMD=$(SIMD)
BIN        := bin/meshp2p
GENERATED  := engine/zz_cgo_include.go
TEST_TIMEOUT ?= 25m
FUZZTIME   ?= 5s

.PHONY: all build generate test test-short vet fmt fuzz bench demo clean deps

all: build

deps:
	go mod download
	sh testnet/deps.sh

$(GENERATED): go.mod go.sum internal/gencgo/main.go
	go mod download github.com/ollama/ollama
	go generate ./engine

generate: $(GENERATED)

build: $(GENERATED)
	@echo "building $(BIN) with SIMD level -march=$(SIMD) (first build compiles llama.cpp: ~2-3 min on 2 cores)"
	go build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshp2p
	@$(BIN) version

vet: $(GENERATED)
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The test command of the README and .ci/run.
test: deps build vet
	go test -count=1 -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) fuzz FUZZTIME=$(FUZZTIME)

test-short: $(GENERATED)
	go test -short -count=1 ./...

# Runs every fuzz target briefly (CI) or longer: make fuzz FUZZTIME=5m
fuzz: $(GENERATED)
	@for pkg in $$(go list ./...); do \
	  for f in $$(go test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    go test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

bench: $(GENERATED)
	go test -run '^$$' -bench . -benchtime 3x ./engine/... ./node ./route ./proto/...

demo: build
	sh scripts/demo.sh

clean:
	rm -rf bin $(GENERATED)

include proto/proto.mk
