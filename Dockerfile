# syntax=docker/dockerfile:1
# loadlens: serve (sim or OpenAI proxy), gpu-exporter, pager, load. Multi-stage: build a venv, copy it
# into a slim runtime that runs as an unprivileged user (uid 10001).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/loadlens
COPY pyproject.toml README.md ./
COPY loadlens ./loadlens
COPY exporters ./exporters
COPY loadgen ./loadgen
RUN /opt/loadlens/bin/pip install --no-cache-dir '.[all]'

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="loadlens" \
      org.opencontainers.image.source="https://github.com/loadlens/loadlens" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 loadlens \
    && useradd --system --uid 10001 --gid loadlens --home-dir /data --create-home --shell /usr/sbin/nologin loadlens
COPY --from=build /opt/loadlens /opt/loadlens
ENV PATH=/opt/loadlens/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LOADLENS_HOST=0.0.0.0
USER 10001:10001
WORKDIR /data
# serve, gpu-exporter, pager, load metrics, Locust UI, Locust master
EXPOSE 8000 9400 9095 9646 8089 5557
ENTRYPOINT ["loadlens"]
CMD ["--help"]
