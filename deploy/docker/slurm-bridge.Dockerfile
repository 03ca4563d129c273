# syntax=docker/dockerfile:1
# gpuheal Slurm bridge image. Build from the repository root:
#   docker build -f deploy/docker/slurm-bridge.Dockerfile -t gpuheal-slurm-bridge:dev .
# With Debian's Slurm client commands (scontrol, squeue, scancel) and munge for the `cli` backend:
#   docker build -f deploy/docker/slurm-bridge.Dockerfile --build-arg SLURM_CLIENT=true ...
# (Debian bookworm ships Slurm 22.05: its client must be compatible with your slurmctld; for
# newer Slurm use the `rest` backend against slurmrestd, which needs no client in the image.)
#
# The base is pinned by tag; pin it by digest too for reproducible builds (see operator.Dockerfile).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The build stage's base: the same image unless told (`make images` builds here, where no
# registry is reachable, from bases made of Debian packages: hack/build-images.sh).
ARG BUILD_IMAGE=${PYTHON_IMAGE}

FROM ${BUILD_IMAGE} AS build
ARG UV_VERSION=0.13.9
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never
# uv itself by hash (its manylinux wheels for amd64 and arm64; another UV_VERSION needs its
# own: `pip download uv==X --no-deps --only-binary=:all: --platform ...` and sha256sum)
ARG UV_SHA256="d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe"
RUN printf 'uv==%s' "${UV_VERSION}" > /tmp/uv.txt \
    && for h in ${UV_SHA256}; do printf ' --hash=sha256:%s' "$h" >> /tmp/uv.txt; done \
    && pip install --require-hashes -r /tmp/uv.txt
WORKDIR /src
# The workspace manifests (uv reads every member's pyproject.toml) and the bridge's code only:
# no operator or tooling code, and neither kopf nor a Kubernetes client in the image.
COPY pyproject.toml uv.lock ./
COPY devtools/pyproject.toml devtools/
COPY slurm-bridge/ slurm-bridge/
# gpuheal-slurm-bridge[server]'s dependencies exactly as locked (hashes checked), then its wheel.
RUN uv export --frozen --no-dev --no-emit-workspace --package gpuheal-slurm-bridge --extra server \
        --format requirements-txt > /tmp/requirements.txt \
    && uv build --wheel --package gpuheal-slurm-bridge --out-dir /tmp/dist \
    && uv venv /opt/gpuheal \
    && uv pip install --python /opt/gpuheal/bin/python --compile-bytecode --require-hashes \
        -r /tmp/requirements.txt \
    && uv pip install --python /opt/gpuheal/bin/python --compile-bytecode --no-deps /tmp/dist/*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SLURM_CLIENT=false
LABEL org.opencontainers.image.title="gpuheal-slurm-bridge" \
      org.opencontainers.image.description="gpuheal's Slurm bridge: drain/resume Slurm nodes and requeue their jobs over an authenticated HTTP API" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# hadolint ignore=DL3008
RUN if [ "${SLURM_CLIENT}" = "true" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends slurm-client munge \
        && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /opt/gpuheal /opt/gpuheal
ENV PATH=/opt/gpuheal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
EXPOSE 8787
ENTRYPOINT ["gpuheal-slurm-bridge"]
