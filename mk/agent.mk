# The agent's benchmark: kill -9 → first step under kfelastic agent (fork server,
# --fork-server=false, --store-proxy=false, --warm-spares) vs torchrun,
# cold-start overhead over bare workers, agent RSS, the fork server's RSS/PSS
# (bench/agent/main.go); on torch 1.13 and 2.14 (scripts/deps.sh torch2; its
# half is skipped with a note without it), each beside its own torchrun.
BENCHES += agent

.PHONY: bench-agent
bench-agent: build
	$(GO) run ./bench/agent -agent $(BIN) -script agent/testdata/train/train_steps.py

# What the torch hook's forkserver preload costs a container with a CPU
# limit (agent/cpulimit.go): a flytekit-style command's first worker and a
# restarted one, spawned as torch does vs forked from the preloaded
# forkserver, under CFS quotas of 0.1–1 CPU and none (bench/preload; root).
BENCHES += preload

.PHONY: bench-preload
bench-preload:
	$(GO) run ./bench/preload
