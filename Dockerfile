# syntax=docker/dockerfile:1
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# The image runs `specwatch run` and `check` only: the demo (exporter/demo, the `demo` extra) starts
# llama-servers and builds llama.cpp, which has no place in a monitoring container.
RUN rm -rf exporter/demo && pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="specwatch" \
      org.opencontainers.image.description="Prometheus exporter that catches llama-server fleets serving fill-in logprobs"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels /wheels/specwatch-*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin specwatch
USER 10001:10001
ENV PYTHONUNBUFFERED=1
EXPOSE 9824
# /-/healthy needs no credentials even with --web-config basic auth. Plain http first, then https (with
# tls_server_config; the certificate is not checked: this is the container talking to itself). With
# client_auth_type RequireAndVerifyClientCert it cannot connect: use your orchestrator's TCP check instead.
HEALTHCHECK --interval=30s --timeout=6s CMD ["python", "-c", "import ssl, sys, urllib.request\nfor url in ('http://127.0.0.1:9824/-/healthy', 'https://127.0.0.1:9824/-/healthy'):\n    try:\n        urllib.request.urlopen(url, timeout=2, context=ssl._create_unverified_context())\n        sys.exit(0)\n    except Exception:\n        pass\nsys.exit(1)"]
ENTRYPOINT ["specwatch", "run"]
CMD ["--listen", ":9824"]
