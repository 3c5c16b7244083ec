# kfelastic local: fault → first step after recovery for DESIGN §8's scenarios
# 1, 5 and 7 under the engine, beside torchrun c10d where it can express the
# fault, and DLRover's reference (bench/recovery/main.go).
BENCHES += recovery

.PHONY: bench-recovery
bench-recovery: build
	scripts/deps.sh torch
	$(GO) run ./bench/recovery -bin $(BIN) -script examples/train/train.py
