# syntax=docker/dockerfile:1
# gpuheal operator image. Build from the repository root:
#   docker build -f deploy/docker/operator.Dockerfile -t gpuheal:dev .
#
# The base is pinned by tag. For reproducible builds pin it by digest as well:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # -> sha256:...
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:... ...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The build stage's base: the same image unless told (`make images` builds here, where no
# registry is reachable, from bases made of Debian packages: hack/build-images.sh).
ARG BUILD_IMAGE=${PYTHON_IMAGE}

# --- build: the wheel and a virtualenv with the locked dependencies --------------------------
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
COPY pyproject.toml uv.lock README.md ./
COPY operator/ operator/
COPY slurm-bridge/ slurm-bridge/
# The tooling's manifest only: uv reads every workspace member's pyproject.toml; no tooling code.
COPY devtools/pyproject.toml devtools/
# The operator's runtime dependencies exactly as locked (hashes checked), then two wheels without
# deps: the operator and the bridge's base (API models + client; not its server).
RUN uv export --frozen --no-dev --no-emit-workspace --package gpuheal --format requirements-txt \
        > /tmp/requirements.txt \
    && uv build --wheel --package gpuheal --out-dir /tmp/dist \
    && uv build --wheel --package gpuheal-slurm-bridge --out-dir /tmp/dist \
    && uv venv /opt/gpuheal \
    && uv pip install --python /opt/gpuheal/bin/python --compile-bytecode --require-hashes \
        -r /tmp/requirements.txt \
    && uv pip install --python /opt/gpuheal/bin/python --compile-bytecode --no-deps /tmp/dist/*.whl
# kubernetes >= 37 ships a second asyncio client, kubernetes.aio (66 MB, a third of the
# virtualenv): gpuheal's CLI uses the sync client and the operator kubernetes_asyncio, and
# nothing imports kubernetes.aio (tests/images imports every gpuheal module in the image).
RUN rm -rf /opt/gpuheal/lib/python3*/site-packages/kubernetes/aio

# --- runtime: the virtualenv only, as a non-root user -----------------------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpuheal" \
      org.opencontainers.image.description="Kubernetes operator that remediates GPU node faults (NVIDIA XIDs): cordon, drain, Slurm requeue, replacement" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=build /opt/gpuheal /opt/gpuheal
ENV PATH=/opt/gpuheal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# No shell login, no home to write: the chart mounts an emptyDir at /tmp and sets a read-only root.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 9090
ENTRYPOINT ["gpuheal"]
CMD ["run", "--help"]
