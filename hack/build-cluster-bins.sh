#!/usr/bin/env bash
# Builds the sandbox's upstream binaries into ~/.cache/gpuheal/bin/<versions>/ and prints that
# directory on stdout (last line). A no-op when every binary is already there.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  <- hack/kubernetes (k8s.io/kubernetes)
#   etcd                                                             <- hack/etcd (go.etcd.io/etcd/server/v3)
#   kwok, helm                                                       <- go install at pinned versions
# Progress goes to stderr. Env: GPUHEAL_CACHE (default ~/.cache/gpuheal).
#
# `build-cluster-bins.sh kubelet` builds only the kubelet (the sandbox's real node, asked for by
# `sandbox up --real-node`) into ~/.cache/gpuheal/bin/kubelet-<k8s>_<go>/ and prints that
# directory: its own cached artefact, so the control plane's key above and its cache stay as they
# are for everyone who never asks for a real node (~1 min with a warm Go build cache).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$HERE/kubernetes/go.mod")
ETCD_VERSION=$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$HERE/etcd/go.mod")
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
GO_VERSION=$(go env GOVERSION)
CACHE=${GPUHEAL_CACHE:-$HOME/.cache/gpuheal}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_${GO_VERSION}"
OUT="$CACHE/bin/$KEY"
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

log() { printf '[build-cluster-bins %4ds] %s\n' "$SECONDS" "$*" >&2; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

# The version stamp every kubernetes binary gets (what `kubectl version` and the node's
# kubeletVersion show): without it they report v0.0.0-master.
k8s_ldflags() {
  local minor=${K8S_VERSION#v1.} date pkg flags="-s -w"
  minor=${minor%%.*}
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$flags"
}

if [ "${1:-}" = kubelet ]; then
  KOUT="$CACHE/bin/kubelet-${K8S_VERSION}_${GO_VERSION}"
  if [ -x "$KOUT/kubelet" ]; then
    log "cached: $KOUT"
    echo "$KOUT"
    exit 0
  fi
  log "kubernetes $K8S_VERSION: kubelet into $KOUT"
  mkdir -p "$KOUT"
  KTMP=$(mktemp -d "$KOUT/.tmp.XXXX")
  trap 'rm -rf "$KTMP"' EXIT
  (cd "$HERE/kubernetes" && go build -ldflags "$(k8s_ldflags)" -o "$KTMP/kubelet" \
      k8s.io/kubernetes/cmd/kubelet)
  mv -f "$KTMP/kubelet" "$KOUT/kubelet"
  log "done: $KOUT"
  echo "$KOUT"
  exit 0
fi

missing=()
for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi
log "building ${missing[*]} into $OUT (cold build: ~11 min on 2 cores)"
mkdir -p "$OUT"
TMP=$(mktemp -d "$OUT/.tmp.XXXX")
trap 'rm -rf "$TMP"' EXIT

want() { local b; for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if want kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  ldflags=$(k8s_ldflags)
  log "kubernetes $K8S_VERSION: kube-apiserver kube-controller-manager kube-scheduler kubectl"
  (cd "$HERE/kubernetes" && go build -ldflags "$ldflags" -o "$TMP/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  log "kubernetes done"
fi
if want etcd; then
  log "etcd $ETCD_VERSION"
  (cd "$HERE/etcd" && go build -ldflags "-s -w" -o "$TMP/etcd" .)
  log "etcd done"
fi
if want kwok; then
  log "kwok $KWOK_VERSION"
  GOBIN="$TMP" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if want helm; then
  log "helm $HELM_VERSION"
  # As helm's Makefile does: the default Kubernetes version (used by `helm template` and lint
  # when no cluster is asked) is 1.<client-go minor>, else it falls back to v1.20.
  helm_gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  kminor=$(awk '$1=="k8s.io/client-go" {split($2, v, "."); print v[2]}' "$helm_gomod")
  hflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    hflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
  done
  GOBIN="$TMP" go install -ldflags "$hflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
for b in "${missing[@]}"; do mv -f "$TMP/$b" "$OUT/$b"; done
log "done: $OUT"
echo "$OUT"
