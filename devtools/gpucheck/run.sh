#!/bin/bash
# The agent's NVML XID events on a real GPU, as one short run (a machine with a GPU, root, the
# NVIDIA driver, Python >= 3.11; no cluster: the agent runs --dry-run and prints its writes).
# 1. A real, recoverable fault (fault.py: a store to an unmapped address, CUDA error 700; the
#    driver logs an MMU-fault XID, 31 on Hopper) while the agent reads /dev/kmsg and NVML:
#    expected one Event (the kernel's text), and a second fault bumps its count to 2, not 3.
# 2. The same with the kernel log out of the agent's reach: one Event from NVML alone.
# pynvml: nvidia-ml-py's single module, put next to this script or on PYTHONPATH, e.g.
#   cp .venv/lib/python3*/site-packages/pynvml.py .gpucheck/   (then carry .gpucheck)
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
set -x
date -u; uname -r; id
nvidia-smi --query-gpu=name,driver_version,pci.bus_id,uuid --format=csv
PY=$(command -v python3.12 || command -v python3.11 || command -v python3); $PY --version
export PYTHONPATH=$PWD/operator:$PWD/.gpucheck:$PWD/devtools/gpucheck PYTHONUNBUFFERED=1
ls -l /dev/kmsg; head -c 200 /dev/kmsg >/dev/null && echo kmsg-readable
$PY -m gpuheal agent --node gpu-dev --nvml on --dry-run --kmsg /dev/kmsg --flush-interval 0.5 \
    > "$OUT/agent.jsonl" 2> "$OUT/agent.err" &
AGENT=$!
sleep 4
$PY devtools/gpucheck/fault.py > "$OUT/fault.log" 2>&1; echo fault rc=$?
sleep 4
# NVML alone: the kernel log hidden from the agent (a text file that never fills)
echo boot > /tmp/empty.log
$PY -m gpuheal agent --node gpu-dev --nvml on --dry-run --kmsg /tmp/empty.log --flush-interval 0.5 \
    > "$OUT/agent-nvml-only.jsonl" 2> "$OUT/agent-nvml-only.err" &
A2=$!
sleep 4
$PY devtools/gpucheck/fault.py > "$OUT/fault2.log" 2>&1; echo fault2 rc=$?
sleep 4
kill -TERM $AGENT $A2; wait $AGENT; echo agent rc=$?; wait $A2; echo agent2 rc=$?
(dmesg 2>/dev/null || journalctl -k --no-pager 2>/dev/null) | grep -E "NVRM|Xid" | tail -20 > "$OUT/dmesg-xid.txt"
tail -n +1 "$OUT"/fault.log "$OUT"/agent.err "$OUT"/agent-nvml-only.err "$OUT"/dmesg-xid.txt
grep -c '"event"' "$OUT"/agent.jsonl "$OUT"/agent-nvml-only.jsonl
grep '"event"' "$OUT"/agent.jsonl "$OUT"/agent-nvml-only.jsonl | cut -c1-600
