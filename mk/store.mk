# The store relay's benchmark: torch's c10d rendezvous of 2, 4 and 8 local
# torch agents through relay + master vs torch's own TCPStore host, and the
# per-operation latency of each (bench/store/main.go); again with torch 2.14
# when the root of `scripts/deps.sh torch2` is there.
BENCHES += store

.PHONY: bench-store
bench-store: build
	scripts/deps.sh apt
	$(GO) run ./bench/store -kfelastic $(BIN)
	if [ -d $(CACHE)/torch-sid/usr/lib/python3/dist-packages/torch ]; then $(GO) run ./bench/store -kfelastic $(BIN) -python scripts/torch2.14/python3; fi
