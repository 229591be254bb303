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
# The runtime stage's base, the builder's by default: the same Python at the same path (the virtualenv
# links to it), needing no pip (the tests run it on a Debian base without pip: .ci/image-tools).
ARG RUNTIME_IMAGE=${PYTHON_IMAGE}

# --- builder: toolbooth, every plugin under plugins/ and their dependencies in a virtualenv ---------------
FROM ${PYTHON_IMAGE} AS builder
ARG EXTRAS=mcp
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY sidecar/ sidecar/
COPY policies/ policies/
COPY plugins/ plugins/
# The wheels, installed into /opt/toolbooth: a virtualenv without pip, setuptools or wheel, and without the
# bytecode pip would compile for every module (29 MB). The bytecode kept is that of what start-up imports (12 MB):
# the sidecar is started once, with JWT auth, metrics, the health port and, with the mcp extra, the MCP endpoint,
# and asked for its tools with the CLI (the build fails if it does not answer within a minute). A module first
# imported later is compiled when it is (at each start: the root is read-only).
RUN python -m pip wheel --constraint constraints.txt --wheel-dir /wheels ".${EXTRAS:+[${EXTRAS}]}" plugins/*/ \
 && python3 -m venv --without-pip /opt/toolbooth \
 && python -m pip --python /opt/toolbooth/bin/python install --no-index --no-compile /wheels/*.whl \
 && export PATH=/opt/toolbooth/bin:$PATH TOOLBOOTH_CONFIG=/tmp/warm-up/toolbooth.yaml && mkdir /tmp/warm-up \
 && printf '%s\n' "auth: {jwt: {algorithms: [HS256], issuer: warm-up, audience: toolbooth, \
key: $(python -c 'import secrets; print(secrets.token_hex(32))')}}" \
        'server: {listen: ["unix:///tmp/warm-up/toolbooth.sock"], health_listen: "127.0.0.1:0"}' \
        'metrics: {listen: "127.0.0.1:0"}' 'store: {sqlite_path: /tmp/warm-up/toolbooth.db}' 'log_level: ERROR' \
        > "$TOOLBOOTH_CONFIG" \
 && case ",$EXTRAS," in *,mcp,*) echo 'mcp: {listen: "127.0.0.1:0"}' >> "$TOOLBOOTH_CONFIG";; esac \
 && { toolbooth serve & serve=$!; } && trap 'kill $serve 2>/dev/null || true' EXIT \
 && TOOLBOOTH_TOKEN=$(toolbooth token --subject warm-up --role developer) && export TOOLBOOTH_TOKEN && tries=0 \
 && until toolbooth tools list >/dev/null; do tries=$((tries + 1)); [ $tries -lt 60 ] || exit 1; sleep 1; done \
 && kill -TERM $serve && wait $serve && rm -rf /tmp/warm-up

# --- runtime: the virtualenv, nothing else of the build ---------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
LABEL org.opencontainers.image.title="toolbooth" \
      org.opencontainers.image.description="Policy-as-code sidecar for AI-agent tool calls" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/toolbooth/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib XDG_RUNTIME_DIR=/run
RUN --mount=type=bind,from=builder,source=/opt/toolbooth,target=/mnt/toolbooth \
    cp -a /mnt/toolbooth /opt/toolbooth \
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
