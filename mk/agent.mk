# The agent's benchmark: kill -9 → first step under kfelastic agent vs torchrun,
# cold-start overhead over bare workers, agent RSS (bench/agent/main.go).
BENCHES += agent

.PHONY: bench-agent
bench-agent: build
	$(GO) run ./bench/agent -agent $(BIN) -script agent/testdata/train/train_steps.py
