# The store relay's benchmark: torch's c10d rendezvous of 2, 4 and 8 local
# torch agents through relay + master vs torch's own TCPStore host, and the
# per-operation latency of each (bench/store/main.go).
BENCHES += store

.PHONY: bench-store
bench-store: build
	scripts/deps.sh apt
	$(GO) run ./bench/store -kfelastic $(BIN)
