# Any Debian-based image whose python3 (3.11 or later) has the venv module will do: the official python images, or
# Debian's own (python3, python3-venv, ca-certificates). specwatch goes into a virtual environment of its own, never
# into the base's interpreter. Builds with the classic builder; RUN steps fetch from the package index.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# The image runs `specwatch run` and `check` only: the demo (exporter/demo, the `demo` extra) starts
# llama-servers and builds llama.cpp, which has no place in a monitoring container. The runtime dependencies are
# listed apart, so the final stage installs them in a layer that code changes leave cached.
RUN rm -rf exporter/demo \
    && python3 -m venv .venv \
    && .venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir wheels . \
    && rm -rf .venv \
    && python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
       > requirements.txt

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="specwatch" \
      org.opencontainers.image.description="Prometheus exporter that catches llama-server fleets serving fill-in logprobs"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /src/requirements.txt /tmp/specwatch/
# setuptools only builds packages: nothing here needs it at run time.
RUN python3 -m venv /opt/specwatch \
    && /opt/specwatch/bin/pip install --no-cache-dir --requirement /tmp/specwatch/requirements.txt \
    && /opt/specwatch/bin/pip uninstall --yes setuptools \
    && groupadd --system --gid 10001 specwatch \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin specwatch
COPY --from=build /src/wheels/ /tmp/specwatch/
RUN /opt/specwatch/bin/pip install --no-cache-dir /tmp/specwatch/specwatch-*.whl \
    && /opt/specwatch/bin/pip check \
    && rm -rf /tmp/specwatch
USER 10001:10001
# Nothing is written at run time (bytecode was compiled at install), so the root file system can be read-only.
ENV PATH=/opt/specwatch/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
EXPOSE 9824
# GET /-/healthy, which needs no credentials even with --web-config basic auth, on the address specwatch really
# listens on (read from /proc, so --listen and --network host need no change here), plain HTTP then TLS. A stopped or
# hung process gets no answer within 2 s and is unhealthy. With client_auth_type RequireAndVerifyClientCert it cannot
# connect: use your orchestrator's TCP check instead.
HEALTHCHECK --interval=30s --timeout=6s --start-period=10s CMD ["python", "-m", "specwatch.daemon.healthcheck"]
ENTRYPOINT ["specwatch", "run"]
CMD ["--listen", ":9824"]
