"""Settings, all from the environment.

The defaults are the embedded demo: SQLite under ``var/``, a filesystem broker that needs no
server, ``DEBUG`` on. Production sets ``DATABASE_URL`` (PostgreSQL), ``CELERY_BROKER_URL``
(Redis), ``SECRET_KEY``, ``GPUMARKET_AUDIT_KEYS`` and ``DEBUG=0``.
"""

import importlib.util
import json
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("GPUMARKET_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a whole number, got {value!r}") from exc


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is required when DEBUG is off: set SECRET_KEY, or DEBUG=1 for development"
        )
    SECRET_KEY = "insecure-development-key-do-not-use-in-production"


def env_keys(name: str) -> dict[str, str]:
    """``id:secret,id:secret`` from the environment, in order (the first is the current key)."""
    keys: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in os.environ.get(name, "").split(","))):
        key_id, sep, secret = part.partition(":")
        if not sep or not key_id.strip() or not secret:
            raise ImproperlyConfigured(
                f"{name} must be 'id:secret' pairs separated by commas, e.g. 'k1:<64 hex digits>'"
            )
        if key_id.strip() in keys:
            raise ImproperlyConfigured(f"{name} names the key id {key_id.strip()!r} twice")
        if not DEBUG and len(secret) < 32:
            raise ImproperlyConfigured(
                f"{name}: the secret of key {key_id.strip()!r} is shorter than 32 characters"
            )
        keys[key_id.strip()] = secret
    return keys


# The audit chain is an HMAC chain: each event's hash is keyed with a secret that lives outside
# the database, so whoever owns the tables cannot rewrite an event and recompute the hashes.
# The first key signs new events; later ones still verify the events they signed (rotation).
GPUMARKET_AUDIT_KEYS = env_keys("GPUMARKET_AUDIT_KEYS")
if not GPUMARKET_AUDIT_KEYS:
    if not DEBUG:
        raise ImproperlyConfigured(
            "GPUMARKET_AUDIT_KEYS is required when DEBUG is off: set it to 'k1:<secret>' with a "
            "random secret of 32+ characters (python -c 'import secrets; "
            "print(secrets.token_hex(32))'), kept outside the database, or DEBUG=1 for development"
        )
    GPUMARKET_AUDIT_KEYS = {"dev": "insecure-development-audit-key:" + SECRET_KEY}

ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "audit",
    "tenants",
    "market",
    "telemetry",
    "planning",
    "governance",
    "alerts",
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Refuses an auditor's writes before any view, and audits every refused write.
    "governance.middleware.ReadOnlyRolesMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lock-out page.
    "axes.middleware.AxesMiddleware",
]

# Content-Security-Policy (django-csp): scripts only from our own static files, or inline
# with the request's nonce (the plotly figures and the countdown carry it); no other host
# for anything. Styles may be inline: plotly and htmx set them at run time.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# Sign-in throttling (django-axes) on the site login and /admin/login/: a (username, address)
# pair with AXES_FAILURE_LIMIT wrong passwords is locked, and so is an address with that many,
# each for AXES_COOLOFF_TIME; the right password does not get through a lock-out. Each lock
# is one audit event (audit/receivers.py). Behind a reverse proxy, set
# AXES_IPWARE_PROXY_COUNT so the client's address, not the proxy's, is counted.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 10)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AXES_COOLOFF_MINUTES", 15))
# A username is locked only together with the address the wrong passwords came from, so no one
# can lock its owner out from elsewhere; an address is locked whatever usernames it tried.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_IPWARE_PROXY_COUNT = env_int("AXES_IPWARE_PROXY_COUNT", 0) or None
AXES_VERBOSE = False
# tenants/admin.py registers axes' admin itself, with an action that unlocks (core/signin.py).
AXES_ENABLE_ADMIN = False

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.membership",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'gpumarket.sqlite3'}"),
        conn_max_age=env_int("DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # Several demo processes (web, worker, beat) share one file: wait for the write lock
    # instead of failing, and take it at BEGIN so read-then-write blocks cannot deadlock.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [
    BASE_DIR / "static",
    # plotly.js served from the installed Python package (never a CDN), so the browser library
    # always matches the figure JSON the server produces: /static/vendor/plotly/plotly.min.js.
    (
        "vendor/plotly",
        Path(importlib.util.find_spec("plotly").submodule_search_locations[0]) / "package_data",
    ),
]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))

REST_FRAMEWORK = {
    # Declares the API's error body and every error status on each operation.
    "DEFAULT_SCHEMA_CLASS": "tenants.api.schema.GpumarketAutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "core.api.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "market.api.errors.api_exception_handler",
    # Per API token (per user for browser sessions). Spend limits are not rates: budgets and
    # balances are enforced inside the services' transactions.
    "DEFAULT_THROTTLE_RATES": {
        "bids": os.environ.get("GPUMARKET_API_BID_RATE", "60/minute"),
        "pace": os.environ.get("GPUMARKET_API_PACE_RATE", "120/minute"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpumarket API",
    "DESCRIPTION": "Bid credits for GPU-hours, follow spend, report telemetry.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Tags and operation ids from the resource ("bids_create"), not the version prefix.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        # The agents' ingest endpoint is a plain Django view; this adds it to the schema.
        "telemetry.api.openapi.ingest_schema_append",
    ],
    # The documentation pages load their scripts from our static files, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}
# Pace signal for training jobs (telemetry/pace.py, PaceConfig): thresholds in headroom %,
# times in seconds. Any PaceConfig field may be set here.
GPUMARKET_PACE = {
    "dwell_seconds": env_int("GPUMARKET_PACE_DWELL_SECONDS", 120),
    "history_seconds": env_int("GPUMARKET_PACE_HISTORY_SECONDS", 900),
}

# Rate-limit counters live in the cache: with several web processes it must be shared (Redis).
# When it is down the limits fail open (core/ratelimit.py); the short timeouts keep a Redis that
# hangs instead of refusing from holding every request.
CACHE_URL = os.environ.get("CACHE_URL", "")
if CACHE_URL.startswith(("redis://", "rediss://")):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
elif os.environ.get("GPUMARKET_CACHE_DIR"):
    # The embedded default (the demo): no server, but the worker's and the web's processes
    # share one cache, so a forecast the worker makes after a settlement is the page's.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": os.environ["GPUMARKET_CACHE_DIR"],
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Celery. The default broker keeps messages in files under var/ so the demo needs no server.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _folder in ("out", "processed", "control", "staging"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    # kombu's file-system transport, but a message is visible only once written in full.
    CELERY_BROKER_TRANSPORT = "core.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "control_folder": str(_broker_dir / "control"),
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "staging_folder": str(_broker_dir / "staging"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
    }
else:
    # Longer than the longest task (GPUMARKET_ROUND_TASK_TIME_LIMIT, below) so a slow task is
    # not redelivered while it still runs.
    # A message a killed worker never acknowledged is redelivered once it is this old (seconds);
    # the crash test sets a few seconds so redelivery happens within the test.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env_int("CELERY_BROKER_VISIBILITY_TIMEOUT", 7200)
    }
# Results are kept only for the parts of a partitioned clear (market.clear_part), which the
# clearing task gathers; every other task ignores its result. On Redis they go to the broker's
# server; with the embedded broker there is no backend and the parts are cleared in-process.
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or (
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else None
)
CELERY_RESULT_EXPIRES = 3600
# A part and its result travel as MessagePack (market.clear_part): a million-bid round's 34
# parts took 1.9 s to write as JSON in the clearing process and 0.47 s as MessagePack, and
# the workers read them three times as fast. Every other message stays JSON.
CELERY_ACCEPT_CONTENT = ["json", "msgpack"]
CELERY_RESULT_SERIALIZER = "msgpack"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker outage never ends a worker: it reconnects for as long as it takes, at start too. A
# task that is running when the connection drops finishes its own transaction; its
# acknowledgement is lost with the connection, so the message comes back once Redis does and
# the service finds the work done (tests/market/test_market_celery.py, the outage test).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 360)
# The tasks that close, clear and settle rounds (market.rounds_tick, market.round_clear) have
# their own limits: a round settles in one transaction, and a million bids took 764 s on two
# cores (docs/market.md). Under the limits above such a round's tick was stopped mid-settlement,
# rolled back, and begun again by the next tick, so the round never settled.
GPUMARKET_ROUND_TASK_SOFT_TIME_LIMIT = env_int("GPUMARKET_ROUND_TASK_SOFT_TIME_LIMIT", 3600)
GPUMARKET_ROUND_TASK_TIME_LIMIT = env_int("GPUMARKET_ROUND_TASK_TIME_LIMIT", 3660)
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    # The parts of a partitioned clear have their own queue, so the workers that clear them
    # (as many as there are, on any machine) never wait behind, or block, a clearing task.
    "market.clear_part": {"queue": "clearing_parts"},
    "market.*": {"queue": "clearing"},
    "telemetry.*": {"queue": "telemetry"},
}
# Beat only sends ids-free "scan the database" ticks: a lost message or a broker outage delays
# work but never loses it, because the next tick finds what is due.
CELERY_BEAT_SCHEDULE = {
    "rounds-tick": {
        "task": "market.rounds_tick",
        "schedule": float(os.environ.get("GPUMARKET_ROUND_TICK_SECONDS", "15")),
    },
    "enforce": {
        "task": "telemetry.enforce",
        "schedule": float(os.environ.get("GPUMARKET_ENFORCE_SECONDS", "10")),
    },
    "nodes-health": {"task": "telemetry.nodes_health", "schedule": 30.0},
    "samples-rollup": {"task": "telemetry.samples_rollup", "schedule": 60.0},
    "idle-reclaim": {
        "task": "telemetry.idle_reclaim",
        "schedule": float(os.environ.get("GPUMARKET_IDLE_RECLAIM_SECONDS", "60")),
    },
    "audit-checkpoint": {
        "task": "audit.checkpoint",
        "schedule": float(os.environ.get("GPUMARKET_AUDIT_CHECKPOINT_SECONDS", "60")),
    },
    "approvals-expire": {"task": "governance.approvals_expire", "schedule": 300.0},
    "alerts-digest": {
        "task": "alerts.digest",
        # The tick asks for a digest after each settled round; this backstop sends the
        # notices written outside a round's settlement (approvals, budgets, failures).
        "schedule": float(os.environ.get("GPUMARKET_ALERT_DIGEST_SECONDS", "300")),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TIMEZONE = "UTC"

# Partitioned clearing: a round with at least this many open bids is split into sub-markets
# cleared in parallel on the clearing_parts queue (market/clearing/parts/partition.py); below it the
# exact clear runs. The threshold is GPUMARKET_PARTITION_ABOVE_BIDS for welfare (a min-cost
# flow, about 2 s at 100k bids) and GPUMARKET_PARTITION_FAIR_ABOVE_BIDS for fisher and
# maxmin, whose programs grow faster than the bids: maxmin's LP took 8.7 s at 70k bids and
# reached the default 10 s time limit at 99k on two cores, which failed the round, while
# parts lose 0.05 % or less of their objective (docs/clearing.md). Parts:
# GPUMARKET_PARTITION_PARTS at least, more when needed to keep each to
# GPUMARKET_PARTITION_BIDS_PER_PART bids (a million bids cleared in 8 parts of 125k took
# 55-67 s, in 32 parts 33-39 s, on two cores). A part that has not come back within
# GPUMARKET_PARTITION_TIMEOUT_SECONDS fails the round (every hold released).
GPUMARKET_PARTITION_ABOVE_BIDS = env_int("GPUMARKET_PARTITION_ABOVE_BIDS", 100_000)
GPUMARKET_PARTITION_FAIR_ABOVE_BIDS = env_int("GPUMARKET_PARTITION_FAIR_ABOVE_BIDS", 40_000)
GPUMARKET_PARTITION_PARTS = env_int("GPUMARKET_PARTITION_PARTS", 4)
GPUMARKET_PARTITION_BIDS_PER_PART = env_int("GPUMARKET_PARTITION_BIDS_PER_PART", 30_000)
GPUMARKET_PARTITION_TIMEOUT_SECONDS = env_int("GPUMARKET_PARTITION_TIMEOUT_SECONDS", 240)

# Signed checkpoints of the audit log's head are appended here (by beat, and by
# `manage.py audit_checkpoint`); verify-audit checks the log against them, so a truncated or
# rewritten tail shows. Put it where the application can append but not rewrite (an
# append-only file, `chattr +a`, or an object-locked bucket synced from it).
GPUMARKET_AUDIT_CHECKPOINT_PATH = os.environ.get(
    "GPUMARKET_AUDIT_CHECKPOINT_PATH", str(VAR_DIR / "audit-checkpoints.jsonl")
)

# The two-person rule (docs/governance.md): which changes wait for a second admin, as JSON,
# e.g. {"policy_activate": {}, "credit_grant": {"above_credits": 10000}}; a kind left out is
# made by one admin. Unset: the defaults in governance/rules.py. A request not decided within
# GPUMARKET_APPROVAL_HOURS expires. Members of the GPUMARKET_AUDITOR_GROUP group read
# everything a platform admin reads and change nothing.
try:
    GPUMARKET_APPROVALS = json.loads(os.environ.get("GPUMARKET_APPROVALS") or "null")
except ValueError as exc:
    raise ImproperlyConfigured(f"GPUMARKET_APPROVALS is not valid JSON: {exc}") from exc
GPUMARKET_APPROVAL_HOURS = env_int("GPUMARKET_APPROVAL_HOURS", 72)
GPUMARKET_AUDITOR_GROUP = os.environ.get("GPUMARKET_AUDITOR_GROUP", "auditor")

# The bearer token /metrics asks for. Required when DEBUG is off: the figures are
# platform-wide aggregates, but they are nobody's business outside the operators.
GPUMARKET_METRICS_TOKEN = os.environ.get("GPUMARKET_METRICS_TOKEN", "")
if not GPUMARKET_METRICS_TOKEN and not DEBUG:
    raise ImproperlyConfigured(
        "GPUMARKET_METRICS_TOKEN is required when DEBUG is off: set it to a random secret and "
        "give the same one to the Prometheus scrape job (Authorization: Bearer <token>)"
    )

# Telemetry (seconds unless named otherwise).
GPUMARKET_NODE_STALE_SECONDS = env_int("GPUMARKET_NODE_STALE_SECONDS", 90)
GPUMARKET_SAMPLE_RETENTION_HOURS = env_int("GPUMARKET_SAMPLE_RETENTION_HOURS", 48)
GPUMARKET_PREEMPT_GRACE_SECONDS = env_int("GPUMARKET_PREEMPT_GRACE_SECONDS", 30)
# The signal a standing order's work gets when its order lost the round, GPUMARKET_PREEMPT_
# GRACE_SECONDS before it is suspended (signal executor) or requeued and held (Slurm).
GPUMARKET_CHECKPOINT_SIGNAL = os.environ.get("GPUMARKET_CHECKPOINT_SIGNAL", "USR1")
# Slurm reservations per placed allocation (market/services/slurm_reservations.py): off
# unless the platform's workers can run Slurm's client tools as an operator.
GPUMARKET_SLURM_RESERVATIONS = env_bool("GPUMARKET_SLURM_RESERVATIONS", False)
# Starts the name of every reservation this platform makes (`<prefix><allocation id>`): set a
# prefix of its own on each platform (or test run) that shares a Slurm cluster.
GPUMARKET_SLURM_RESERVATION_PREFIX = os.environ.get("GPUMARKET_SLURM_RESERVATION_PREFIX", "gm-")
GPUMARKET_SLURM_SCONTROL = os.environ.get("GPUMARKET_SLURM_SCONTROL", "scontrol")
GPUMARKET_SLURM_SACCTMGR = os.environ.get("GPUMARKET_SLURM_SACCTMGR", "sacctmgr")
GPUMARKET_SLURM_TIMEOUT_SECONDS = env_int("GPUMARKET_SLURM_TIMEOUT_SECONDS", 15)
# Ingest limits: how far a batch's clock may differ from ours, how old a backlogged sample may
# be (keep it below the retention window), and the size of one batch.
GPUMARKET_CLOCK_SKEW_SECONDS = env_int("GPUMARKET_CLOCK_SKEW_SECONDS", 120)
GPUMARKET_SAMPLE_MAX_AGE_SECONDS = env_int("GPUMARKET_SAMPLE_MAX_AGE_SECONDS", 6 * 3600)
GPUMARKET_INGEST_MAX_SAMPLES = env_int("GPUMARKET_INGEST_MAX_SAMPLES", 10_000)
GPUMARKET_INGEST_MAX_BYTES = env_int("GPUMARKET_INGEST_MAX_BYTES", 8 * 1024 * 1024)
# Batches one node may post per minute. An agent posts every few seconds; the headroom lets a
# backlog drain after an outage, and a runaway agent is slowed instead of filling the database.
GPUMARKET_INGEST_RATE_PER_MINUTE = env_int("GPUMARKET_INGEST_RATE_PER_MINUTE", 600)
# A directive the agent reported as failed is issued again after this long, not every tick.
GPUMARKET_ENFORCE_RETRY_SECONDS = env_int("GPUMARKET_ENFORCE_RETRY_SECONDS", 60)

if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_CONTENT_TYPE_NOSNIFF = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # The sign-in throttle logs every successful sign-in at INFO; lock-outs are audit events.
    "loggers": {"axes": {"level": "WARNING"}},
}
# The demo sends the development server's request lines to a file, not its console.
if os.environ.get("GPUMARKET_WEB_LOG"):
    LOGGING["handlers"]["web_file"] = {
        "class": "logging.FileHandler",
        "filename": os.environ["GPUMARKET_WEB_LOG"],
        "formatter": "plain",
    }
    for _name in ("django.server", "django.request"):
        LOGGING["loggers"][_name] = {"handlers": ["web_file"], "propagate": False}

# Alerts that leave the app (alerts/, docs/alerts.md). Mail goes through Django's SMTP backend
# when EMAIL_HOST is set; without it (the demo) each message is written as a file under
# var/mail/, so nothing is sent by accident.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "gpumarket <gpumarket@localhost>")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = str(VAR_DIR / "mail")
# Hosts a webhook may reach although they resolve to a loopback or private address.
GPUMARKET_WEBHOOK_ALLOWED_HOSTS = [
    h for h in os.environ.get("GPUMARKET_WEBHOOK_ALLOWED_HOSTS", "").split(",") if h.strip()
]
GPUMARKET_WEBHOOK_TIMEOUT_SECONDS = env_int("GPUMARKET_WEBHOOK_TIMEOUT_SECONDS", 5)
GPUMARKET_WEBHOOKS_PER_TEAM = env_int("GPUMARKET_WEBHOOKS_PER_TEAM", 5)
GPUMARKET_ALERT_MAX_ATTEMPTS = env_int("GPUMARKET_ALERT_MAX_ATTEMPTS", 6)
GPUMARKET_ALERT_RETRY_BASE_SECONDS = env_int("GPUMARKET_ALERT_RETRY_BASE_SECONDS", 30)
