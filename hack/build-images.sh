#!/usr/bin/env bash
# Builds gpuheal's two images with buildah (no Docker daemon, no registry) and writes each as a
# docker-archive tar that containerd, podman and docker load:
#   ~/.cache/gpuheal/images/gpuheal.tar               gpuheal:<appVersion>   (operator + agent)
#   ~/.cache/gpuheal/images/gpuheal-slurm-bridge.tar  gpuheal-slurm-bridge:<appVersion>
#                                                     (built with SLURM_CLIENT=true)
# Load one into a kubelet's containerd with
#   ctr -n k8s.io images import ~/.cache/gpuheal/images/gpuheal.tar
# (the tar's tag is docker.io/library/gpuheal:<appVersion>, what the chart's default
# `image.repository: gpuheal` resolves to). The paths above are symlinks to tars named by a key.
#
# No base image can be pulled here, so the bases are made from Debian packages with mmdebstrap
# and given to the repository's Dockerfiles as build arguments (users' `docker build` keeps the
# public python:3.11-slim-bookworm):
#   build        minbase + python3 + python3-pip: the Dockerfiles' build stage (pip installs uv)
#   python-apt   minbase + python3: the bridge's runtime (its Dockerfile apt-gets the Slurm client)
#   python       python3 and the libraries it loads, nothing else (no shell, no apt, no dpkg):
#                the operator's runtime; the chart runs only `gpuheal` and `python` in it
# Caching (like hack/build-cluster-bins.sh): the bases are keyed by this script and the dates of
# Debian's bookworm, bookworm-updates and bookworm-security Release files (a new point release
# or security fix makes new bases); each image by its Dockerfile, its base keys, uv.lock and the
# files its build context copies. A warm run only checks the keys.
# Progress goes to stderr; the last line on stdout is the images folder.
# Env: GPUHEAL_CACHE (default ~/.cache/gpuheal), GPUHEAL_DEBIAN_MIRROR, GPUHEAL_SECURITY_MIRROR.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
CACHE=${GPUHEAL_CACHE:-$HOME/.cache/gpuheal}
OUT="$CACHE/images"
# buildah's own storage, apart from the machine's /var/lib/containers (other tools use that).
STORE=(--root "$OUT/storage" --runroot "/run/gpuheal-images-$(id -u)" --storage-driver overlay)
MIRROR=${GPUHEAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${GPUHEAL_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
VERSION=$(awk '$1=="appVersion:" {gsub(/"/, "", $2); print $2}' "$ROOT/deploy/helm/gpuheal/Chart.yaml")

log() { printf '[build-images %4ds] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }
hash_of() { sha256sum | cut -c1-12; }
mb() { echo "$(($(stat -c %s "$1") / 1000000)) MB"; }  # as podman and docker count (10^6)

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap's root mode and buildah's overlay storage)"
# The builders, and podman + runc that tests/integration/test_images.py runs the images with.
need=()
for tool in buildah mmdebstrap podman runc curl; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  log "installing from Debian: ${need[*]}"
  # /tmp/apt.lock: where several builds share a machine, one apt at a time.
  export DEBIAN_FRONTEND=noninteractive
  flock /tmp/apt.lock apt-get update -qq
  flock /tmp/apt.lock apt-get install -y -qq --no-install-recommends buildah mmdebstrap podman \
    runc uidmap curl ca-certificates >/dev/null
fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9  # two builds at once would race for the same tars

# ---- Debian bases ---------------------------------------------------------------------------
has_image() { buildah "${STORE[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# Packages the python base keeps: python3's run-time closure less what only installs or
# manages packages (dpkg, apt, debconf, perl, the shell and the coreutils behind it).
KEEP_PKGS='^(base-files|base-passwd|netbase|media-types|tzdata|ca-certificates|libc6|libgcc-s1|libstdc\+\+6|libssl3|libffi8|zlib1g|libexpat1|libbz2-1\.0|liblzma5|libzstd1|libsqlite3-0|libncursesw6|libtinfo6|libreadline8|readline-common|libuuid1|libdb5\.3|libgdbm6|libgdbm-compat4|libnsl2|libtirpc3|libtirpc-common|libgssapi-krb5-2|libkrb5-3|libkrb5support0|libk5crypto3|libcom-err2|libkeyutils1|libcrypt1|libmpdec3|python3|python3-minimal|python3\.11|python3\.11-minimal|libpython3\.11-minimal|libpython3\.11-stdlib|libpython3-stdlib)$'

make_bases() {
  local tmp="$OUT/.base-tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  log "Debian $SUITE root: minbase + python3 + python3-pip (mmdebstrap, ~1-2 min)"
  # No docs, man pages, locales: nothing in the images reads them (copyright files stay).
  mmdebstrap --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=python3,python3-pip,ca-certificates,netbase \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*' \
    "$SUITE" "$tmp/root" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY $SUITE-security main" >"$tmp/mmdebstrap.log" 2>&1 \
    || { tail -20 "$tmp/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $tmp/mmdebstrap.log)"; }
  # pip installs uv into the build stage: Debian's PEP 668 marker would refuse that.
  rm -f "$tmp/root"/usr/lib/python3.*/EXTERNALLY-MANAGED
  tar -C "$tmp/root" -cf "$tmp/build.tar" .
  import_base "$tmp/build.tar" "$BASE_BUILD" \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  log "python-apt base: the same root without pip"
  chroot "$tmp/root" dpkg --purge python3-pip python3-setuptools python3-wheel python3-pkg-resources \
    python3-distutils python3-lib2to3 >>"$tmp/mmdebstrap.log" 2>&1
  tar -C "$tmp/root" -cf "$tmp/python-apt.tar" .
  import_base "$tmp/python-apt.tar" "$BASE_APT"
  log "python base: python3's files only"
  local pkg keep=() drop=() admin="$tmp/root/var/lib/dpkg"
  while read -r pkg; do
    if [[ "$pkg" =~ $KEEP_PKGS ]]; then keep+=("$pkg"); else drop+=("$pkg"); fi
  done < <(dpkg-query --admindir="$admin" -W -f='${Package}\n')
  # The files of every dropped package (listed before any goes), then the package databases;
  # folders and links to folders stay (packages share them; /lib64 -> usr/lib64 holds the loader).
  dpkg-query --admindir="$admin" -L "${drop[@]}" | sort -u >"$tmp/drop.list"
  while read -r f; do
    [ -d "$tmp/root$f" ] || rm -f "$tmp/root$f"
  done <"$tmp/drop.list"
  rm -rf "$tmp/root"/var/lib/dpkg "$tmp/root"/var/lib/apt "$tmp/root"/var/cache/* \
    "$tmp/root"/etc/apt "$tmp/root"/usr/share/perl* "$tmp/root"/usr/lib/x86_64-linux-gnu/perl*
  [ -x "$tmp/root/usr/bin/python3" ] || die "python base lost python3"
  if [ -e "$tmp/root/bin/sh" ] || [ -e "$tmp/root/usr/bin/dpkg" ]; then
    die "python base still has a shell or dpkg: KEEP_PKGS keeps too much"
  fi
  tar -C "$tmp/root" -cf "$tmp/python.tar" .
  import_base "$tmp/python.tar" "$BASE_PY"
  log "bases kept: ${keep[*]}"
  rm -f "$OUT"/base-*.key
  echo "$BASE_KEY" >"$OUT/base-$BASE_KEY.key"
  rm -rf "$tmp"
  # Older bases: their images go (the images built on them keep their layers until rebuilt).
  buildah "${STORE[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/gpuheal-base/' \
    | grep -v ":$BASE_KEY\$" | xargs -r buildah "${STORE[@]}" rmi >/dev/null 2>&1 || true
}

# A root filesystem tar -> a local image with the same environment as python:3.11-slim.
import_base() {
  local tar=$1 name=$2 ctr
  shift 2
  ctr=$(buildah "${STORE[@]}" from scratch)
  buildah "${STORE[@]}" add --quiet "$ctr" "$tar" / >/dev/null
  buildah "${STORE[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$@" \
    --label "org.opencontainers.image.description=Debian $SUITE + python3 (gpuheal's local base)" \
    "$ctr"
  buildah "${STORE[@]}" commit --quiet --rm "$ctr" "$name" >/dev/null
  log "base $name: $(mb "$tar")"
}

# Release dates of the three suites: they change only when Debian publishes new packages there.
release_dates() {
  local url
  for url in "$MIRROR/dists/$SUITE/Release" "$MIRROR/dists/$SUITE-updates/Release" \
      "$SECURITY/dists/$SUITE-security/Release"; do
    curl -fsS --max-time 20 "$url" | sed -n 's/^Date: //p' | head -1
  done
}
if dates=$(release_dates) && [ "$(wc -l <<<"$dates")" = 3 ]; then
  # What the bases are made of: their functions below, the kept packages, the suites' dates.
  BASE_KEY=$( { declare -f make_bases import_base; echo "$KEEP_PKGS $SUITE $MIRROR $SECURITY"
    echo "$dates"; } \
    | hash_of)
  echo "$dates" >"$OUT/.debian-dates"
else
  # Offline: keep using the newest bases built, which were right when they were built.
  last=$(ls -t "$OUT"/base-*.key 2>/dev/null | head -1 || true)
  [ -n "$last" ] || die "cannot read Debian's Release files and no base is cached"
  BASE_KEY=$(cat "$last")
  log "Debian's Release files unreachable: reusing the bases $BASE_KEY"
fi
BASE_BUILD="localhost/gpuheal-base/build:$BASE_KEY"
BASE_APT="localhost/gpuheal-base/python-apt:$BASE_KEY"
BASE_PY="localhost/gpuheal-base/python:$BASE_KEY"

if has_image "$BASE_BUILD" && has_image "$BASE_APT" && has_image "$BASE_PY"; then
  log "bases cached: $BASE_KEY"
else
  make_bases
fi

# ---- images ---------------------------------------------------------------------------------
# The key of an image: everything its build reads (the bases by their keys, in the build
# arguments). The context files are those its
# .dockerignore lets through (tracked or not, as git sees the worktree).
image_key() {
  local dockerfile=$1 base_args=$2
  shift 2
  {
    declare -f build_image
    cat "$dockerfile" "$dockerfile.dockerignore"
    echo "$base_args $VERSION"
    (cd "$ROOT" && git ls-files -co --exclude-standard -z -- "$@" | sort -z \
      | xargs -0 sha256sum)
  } | hash_of
}

# The host's CA bundle, mounted (never copied) into the build's RUN steps: where HTTPS goes
# through an inspecting proxy, pip and uv need its CA to reach the package index.
CA_MOUNT=()
[ -f /etc/ssl/certs/ca-certificates.crt ] \
  && CA_MOUNT=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)

build_image() {
  local name=$1 dockerfile=$2 runtime_base=$3
  shift 3
  local args=(--build-arg "PYTHON_IMAGE=$runtime_base" --build-arg "BUILD_IMAGE=$BASE_BUILD")
  local paths=()
  while [ $# -gt 0 ]; do
    if [ "$1" = -- ]; then shift; paths=("$@"); break; fi
    args+=(--build-arg "$1"); shift
  done
  local key tag="docker.io/library/$name:$VERSION"
  key=$(image_key "$ROOT/$dockerfile" "${args[*]}" "${paths[@]}")
  local tar="$OUT/$name-$key.tar" log="$OUT/$name-$key.log"
  if [ -s "$tar" ]; then
    log "$name cached: $tar ($(mb "$tar"))"
  else
    log "$name: buildah bud -f $dockerfile (log: $log)"
    buildah "${STORE[@]}" bud --pull-never --runtime runc --network host --format docker "${CA_MOUNT[@]}" \
      -f "$ROOT/$dockerfile" --ignorefile "$ROOT/$dockerfile.dockerignore" \
      "${args[@]}" --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" \
      -t "$tag" "$ROOT" >"$log" 2>&1 &
    local pid=$! n=0
    # buildah prints each step as it starts: show them as they come.
    while kill -0 "$pid" 2>/dev/null; do
      sleep 2
      local steps
      steps=$(grep -E '^(STEP|\[[0-9]/[0-9]\] STEP)' "$log" || true)
      if [ "$(wc -l <<<"$steps")" -gt "$n" ]; then
        tail -n +"$((n + 1))" <<<"$steps" | cut -c1-110 | while read -r l; do log "  $l"; done
        n=$(wc -l <<<"$steps")
      fi
    done
    wait "$pid" || { tail -30 "$log" >&2; die "$name: build failed (log: $log)"; }
    rm -f "$tar.tmp"
    buildah "${STORE[@]}" push --quiet "$tag" "docker-archive:$tar.tmp:$tag" >/dev/null
    mv "$tar.tmp" "$tar"
    log "$name built: $tar ($(mb "$tar"))"
  fi
  ln -sfn "$(basename "$tar")" "$OUT/$name.tar"
  # Older builds of this image: their tars and logs (the storage keeps its layers until pruned).
  find "$OUT" -maxdepth 1 -regextype posix-extended -regex ".*/$name-[0-9a-f]{12}\.(tar|log)" \
    ! -name "$(basename "$tar")" ! -name "$(basename "$log")" -delete
}

build_image gpuheal deploy/docker/operator.Dockerfile "$BASE_PY" \
  -- pyproject.toml uv.lock README.md operator slurm-bridge devtools/pyproject.toml
build_image gpuheal-slurm-bridge deploy/docker/slurm-bridge.Dockerfile "$BASE_APT" SLURM_CLIENT=true \
  -- pyproject.toml uv.lock slurm-bridge devtools/pyproject.toml
buildah "${STORE[@]}" rmi --prune >/dev/null 2>&1 || true
echo "$OUT"
