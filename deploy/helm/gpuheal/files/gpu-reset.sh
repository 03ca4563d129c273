#!/bin/bash
# gpuheal's GPU reset, NVIDIA's procedure (nvidia-smi(1), -r/--gpu-reset: root, and no
# process may use the GPU, monitoring agents included). Runs in the gpu-reset Job's `reset`
# container (privileged, hostPID: it sees every process of the node) after its `operands`
# sidecar (gpu_operands.py) has taken the GPU operator's DaemonSets and gpuheal's NVML agent
# off the node and written $STATE/operands-stopped; the sidecar puts them back when this ends.
#
# Which GPUs: every GPU of the node; or, when the operator names one (GPUHEAL_GPU=<PCI
# address>: the GPU a quarantineDevice step holds out through DRA), that GPU alone, so that
# jobs on the node's other GPUs run on. GPU_RESET_SCOPE=all (NVSwitch/NVLink systems, where
# NVIDIA resets the GPUs together and may refuse a single-GPU reset) always resets every GPU:
# a named GPU must still be on the node, and every GPU must then be free.
#
#   1. wait for the sidecar's word (its failure, or none in time, fails the reset);
#   2. list the GPUs (nvidia-smi --query-gpu); find the named one, whatever the form of its
#      address (`0000:3b:00`, `0000:3b:00.0`, nvidia-smi's `00000000:3B:00.0`);
#   3. nothing holds a GPU to reset: no compute application (nvidia-smi --query-compute-apps)
#      and no process with /dev/nvidia* open (fuser, or /proc/*/fd where fuser is missing).
#      For the named GPU alone: no compute application on it and no process with its own
#      device node open, /dev/nvidia<minor> (the minor from the driver's
#      /proc/driver/nvidia/gpus/<address>/information). /dev/nvidiactl and /dev/nvidia-uvm
#      do not count there: every CUDA process holds them, whichever GPU it uses;
#   4. persistence mode off on the GPUs to reset that had it on;
#   5. nvidia-smi -r -i <bus id> on each GPU to reset (GPU_RESET_SCOPE=all: one
#      `nvidia-smi -r` for every GPU together);
#   6. persistence mode back on where it was (also when the reset failed), every GPU listed
#      again, the named one among them.
# Exit code 0 only when all of it happened; any other code fails the Job, so the reset step
# fails and the policy's ladder climbs to its next rung (the default policy's: a reboot).
# 3: the operands stayed; 4: something holds a GPU; 5: no GPU listed; 6: persistence mode
# stayed on; 7: the reset failed; 8: GPUs missing after it; 9: GPUHEAL_GPU is no GPU of this
# node; 10: the driver gives no device minor for it (who holds it cannot be told).
set -euo pipefail

STATE=${GPUHEAL_STATE_DIR:-/run/gpuheal}
WAIT_SECONDS=${GPUHEAL_OPERANDS_WAIT_SECONDS:-300}
SCOPE=${GPU_RESET_SCOPE:-each}
NAMED=${GPUHEAL_GPU:-}
DRIVER_GPUS=${GPUHEAL_DRIVER_GPUS:-/proc/driver/nvidia/gpus}
say() { echo "gpuheal ${GPUHEAL_INCIDENT:-?} on ${NODE_NAME:-?}: $*"; }
fail() { say "${@:2}"; exit "$1"; }

# One key per PCI address, whatever its form: domain, bus and device as hex numbers (nvidia-smi
# prints an 8-digit upper-case domain, the kernel and gpuheal a 4-digit lower-case one), and
# `.function` when the address has one. Fails on text that is no PCI address.
pci_key() {
    local text=${1,,} fn="" part
    text=${text//[[:space:]]/}
    text=${text#pci:}
    if [[ $text == *.* ]]; then
        fn=${text##*.}
        text=${text%.*}
    fi
    local -a parts
    IFS=: read -r -a parts <<<"$text"
    [ "${#parts[@]}" -ne 2 ] || parts=(0 "${parts[@]}")
    [ "${#parts[@]}" -eq 3 ] || return 1
    for part in "${parts[@]}" ${fn:+"$fn"}; do
        [[ $part =~ ^[0-9a-f]{1,8}$ ]] || return 1
    done
    printf '%x:%x:%x' "$((16#${parts[0]}))" "$((16#${parts[1]}))" "$((16#${parts[2]}))"
    [ -z "$fn" ] || printf '.%x' "$((16#$fn))"
}
# Does address $2 name GPU $1? An address without a function names the device's function 0
# or any: a GPU is one function of its device.
same_gpu() {
    local gpu want
    gpu=$(pci_key "$1") && want=$(pci_key "$2") || return 1
    [ "$gpu" = "$want" ] || [ "${gpu%.*}" = "$want" ]
}

# 1. the GPU operator's DaemonSets are off the node
deadline=$((SECONDS + WAIT_SECONDS))
until [ -e "$STATE/operands-stopped" ]; do
    [ -e "$STATE/operands-failed" ] && fail 3 "not reset: $(cat "$STATE/operands-failed")"
    [ "$SECONDS" -lt "$deadline" ] ||
        fail 3 "not reset: the GPU operator's pods were not off the node within ${WAIT_SECONDS}s"
    sleep 1
done
say "$(cat "$STATE/operands-stopped")"

# 2. the GPUs, and the one named
mapfile -t gpus < <(nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader)
[ "${#gpus[@]}" -gt 0 ] || fail 5 "not reset: nvidia-smi lists no GPU"
target=""  # nvidia-smi's bus id of the named GPU
if [ -n "$NAMED" ]; then
    pci_key "$NAMED" >/dev/null ||
        fail 9 "not reset: GPUHEAL_GPU=$NAMED is not a PCI address"
    for line in "${gpus[@]}"; do
        if same_gpu "${line%%,*}" "$NAMED"; then target=${line%%,*}; fi
    done
    [ -n "$target" ] || fail 9 "not reset: GPU $NAMED is not on this node" \
        "(nvidia-smi lists $(printf '%s\n' "${gpus[@]}" | cut -d, -f1 | tr '\n' ' '))"
    if [ "$SCOPE" = all ]; then
        say "GPU $target named, but GPU_RESET_SCOPE=all: this system resets its GPUs together," \
            "so all ${#gpus[@]} are reset and every one must be free"
        target=""
    fi
fi
to_reset=()
for line in "${gpus[@]}"; do
    bus=${line%%,*}
    [ -z "$target" ] || [ "$bus" = "$target" ] && to_reset+=("$bus")
done

# 3. nothing holds a GPU to reset
holders() {  # the pids with a file matching the pattern $1 open
    if command -v fuser >/dev/null 2>&1; then
        # fuser prints the pids on stdout (the file names on stderr); exit 1: no process.
        # $1 unquoted: /dev/nvidia* is a glob.
        # shellcheck disable=SC2086
        fuser $1 2>/dev/null | tr -s ' \t' '\n' | sed '/^$/d' | sort -un || true
        return
    fi
    local fd
    for fd in /proc/[0-9]*/fd/*; do
        # shellcheck disable=SC2254
        case "$(readlink "$fd" 2>/dev/null)" in
        $1) fd=${fd#/proc/}; echo "${fd%%/*}" ;;
        esac
    done | sort -un
}
apps=$(nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader)
if [ -n "$target" ]; then
    apps=$(while IFS= read -r app; do
        [ -n "$app" ] && same_gpu "${app##*,}" "$target" && echo "$app"
    done <<<"$apps" || true)
    minor=""
    for dir in "$DRIVER_GPUS"/*; do
        same_gpu "${dir##*/}" "$target" || continue
        minor=$(sed -n 's/^Device Minor:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$dir/information" 2>/dev/null || true)
    done
    [ -n "$minor" ] || fail 10 "not reset: the driver names no device minor for GPU $target" \
        "(no 'Device Minor' in $DRIVER_GPUS/<address>/information): who holds it is unknown"
    device=/dev/nvidia$minor
    where="GPU $target"
else
    device="/dev/nvidia*"
    where="the GPUs"
fi
[ -z "$apps" ] ||
    fail 4 "not reset: compute applications still run on $where: $(echo "$apps" | tr '\n' ';')"
pids=$(holders "$device" | grep -vx "$$" || true)
if [ -n "$pids" ]; then
    names=$(for p in $pids; do echo "$p ($(cat "/proc/$p/comm" 2>/dev/null || echo '?'))"; done)
    fail 4 "not reset: processes hold $device: $(echo "$names" | tr '\n' ' ')"
fi

# 4-6. persistence off, reset, persistence back on
persistent=()
for line in "${gpus[@]}"; do
    bus=${line%%,*}
    mode=$(echo "${line#*,}" | tr -d ' ')
    [ -z "$target" ] || [ "$bus" = "$target" ] || continue
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
    for bus in "${to_reset[@]}"; do
        say "resetting $bus"
        nvidia-smi -r -i "$bus" || fail 7 "GPU reset of $bus failed"
    done
fi
after=$(nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader)
echo "$after"
count=$(echo "$after" | sed '/^$/d' | wc -l)
[ "$count" -ge "${#gpus[@]}" ] || fail 8 "only $count of ${#gpus[@]} GPUs after the reset"
if [ -n "$NAMED" ]; then
    listed=""
    while IFS=, read -r _ bus _; do
        if same_gpu "$bus" "$NAMED"; then listed=1; fi
    done <<<"$after"
    [ -n "$listed" ] || fail 8 "GPU $NAMED is not listed after the reset"
fi
say "reset ${#to_reset[@]} GPU(s)"
