# Error documents: the reader benchmark (bench/errors) against upstream
# flyteplugins' earliest-error reader, on file:// and a MinIO it starts.
BENCHES += errors

.PHONY: bench-errors
bench-errors:
	scripts/deps.sh minio
	$(GO) build -o bin/bench-errors ./bench/errors
	bin/bench-errors -n 1000,10000 -backends file,minio
