#!/usr/bin/env bash
# make demo: filled in as the agent and reader land.
set -euo pipefail
echo "demo: not built yet"
