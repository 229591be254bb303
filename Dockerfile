# Toolbooth: the sidecar and the plugins bundled under plugins/, on Debian 12's Python and nothing else, as a
# non-root user.
#
#   docker build -t toolbooth:0.1.0 .                        # EXTRAS=mcp (the MCP endpoint) by default
#   docker build --build-arg EXTRAS= -t toolbooth:0.1.0 .    # without optional extras
#
# The root filesystem can be read-only: the state (SQLite store, journal, audit checkpoint) goes to
# $XDG_STATE_HOME/toolbooth = /var/lib/toolbooth and the Unix socket to $XDG_RUNTIME_DIR/toolbooth =
# /run/toolbooth, both volumes; mount a writable /tmp too. Configuration is a file given to `serve`
# (docs/operations.md, "Deploy"): docker run ... toolbooth:0.1.0 --config /etc/toolbooth/toolbooth.yaml
# The dependencies' versions are those of constraints.txt (bash .ci/image-constraints rewrites it).
# The builder's base: Debian 12 (glibc 2.36; some dependencies ship wheels for glibc 2.34 and later only), whose
# python3.11 packages the runtime is made of; python3-venv, python3-pip, ca-certificates and tini are installed with
# apt unless it has pip and tini. Not an image whose Python is not Debian's (python:3.11-slim's is in /usr/local).
ARG PYTHON_IMAGE=debian:bookworm-slim

# --- builder: toolbooth, every plugin under plugins/ and their dependencies in a virtualenv; the runtime's root --
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
RUN { python3.11 -m pip --version && command -v tini; } >/dev/null 2>&1 || { apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3-venv python3-pip ca-certificates tini >/dev/null; } \
 && python3.11 -m pip wheel --constraint constraints.txt --wheel-dir /wheels ".${EXTRAS:+[${EXTRAS}]}" plugins/*/ \
 && python3.11 -m venv --without-pip /opt/toolbooth \
 && python3.11 -m pip --python /opt/toolbooth/bin/python install --no-index --no-compile /wheels/*.whl \
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
# The runtime's root, /rootfs: the files of the Debian packages a Python 3.11 process needs (those distroless's
# python3-debian12 is made of, its base's, cc's and python3's, less netbase, libgomp1 and python3-distutils), as
# installed here (paths under the merged /usr), with what their scripts made (the CA bundle, the standard library's
# bytecode), OpenSSL's default paths to that bundle (links of the openssl package in /usr/lib/ssl) and the C.UTF-8
# locale (libc-bin's) the image's LANG names, the python3 link, a passwd and group of root, nobody and the image's
# user (libpq and getpass look its name up), no documentation but the copyrights: no shell, coreutils, package
# manager or pip; tini is PID 1 (it passes signals on, even while the sidecar starts, and reaps what `kubectl exec`
# leaves). /out holds the state and socket directories, empty.
ARG RUNTIME_PACKAGES="base-files libc6 libssl3 ca-certificates tzdata libgcc-s1 libstdc++6 tini python3.11-minimal \
libpython3.11-minimal libpython3.11-stdlib libbz2-1.0 libdb5.3 libexpat1 liblzma5 libsqlite3-0 libuuid1 libncursesw6 \
libtinfo6 zlib1g libcom-err2 libcrypt1 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 libnsl2 \
libreadline8 libtirpc3 libtirpc-common libffi8"
RUN dpkg-query --show $RUNTIME_PACKAGES >/dev/null \
 && for package in $RUNTIME_PACKAGES; do dpkg-query --listfiles "$package"; done \
    | sed -E 's#^/(bin|sbin|lib|lib64)(/|$)#/usr/\1\2#' | sort -u | while read -r path; do \
        if [ "$path" != / ] && { [ -e "$path" ] || [ -L "$path" ]; }; then echo ".$path"; fi; done > /tmp/files \
 && mkdir -m 0755 /rootfs && tar -C / --no-recursion -cf - -T /tmp/files | tar -C /rootfs -xf - \
 && cd / && find usr/lib/python3.11 -path '*/__pycache__*' -print0 | tar --null -cf - -T - | tar -C /rootfs -xf - \
 && cp -a /etc/ssl/certs /rootfs/etc/ssl/ \
 && mkdir /rootfs/usr/lib/ssl && cp -a /usr/lib/ssl/cert.pem /usr/lib/ssl/certs /rootfs/usr/lib/ssl/ \
 && mkdir /rootfs/usr/lib/locale && cp -a /usr/lib/locale/C.utf8 /rootfs/usr/lib/locale/ \
 && cp -a /bin /sbin /lib /lib64 /rootfs/ \
 && ln -s python3.11 /rootfs/usr/bin/python3 \
 && printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'toolbooth:x:10001:10001:toolbooth:/nonexistent:/sbin/nologin' > /rootfs/etc/passwd \
 && printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' 'toolbooth:x:10001:' > /rootfs/etc/group \
 && install -d -m 0755 /rootfs/dev /rootfs/proc /rootfs/sys /rootfs/run /rootfs/var/lib /rootfs/root \
 && install -d -m 1777 /rootfs/tmp \
 && find /rootfs/usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete \
 && find /rootfs/usr/share/doc -mindepth 1 -type d -empty -delete \
 && rm -rf /rootfs/usr/share/man /rootfs/usr/share/info /rootfs/usr/share/locale /rootfs/usr/share/lintian \
 && mkdir -p /out/state /out/socket

# --- runtime: that root, the virtualenv and the two directories; nothing else of the build -----------------------
FROM scratch AS runtime
LABEL org.opencontainers.image.title="toolbooth" \
      org.opencontainers.image.description="Policy-as-code sidecar for AI-agent tool calls" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/toolbooth/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8 \
    XDG_STATE_HOME=/var/lib XDG_RUNTIME_DIR=/run \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
COPY --from=builder /rootfs /
COPY --from=builder /opt/toolbooth /opt/toolbooth
COPY --from=builder --chown=10001:10001 --chmod=0750 /out/state /var/lib/toolbooth
COPY --from=builder --chown=10001:10001 --chmod=0750 /out/socket /run/toolbooth
VOLUME ["/var/lib/toolbooth", "/run/toolbooth"]
USER 10001:10001
WORKDIR /var/lib/toolbooth
STOPSIGNAL SIGTERM
# SERVING from gRPC health on the socket the default listen address makes ($XDG_RUNTIME_DIR/toolbooth); no token.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["python", "-c", "import grpc, sys; \
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; \
channel = grpc.insecure_channel('unix:///run/toolbooth/toolbooth.sock'); \
sys.exit(g.HealthStub(channel).Check(h.HealthCheckRequest(), timeout=4).status != h.HealthCheckResponse.SERVING)"]
ENTRYPOINT ["tini", "--", "toolbooth", "serve"]
