# syntax=docker/dockerfile:1
# procdelta: build a wheel, install it into a venv, run it from a slim image.
#   version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
#   docker build --build-arg VERSION="$version" -t "procdelta:$version" .
#   docker run --rm -v /proc:/host/proc:ro --cap-drop ALL \
#     --cap-add SYS_PTRACE --cap-add DAC_READ_SEARCH -p 9746:9746 \
#     "procdelta:$version" serve --path.procfs=/host/proc
# Both stages start from BASE_IMAGE: a Python 3.11+ image with pip and venv whose python
# is `python` on PATH (e.g. the same image through a registry mirror:
# --build-arg BASE_IMAGE=mirror.example/library/python:3.11.14-slim-bookworm). The build
# stage fetches the build backend and the dependencies from the package index.
# tests/test_container.py builds it and runs it as the Helm chart's DaemonSet does.

ARG BASE_IMAGE=python:3.11.14-slim-bookworm

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY collector ./collector
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/procdelta \
 && /opt/procdelta/bin/pip install --no-cache-dir /wheels/*.whl

FROM ${BASE_IMAGE}
# The project's version is pyproject.toml's; the image is labelled with what the build passes.
ARG VERSION=unknown
LABEL org.opencontainers.image.title="procdelta" \
      org.opencontainers.image.description="Per-pod process counters for Prometheus, with deltas taken on the node" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/procdelta /opt/procdelta
ENV PATH="/opt/procdelta/bin:$PATH" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# It runs as uid 0 but with no privileges beyond two capabilities, granted by the
# runtime (deploy/daemonset.yaml drops ALL and adds these): /proc/<pid>/io of another
# user's process is mode 0400 (CAP_DAC_READ_SEARCH passes it) and is guarded by the
# kernel's ptrace-read access check (CAP_SYS_PTRACE passes it; procdelta never calls
# ptrace). Kubernetes grants added capabilities only to uid 0, so a non-root user
# here would lose them and read only its own processes' io.
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9746
ENTRYPOINT ["procdelta"]
CMD ["serve", "--path.procfs=/host/proc"]
