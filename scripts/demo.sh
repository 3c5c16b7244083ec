#!/usr/bin/env bash
# make demo: an elastic job on this machine (kfelastic local), with one fault
# it recovers from and one that ends it, read back as the Flyte UI shows it.
# Real processes throughout: the master in-process, one kfelastic agent per
# pod (the torchrun drop-in), real torch.distributed workers (gloo, Debian's
# torch at /usr/bin/python3) running examples/train/train.py.
#
#   --nnodes 2:3, 3 pods of 2 workers, checkpoints every 10 steps.
#   1. delete-pod:1@step=15  pod demo-worker-1 is preempted (SIGTERM): the
#      master relaunches rank 1 as demo-worker-3 (not counted), the others
#      re-rendezvous with it, and training resumes from the checkpoint.
#   2. --fail-at 45          the loss diverges at step 45 on every rank (a
#      bug no restart fixes): each agent restarts its workers once from the
#      checkpoint, fails again, the pods fail with user errors, which the
#      master does not relaunch, and the job stops. The root cause is the
#      earliest ValueError, with its pod and time.
#
# Only what the demo needs is installed: Debian's python3-torch (scripts/deps.sh
# torch), while the Go build runs beside it.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
BIN=${BIN:-bin/kfelastic}
GO=${GO:-go}
start=$(date +%s)
if ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
  scripts/deps.sh torch & deps=$!
fi
[[ -x $BIN && -z ${REBUILD:-} ]] || $GO build -o "$BIN" ./cmd/kfelastic
[[ -z ${deps:-} ]] || wait "$deps"
echo "demo: ready after $(( $(date +%s) - start )) s (torch and the kfelastic binary)"

out=${OUT:-$(mktemp -d /tmp/kfelastic-demo.XXXXXX)}
set -x
"$BIN" local --job demo --nnodes 2:3 --nproc-per-node 2 --max-restarts 1 --out "$out" \
  --chaos delete-pod:1@step=15 \
  -- "$PY" examples/train/train.py --steps 200 --sleep 0.05 --ckpt-dir "$out/ckpt" --fail-at 45 || true
{ set +x; } 2>/dev/null
echo
echo "demo: every document: $BIN errors file://$out/errors"
echo "demo: the pods' logs: $out/pods/*.log; the master's: $out/master.log"
