# proto/proto.mk: protobuf code generation. Included from the top-level
# Makefile (paths are relative to the repository root).
#
#   make proto        regenerate proto/meshp2pb from proto/meshp2p/v1/*.proto
#   make proto-check  regenerate into a temp dir and fail if the committed code differs
#
# Pinned generators: protoc-gen-go $(PROTOC_GEN_GO_VERSION) (built into bin/),
# protoc $(PROTOC_VERSION) from Debian bookworm's protobuf-compiler package
# (installed automatically when missing and running as root). A different
# protoc only changes the version line in the generated headers; set
# PROTOC_ANY=1 to accept it.

PROTOC_GEN_GO_VERSION ?= v1.36.12
PROTOC_VERSION        ?= 3.21.12
PROTO_MODULE          := github.com/neuron-tai/meshp2p
PROTO_SRC_DIR         := proto
PROTO_SRCS             = $(sort $(wildcard $(PROTO_SRC_DIR)/meshp2p/v1/*.proto))
PROTO_OUT_PKG         := proto/meshp2pb
PROTO_TOOLS_BIN       := bin/proto-tools/$(PROTOC_GEN_GO_VERSION)
PROTOC_GEN_GO         := $(PROTO_TOOLS_BIN)/protoc-gen-go

.PHONY: proto proto-check proto-protoc

$(PROTOC_GEN_GO):
	GOBIN=$(abspath $(PROTO_TOOLS_BIN)) go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

proto-protoc:
	@if ! command -v protoc >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "proto: installing protobuf-compiler"; \
	    apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; \
	  else \
	    echo "proto: protoc not found; install protoc $(PROTOC_VERSION) (Debian: apt-get install protobuf-compiler)" >&2; exit 1; \
	  fi; \
	fi
	@v=$$(protoc --version | awk '{print $$2}'); \
	if [ "$$v" != "$(PROTOC_VERSION)" ] && [ -z "$(PROTOC_ANY)" ]; then \
	  echo "proto: protoc $$v found, $(PROTOC_VERSION) pinned (set PROTOC_ANY=1 to use it anyway)" >&2; exit 1; \
	fi

# proto-gen-into DIR: write generated Go for all sources under DIR/$(PROTO_OUT_PKG).
define proto-gen-into
	mkdir -p $(1)
	protoc -I $(PROTO_SRC_DIR) \
	  --plugin=protoc-gen-go=$(PROTOC_GEN_GO) \
	  --go_out=$(1) --go_opt=module=$(PROTO_MODULE) \
	  $(PROTO_SRCS)
endef

proto: proto-protoc $(PROTOC_GEN_GO)
	rm -f $(PROTO_OUT_PKG)/*.pb.go
	$(call proto-gen-into,.)

PROTO_CHECK_DIR := bin/proto-check

proto-check: proto-protoc $(PROTOC_GEN_GO)
	rm -rf $(PROTO_CHECK_DIR)
	$(call proto-gen-into,$(PROTO_CHECK_DIR))
	@if diff -r $(PROTO_CHECK_DIR)/$(PROTO_OUT_PKG) $(PROTO_OUT_PKG) -x '*_test.go' -x '*.md' -x 'doc.go' >/dev/null; then \
	  echo "proto: generated code is up to date"; rm -rf $(PROTO_CHECK_DIR); \
	else \
	  diff -r $(PROTO_CHECK_DIR)/$(PROTO_OUT_PKG) $(PROTO_OUT_PKG) -x '*_test.go' -x '*.md' -x 'doc.go' | head -40 >&2; \
	  echo "proto: $(PROTO_OUT_PKG) is stale; run make proto" >&2; rm -rf $(PROTO_CHECK_DIR); exit 1; \
	fi
