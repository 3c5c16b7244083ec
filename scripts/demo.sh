#!/usr/bin/env bash
# make demo: an elastic job on this machine with an injected failure, read
# back as the Flyte UI would show it. Real processes throughout: the agent
# (kfelastic agent, the torchrun drop-in) supervises real torch.distributed
# workers (gloo, /usr/bin/python3).
#
#   pod demo-worker-0: 3 workers; rank 1 raises ValueError at step 3, its peers
#     then fail with secondary "Connection closed by peer" errors. The agent
#     restarts the group once (restart_count=1), the failure repeats, the
#     budget is spent: it writes the pod's error document (the earliest
#     failure, at sub-second precision) and exits 1.
#   pod demo-worker-1: a healthy worker the operator tears down once the job
#     failed (SIGTERM): its agent writes a Preempted document, later in time.
#
# `kfelastic errors` then lists every document and names the root cause, and
# `kfelastic report` draws both pods' lanes (failures, restarts) in one page.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
BIN=${BIN:-bin/kfelastic}
[[ -x $BIN ]] || { echo "demo: $BIN missing: run make build" >&2; exit 1; }
"$PY" -c 'import torch.distributed' 2>/dev/null || { echo "demo: $PY has no torch: run scripts/deps.sh apt" >&2; exit 1; }

work=$(mktemp -d /tmp/kfelastic-demo.XXXXXX)
out="file://$work/outputs"
pid1=
cleanup() { [[ -z $pid1 ]] || kill -TERM "$pid1" 2>/dev/null || true; }
trap cleanup EXIT

echo "== pod demo-worker-1: one healthy worker (logs: $work/pod1.log)"
POD_NAME=demo-worker-1 "$BIN" agent --nproc-per-node 1 --rdzv-id demo-1 --error-prefix "$out" \
  --log-dir "$work/logs1" -- "$PY" agent/testdata/train/train_steps.py --sleep 0.05 >"$work/pod1.log" 2>&1 &
pid1=$!

echo "== pod demo-worker-0: 3 workers, --max-restarts 1, rank 1 fails at step 3 (logs: $work/pod0.log)"
rc=0
POD_NAME=demo-worker-0 FAIL_RANK=1 FAIL_STEP=3 "$BIN" agent --nproc-per-node 3 --max-restarts 1 --rdzv-id demo-0 \
  --error-prefix "$out" --log-dir "$work/logs0" -- "$PY" testdata/train/allreduce_fail.py >"$work/pod0.log" 2>&1 || rc=$?
grep -E "restart_count=|Connection closed|ValueError: loss" "$work/pod0.log" | sed 's/^/   /' | head -12
echo "   demo-worker-0's agent exited with $rc"

echo "== the job failed: the operator stops demo-worker-1 (SIGTERM)"
kill -TERM "$pid1"
rc1=0; wait "$pid1" || rc1=$?
pid1=
echo "   demo-worker-1's agent exited with $rc1"

echo "== kfelastic errors $out"
"$BIN" errors "$out"

echo "== kfelastic report $out"
"$BIN" report "$out" -o "$work/report.html"
echo "   open $work/report.html in a browser"
