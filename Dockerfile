# One image for web, worker, beat and agent (compose.yaml picks the command).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY config ./config
COPY audit ./audit
COPY tenants ./tenants
COPY market ./market
COPY telemetry ./telemetry
COPY gpumarket ./gpumarket
COPY templates ./templates
COPY static ./static
COPY manage.py ./
RUN pip install -e . && useradd --create-home gpumarket
RUN SECRET_KEY=build-only GPUMARKET_AUDIT_KEYS=build:build-only-audit-key-never-used-at-run-time \
    GPUMARKET_METRICS_TOKEN=build-only \
    python manage.py collectstatic --noinput
RUN mkdir -p /var/lib/gpumarket/audit /var/cache/gpumarket/numba \
    && chown gpumarket /var/lib/gpumarket/audit /var/cache/gpumarket/numba
USER gpumarket
# The clearing's compiled kernels are compiled by numba on their first call (about 5 s);
# compiled here once, every container's processes load them from this cache instead.
ENV NUMBA_CACHE_DIR=/var/cache/gpumarket/numba
RUN python -c "from market.clearing import warm; warm()"
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"]
