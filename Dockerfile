# The egoline service image: one image, every `egoline serve <stage>` and the one-shot init.
# Endpoints and credentials come only from the environment (EGOLINE_*), so the same image runs
# under compose, on Kubernetes and against the embedded stack (docs/deploy.md).
#
# Build from the repository root:  docker build -t egoline:local .
# The base is pinned to an exact tag; pin it by digest as well where the registry is reachable:
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: a virtual environment with egoline and its pinned dependencies ------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/egoline
WORKDIR /src
COPY pyproject.toml requirements.lock README.md ./
COPY schemas ./schemas
COPY services ./services
# requirements.lock pins every transitive version; the embedded stack (an extra) stays out.
RUN /opt/egoline/bin/pip install --no-cache-dir -c requirements.lock . \
    && /opt/egoline/bin/egoline --help >/dev/null

# --- runtime: the virtual environment and an unprivileged user, nothing else ----------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="egoline" \
      org.opencontainers.image.description="egoline pipeline services" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 egoline \
    && useradd --system --uid 10001 --gid egoline --create-home --home-dir /home/egoline \
       --shell /usr/sbin/nologin egoline
COPY --from=build /opt/egoline /opt/egoline
ENV PATH=/opt/egoline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    EGOLINE_METRICS_HOST=0.0.0.0 \
    EGOLINE_STACK_DIR=/tmp/egoline-stack
USER 10001:10001
WORKDIR /home/egoline
# 9400: a stage's /metrics, /healthz, /readyz; 9308: the lag service and its page
EXPOSE 9400 9308
ENTRYPOINT ["egoline"]
CMD ["--help"]
