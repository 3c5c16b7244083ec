# Recovery of a whole job from the faults of docs/DESIGN.md §8 (1 delete-pod,
# 5 kill-worker, 7 fail-pod, 11 worker-0 deleted under --launcher command,
# where torchrun loses the job): fault → first training step after recovery
# under kfelastic local vs torchrun c10d, medians and ratio, DLRover's ≈2 min
# reference row (bench/recovery/main.go); on torch 1.13 and 2.14
# (scripts/deps.sh torch2; skipped with a note without it), each beside its
# own torchrun. About 5–10 min per torch on 2 CPUs.
BENCHES += recovery

.PHONY: bench-recovery
bench-recovery: build
	scripts/deps.sh torch
	$(GO) run ./bench/recovery -kfelastic $(BIN) -script bench/recovery/train.py
