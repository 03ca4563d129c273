#!/bin/bash
# gpuheal's GPU reset, NVIDIA's procedure (nvidia-smi(1), -r/--gpu-reset: root, and no
# process may use the GPU, monitoring agents included). Runs in the gpu-reset Job's `reset`
# container (privileged, hostPID: it sees every process of the node) after its `operands`
# sidecar (gpu_operands.py) has taken the GPU operator's DaemonSets and gpuheal's NVML agent
# off the node and written $STATE/operands-stopped; the sidecar puts them back when this ends.
#
#   1. wait for the sidecar's word (its failure, or none in time, fails the reset);
#   2. nothing holds a GPU: no compute application (nvidia-smi --query-compute-apps) and no
#      process with /dev/nvidia* open (fuser, or /proc/*/fd where fuser is missing);
#   3. persistence mode off on the GPUs that had it on;
#   4. nvidia-smi -r -i <bus id> on each GPU (GPU_RESET_SCOPE=all: one `nvidia-smi -r` for
#      every GPU together, which NVSwitch/NVLink systems require);
#   5. persistence mode back on where it was (also when the reset failed), and every GPU
#      listed again.
# Exit code 0 only when all of it happened; any other code fails the Job, so the reset step
# fails and the policy's ladder climbs to its next rung (the default policy's: a reboot).
set -euo pipefail

STATE=${GPUHEAL_STATE_DIR:-/run/gpuheal}
WAIT_SECONDS=${GPUHEAL_OPERANDS_WAIT_SECONDS:-300}
SCOPE=${GPU_RESET_SCOPE:-each}
say() { echo "gpuheal ${GPUHEAL_INCIDENT:-?} on ${NODE_NAME:-?}: $*"; }
fail() { say "$2"; exit "$1"; }

# 1. the GPU operator's DaemonSets are off the node
deadline=$((SECONDS + WAIT_SECONDS))
until [ -e "$STATE/operands-stopped" ]; do
    [ -e "$STATE/operands-failed" ] && fail 3 "not reset: $(cat "$STATE/operands-failed")"
    [ "$SECONDS" -lt "$deadline" ] ||
        fail 3 "not reset: the GPU operator's pods were not off the node within ${WAIT_SECONDS}s"
    sleep 1
done
say "$(cat "$STATE/operands-stopped")"

# 2. nothing holds a GPU
holders() {
    if command -v fuser >/dev/null 2>&1; then
        # fuser prints the pids on stdout (the file names on stderr); exit 1: no process
        fuser /dev/nvidia* 2>/dev/null | tr -s ' \t' '\n' | sed '/^$/d' | sort -un || true
        return
    fi
    local fd
    for fd in /proc/[0-9]*/fd/*; do
        case "$(readlink "$fd" 2>/dev/null)" in
        /dev/nvidia*) fd=${fd#/proc/}; echo "${fd%%/*}" ;;
        esac
    done | sort -un
}
apps=$(nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader)
[ -z "$apps" ] || fail 4 "not reset: compute applications still run: $(echo "$apps" | tr '\n' ';')"
pids=$(holders | grep -vx "$$" || true)
if [ -n "$pids" ]; then
    names=$(for p in $pids; do echo "$p ($(cat "/proc/$p/comm" 2>/dev/null || echo '?'))"; done)
    fail 4 "not reset: processes hold /dev/nvidia*: $(echo "$names" | tr '\n' ' ')"
fi

# 3-5. persistence off, reset, persistence back on
mapfile -t gpus < <(nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader)
[ "${#gpus[@]}" -gt 0 ] || fail 5 "not reset: nvidia-smi lists no GPU"
persistent=()
for line in "${gpus[@]}"; do
    bus=${line%%,*}
    mode=$(echo "${line#*,}" | tr -d ' ')
    [ "$mode" = "Enabled" ] && persistent+=("$bus")
done
restore_persistence() {
    local bus
    for bus in "${persistent[@]}"; do
        nvidia-smi -i "$bus" -pm 1 >/dev/null || say "persistence mode not restored on $bus"
    done
}
trap restore_persistence EXIT
for bus in "${persistent[@]}"; do
    nvidia-smi -i "$bus" -pm 0 || fail 6 "not reset: persistence mode stays on for $bus"
done
if [ "$SCOPE" = all ]; then
    say "resetting all ${#gpus[@]} GPUs together"
    nvidia-smi -r || fail 7 "GPU reset failed (all GPUs together)"
else
    for line in "${gpus[@]}"; do
        bus=${line%%,*}
        say "resetting $bus"
        nvidia-smi -r -i "$bus" || fail 7 "GPU reset of $bus failed"
    done
fi
after=$(nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader)
echo "$after"
count=$(echo "$after" | sed '/^$/d' | wc -l)
[ "$count" -ge "${#gpus[@]}" ] || fail 8 "only $count of ${#gpus[@]} GPUs after the reset"
say "reset ${#gpus[@]} GPU(s)"
