# The agent's benchmark: kill -9 → first step under kfelastic agent (fork server,
# --fork-server=false, --store-proxy=false, --warm-spares) vs torchrun,
# cold-start overhead over bare workers, agent RSS, the fork server's RSS/PSS
# (bench/agent/main.go).
BENCHES += agent

.PHONY: bench-agent
bench-agent: build
	$(GO) run ./bench/agent -agent $(BIN) -script agent/testdata/train/train_steps.py
