# The disagg operator image: `disagg run` (kopf) as a non-root user on a read-only root filesystem.
# Build from the repository root:  docker build -t disagg/operator:0.1.0 .
# tests/unit/test_package_install.py checks what this image runs (a clean virtual environment installs the
# package from the repository; `disagg run --help` and `disagg crds --check` work there), since no
# container engine runs in CI.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --gid 65532 disagg \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin disagg
COPY --from=build /wheels /wheels
# The core only: the twin extra (disagg[twin]: simulator, live twin, local cluster, demo) stays out.
RUN pip install --no-cache-dir --no-index --find-links /wheels disagg && rm -rf /wheels
# The CRDs the image's `disagg crds --check` compares against (and that a user can apply from the image).
COPY crds/ /opt/disagg/crds/
WORKDIR /opt/disagg
USER 65532:65532
# 8080: kopf liveness endpoint (probes); 9090: operator metrics.
EXPOSE 8080 9090
ENTRYPOINT ["disagg", "run"]
