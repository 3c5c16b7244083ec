# The master (master/, api/): the protocol's generated code and the
# benchmark beside torch's c10d rendezvous and TCPStore.
BENCHES += master master-attacks

.PHONY: generate bench-master bench-master-attacks

# Regenerates api/masterpb from api/master.proto with pinned generators
# (protoc from Debian, protoc-gen-go and protoc-gen-go-grpc built into the
# cache by scripts/deps.sh protoc). The generated code is committed.
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
generate:
	PROTOC_GEN_GO_VERSION=$(PROTOC_GEN_GO_VERSION) PROTOC_GEN_GO_GRPC_VERSION=$(PROTOC_GEN_GO_GRPC_VERSION) scripts/deps.sh protoc
	PATH=$(CACHE)/bin:$$PATH protoc -I api --go_out=api/masterpb --go_opt=paths=source_relative \
	  --go-grpc_out=api/masterpb --go-grpc_opt=paths=source_relative api/master.proto

# Rendezvous time and master RSS at 100, 1,000 and 10,000 simulated agents
# over gRPC beside torch's c10d rendezvous with real local agents; store
# latency and throughput beside torch's TCPStore server.
bench-master: build
	scripts/deps.sh apt
	$(GO) run ./bench/master -kfelastic $(BIN)

# The attack table (issue 29): the master's RSS under rapid reset,
# CONTINUATION and PING/SETTINGS floods, an HPACK bomb, slowloris and 10,000
# idle connections beside its idle figure, both transports, honest clients
# served throughout. ≈2 min; needs no torch.
bench-master-attacks: build
	$(GO) run ./bench/master -kfelastic $(BIN) -attacks
