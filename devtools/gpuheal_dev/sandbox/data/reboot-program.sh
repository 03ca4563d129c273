#!/bin/bash
# RebootProgram of the sandbox's Slurm (slurm.conf): "reboot" this Slurm node by restarting its
# slurmd with -b ("report node rebooted when daemon restarted"), so `scontrol reboot` goes
# through REBOOT_REQUESTED -> REBOOT_ISSUED -> back, as on real hardware, without rebooting
# the machine that runs every sandbox node.
#
# slurmd runs this through system() as root, with no arguments and its own environment, and
# waits for it to return: the restart is detached and starts once this script has returned.
# The node is the -N of the slurmd that runs us (found up the process tree).
set -u
pid=$PPID
while [ "$pid" -gt 1 ]; do
  case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in
    */slurmd|*/slurmd-wlm) break ;;
  esac
  pid=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null || echo 1)
done
[ "$pid" -gt 1 ] || { echo "reboot-program: no slurmd ancestor" >&2; exit 1; }
mapfile -d '' argv < "/proc/$pid/cmdline"
node="" conf="" exe="${argv[0]}"
for ((i = 1; i < ${#argv[@]}; i++)); do
  case "${argv[i]}" in
    -N) node="${argv[i+1]}" ;;
    -f) conf="${argv[i+1]}" ;;
  esac
done
[ -n "$node" ] && [ -n "$conf" ] || { echo "reboot-program: slurmd $pid has no -N/-f" >&2; exit 1; }
# 26.05 runs this with an empty environment (SLURM_NODE_NAME only): the sandbox's root is then
# the one of its slurm.conf (<root>/etc/slurm.conf), and the new slurmd gets its marker back.
root="${GPUHEAL_SLURM_SANDBOX:-$(dirname "$(dirname "$conf")")}"
[ -f "$root/cluster.json" ] || { echo "reboot-program: $root is not a sandbox" >&2; exit 1; }
export GPUHEAL_SLURM_SANDBOX="$root" SLURM_CONF="${SLURM_CONF:-$conf}"
log="$root/log/slurmd@$node.console"
echo "==== $(date '+%F %T') reboot-program: restarting slurmd@$node (pid $pid) with -b" >> "$log"
# Return only once the restart runs in a session of its own: slurmd may end what is left of
# this program's process group when it returns (seen on 26.05 under load: the old slurmd was
# never stopped, nor the new one started).
ready="$root/run/reboot@$node.ready"
rm -f "$ready"
setsid bash -c '
  old=$1 exe=$2 conf=$3 node=$4 pidfile=$5
  : > "$6"
  sleep 0.5
  kill -TERM "$old" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$old" 2>/dev/null
  echo $$ > "$pidfile"
  exec "$exe" -D -b -f "$conf" -N "$node"
' reboot "$pid" "$exe" "$conf" "$node" "$root/run/slurmd@$node.pid" "$ready" \
  </dev/null >>"$log" 2>&1 &
for _ in $(seq 1 100); do [ -e "$ready" ] && break; sleep 0.05; done
exit 0
