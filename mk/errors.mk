# Error documents: the reader benchmark (bench/errors) against upstream
# flyteplugins' earliest-error reader, on file:// and a MinIO it starts. The
# plugin's path (Summarize) is measured up to 100,000 documents on file://
# to show its memory flat; MinIO at 1k and 10k as the speed comparison.
BENCHES += errors

.PHONY: bench-errors
bench-errors:
	scripts/deps.sh minio
	$(GO) build -o bin/bench-errors ./bench/errors
	bin/bench-errors -cases "file:1000,10000,100000 minio:1000,10000" -upstream-max 10000
