#!/usr/bin/env bash
# Installs Debian's Slurm 22.05 + munge (the sandbox's real Slurm cluster) when missing, and
# slurmdbd + MariaDB's server binary (accounting: the bridge's service user and its AdminLevel).
# `install-system-deps.sh realnode`: instead, what the sandbox's real node runs on (containerd,
# runc, the CNI plugins) and busybox-static (the one binary of its locally made images).
set -euo pipefail
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
if [ "${1:-}" = realnode ]; then
    need=()
    for c in containerd ctr runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback /bin/busybox; do
        command -v "$c" >/dev/null || need+=("$c")
    done
    [ ${#need[@]} -eq 0 ] && exit 0
    echo "[install-system-deps] installing containerd, runc, CNI plugins, busybox (missing: ${need[*]})" >&2
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends containerd runc \
        containernetworking-plugins busybox-static >/dev/null
    exit 0
fi
need=()
for c in munged slurmctld slurmd sinfo slurmrestd slurmdbd mariadbd; do
    command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || need+=("$c")
done
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so ] || ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || need+=(jwt)
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/accounting_storage_mysql.so ] || ls /usr/lib/*/slurm-wlm/accounting_storage_mysql.so >/dev/null 2>&1 || need+=(mysql-plugin)
[ ${#need[@]} -eq 0 ] && exit 0
echo "[install-system-deps] installing munge + Slurm from Debian (missing: ${need[*]})" >&2
$SUDO apt-get update -qq
# mariadb-server-core: the server binary only (no service, no system tables, no perl upgrade)
$SUDO apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client \
    slurmrestd slurm-wlm-jwt-plugin slurmdbd slurm-wlm-mysql-plugin mariadb-server-core >/dev/null
