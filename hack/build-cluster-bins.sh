#!/usr/bin/env bash
# Builds the sandbox's upstream binaries into ~/.cache/gpuheal/bin/<versions>/ and prints that
# directory on stdout (last line). A no-op when every binary is already there.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  <- hack/kubernetes (k8s.io/kubernetes)
#   etcd                                                             <- hack/etcd (go.etcd.io/etcd/server/v3)
#   kwok, helm                                                       <- go install at pinned versions
# Progress goes to stderr. Env: GPUHEAL_CACHE (default ~/.cache/gpuheal).
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
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

want() { local b; for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if want kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
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
