"""The baseline of bench/bidstorm.py: a Django site that does nothing but a JSON body parsed
and one row written in a transaction, on the same PostgreSQL, under the same gunicorn."""

import os

import dj_database_url

SECRET_KEY = "bench-bare-" + os.environ.get("BARE_SECRET", "x")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bench.bare.urls"
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=60)}
USE_TZ = True
