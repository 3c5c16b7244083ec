#!/usr/bin/env bash
# make demo (interim, until the local engine lands): a real distributed
# failure, read back as the Flyte UI would show it.
#
# Three real torch.distributed workers (gloo, /usr/bin/python3) train; rank 1
# raises ValueError, and its peers fail a moment later with "Connection closed
# by peer". Each worker's torch error file becomes one error document
# (kfelastic errors put, the peers' first, so write order does not help), and
# `kfelastic errors` picks the root cause: rank 1's exception, by time.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
BIN=${BIN:-bin/kfelastic}
[[ -x $BIN ]] || { echo "demo: $BIN missing: run make build" >&2; exit 1; }
"$PY" -c 'import torch.distributed' 2>/dev/null || { echo "demo: $PY has no torch: run scripts/deps.sh apt" >&2; exit 1; }

work=$(mktemp -d /tmp/kfelastic-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT

port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "== 3 torch.distributed workers (gloo), rank 1 fails at step 3; logs in $work"
for r in 0 1 2; do
  mkdir -p "$work/w$r"
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=3 LOCAL_RANK=0 OMP_NUM_THREADS=1 \
    TORCHELASTIC_ERROR_FILE="$work/w$r/error.json" \
    setsid "$PY" testdata/train/allreduce_fail.py >"$work/w$r/log" 2>&1 &
  pids+=($!)
done
codes=()
for r in 0 1 2; do
  rc=0; wait "${pids[$r]}" || rc=$?
  codes+=("$rc")
  echo "   demo-worker-$r exited with $rc: $(tail -n1 "$work/w$r/log" | cut -c1-100)"
done

out="file://$work/outputs"
echo "== each failed worker's error document, peers first"
for r in 2 0 1; do
  [[ ${codes[$r]} != 0 ]] || continue
  "$BIN" errors put --worker "demo-worker-$r" --from-torch-error "$work/w$r/error.json" --exit-code "${codes[$r]}" "$out" >/dev/null
done
echo "== kfelastic errors $out"
"$BIN" errors "$out"
