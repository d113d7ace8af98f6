# One image for web, worker, beat, migrate and the simulated agent (compose.yaml picks the
# command). The application is installed from its wheel, non-editable, exactly as
# tests/test_packaging.py installs it: what the wheel leaves out is missing here too, and the
# build context is the checkout minus .dockerignore, not a list of directories.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=config.settings \
    GPUMARKET_VAR_DIR=/var/lib/gpumarket/var \
    STATIC_ROOT=/var/lib/gpumarket/static \
    NUMBA_CACHE_DIR=/var/cache/gpumarket/numba
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /dist /tmp/dist
RUN pip install /tmp/dist/gpumarket-*.whl && rm -rf /tmp/dist \
    && useradd --create-home gpumarket
# Settings refuse to load without their secrets; these exist only for this build step.
RUN SECRET_KEY=build-only GPUMARKET_AUDIT_KEYS=build:build-only-audit-key-never-used-at-run-time \
    GPUMARKET_METRICS_TOKEN=build-only \
    gpumarket collectstatic --noinput
RUN mkdir -p /var/lib/gpumarket/var /var/lib/gpumarket/audit /var/cache/gpumarket/numba \
    && chown -R gpumarket /var/lib/gpumarket/var /var/lib/gpumarket/audit /var/cache/gpumarket/numba
USER gpumarket
WORKDIR /home/gpumarket
# The clearing's compiled kernels are compiled by numba on their first call (about 5 s);
# compiled here once, every container's processes load them from NUMBA_CACHE_DIR instead.
RUN python -c "from market.clearing import warm; warm()"
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3"]
