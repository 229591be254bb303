# Toolbooth: the sidecar and the plugins bundled under plugins/, on a slim Python, as a non-root user.
#
#   docker build -t toolbooth:0.1.0 .                        # EXTRAS=mcp (the MCP endpoint) by default
#   docker build --build-arg EXTRAS= -t toolbooth:0.1.0 .    # without optional extras
#
# The root filesystem can be read-only: the state (SQLite store, journal, audit checkpoint) goes to
# $XDG_STATE_HOME/toolbooth = /var/lib/toolbooth and the Unix socket to $XDG_RUNTIME_DIR/toolbooth =
# /run/toolbooth, both volumes; mount a writable /tmp too. Configuration is a file given to `serve`
# (docs/operations.md, "Deploy"): docker run ... toolbooth:0.1.0 --config /etc/toolbooth/toolbooth.yaml
# The dependencies' versions are those of constraints.txt (bash .ci/image-constraints rewrites it).
# Debian 12 (glibc 2.36): some dependencies ship wheels for glibc 2.34 and later only.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: wheels of toolbooth, of every plugin under plugins/, and of all their dependencies ---------
FROM ${PYTHON_IMAGE} AS builder
ARG EXTRAS=mcp
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY sidecar/ sidecar/
COPY policies/ policies/
COPY plugins/ plugins/
RUN python -m pip wheel --constraint constraints.txt --wheel-dir /wheels ".${EXTRAS:+[${EXTRAS}]}" plugins/*/

# --- runtime: the wheels installed, nothing else of the build ---------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="toolbooth" \
      org.opencontainers.image.description="Policy-as-code sidecar for AI-agent tool calls" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib XDG_RUNTIME_DIR=/run
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m pip install --no-index /wheels/*.whl \
 && groupadd --system --gid 10001 toolbooth \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin toolbooth \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/toolbooth /run/toolbooth
VOLUME ["/var/lib/toolbooth", "/run/toolbooth"]
USER 10001:10001
WORKDIR /var/lib/toolbooth
STOPSIGNAL SIGTERM
# SERVING from gRPC health on the socket the default listen address makes ($XDG_RUNTIME_DIR/toolbooth); no token.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["python", "-c", "import grpc, sys; \
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
channel = grpc.insecure_channel('unix:///run/toolbooth/toolbooth.sock'); \
sys.exit(g.HealthStub(channel).Check(h.HealthCheckRequest(), timeout=4).status != h.HealthCheckResponse.SERVING)"]
ENTRYPOINT ["toolbooth", "serve"]
