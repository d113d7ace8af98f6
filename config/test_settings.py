"""Settings for the test suite: production settings (DEBUG off) over plain HTTP on loopback."""

import os
import tempfile

os.environ.setdefault("SECRET_KEY", "test-only-secret-key-not-for-production")
os.environ.setdefault("GPUMARKET_AUDIT_KEYS", "test:test-only-audit-key-not-for-production")
os.environ.setdefault("GPUMARKET_METRICS_TOKEN", "test-only-metrics-token")
# Checkpoints of this run's log only (subprocesses inherit the path), never the demo's file.
os.environ.setdefault(
    "GPUMARKET_AUDIT_CHECKPOINT_PATH",
    os.path.join(tempfile.mkdtemp(prefix="gpumarket-audit-"), "checkpoints.jsonl"),
)

from config.settings import *  # noqa: E402,F403

ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
SECURE_HSTS_SECONDS = 0
# Fast hashing: tests create many users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Serve static files straight from the finders (no collectstatic before tests), which also
# keeps WhiteNoise from warning about the missing STATIC_ROOT on every request handler.
WHITENOISE_AUTOREFRESH = True
WHITENOISE_USE_FINDERS = True
