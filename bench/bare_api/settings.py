"""The second baseline of bench/bidstorm.py: the platform's own settings (middleware,
authentication, throttles, database, cache), with ``bench.bare_api.urls`` as the only URLs."""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "bench.bare_api.urls"
