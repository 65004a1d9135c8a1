"""Settings come from the environment; bad values stop the start with a clear error.

Most tests run the settings module afresh in this process with a given environment
(`load`); the few that need what only a new process shows (Django really starting,
a real connection, the folders made at start) run one.
"""

import os
import re
import runpy
import stat
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from tests.support.processes import ROOT


@pytest.fixture
def load(monkeypatch, tmp_path):
    """Run webhooker/settings.py with `env` over this process's environment and
    DATA_DIR=tmp_path/d; return its names. The loaded settings stay untouched."""

    def load(**env):
        monkeypatch.delenv("DATABASE_URL", raising=False)
        monkeypatch.delenv("SECRET_KEY", raising=False)
        monkeypatch.delenv("WEBHOOKER_ENCRYPTION_KEYS", raising=False)
        monkeypatch.setenv("DATA_DIR", str(tmp_path / "d"))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(ROOT / "webhooker" / "settings.py"))

    return load


def start(tmp_path, code, **env):
    """A new interpreter that starts Django with nothing but `env` set, then runs `code`."""
    full = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    full.pop("PROMETHEUS_MULTIPROC_DIR", None)
    full.update(DJANGO_SETTINGS_MODULE="webhooker.settings", DATA_DIR=str(tmp_path / "d"))
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


PROD = {"WEBHOOKER_ENVIRONMENT": "prod", "ALLOWED_HOSTS": "hooks.example.com"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WEBHOOKER_ENVIRONMENT": "staging"}, "WEBHOOKER_ENVIRONMENT='staging' is not valid"),
        ({"DELIVERY_WORKERS": "ten"}, "DELIVERY_WORKERS='ten' is not an integer"),
        ({"DELIVERY_WORKERS": "0"}, "DELIVERY_WORKERS='0' must be at least 1"),
        ({"DELIVERY_POLL_INTERVAL": "soon"}, "DELIVERY_POLL_INTERVAL='soon' is not a number"),
        ({"WEBHOOKER_MAX_BODY_BYTES": "-1"}, "WEBHOOKER_MAX_BODY_BYTES='-1' must be at least 1"),
        ({"DATABASE_URL": "mysql://u@h/db"}, "webhooker supports SQLite and PostgreSQL"),
        pytest.param(
            {"DATABASE_URL": "nonsense"},
            "DATABASE_URL selects no known engine",
            marks=pytest.mark.filterwarnings("ignore:Engine not recognized:UserWarning"),
        ),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud' is not valid"),
        ({"API_THROTTLE_RATE": "lots"}, "API_THROTTLE_RATE='lots' is not a rate such as 600/min"),
        ({"API_THROTTLE_RATE": "10/fortnight"}, "is not a rate such as 600/min"),
        ({"WEBHOOKER_ENVIRONMENT": "prod", "SECRET_KEY": "x" * 60}, "ALLOWED_HOSTS must be set"),
        ({**PROD, "SECRET_KEY": "short"}, "SECRET_KEY must be at least 50"),
    ],
)
def test_bad_values_fail_loudly(load, env, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        load(**env)


def test_a_bad_value_stops_the_start(tmp_path):
    result = start(tmp_path, "print('started')", DELIVERY_WORKERS="ten")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DELIVERY_WORKERS='ten' is not an integer" in result.stderr
    assert "started" not in result.stdout


def test_defaults_need_nothing_set(load, tmp_path):
    loaded = load()
    assert loaded["DATABASES"]["default"]["NAME"] == str(tmp_path / "d" / "webhooker.sqlite3")


def test_sqlite_runs_in_wal_with_immediate_transactions(tmp_path):
    code = (
        "from django.db import connection; c = connection.cursor();"
        "c.execute('PRAGMA journal_mode'); a = c.fetchone()[0];"
        "c.execute('PRAGMA synchronous'); b = c.fetchone()[0];"
        "print(a, b, connection.settings_dict['OPTIONS']['transaction_mode'])"
    )
    result = start(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["wal", "2", "IMMEDIATE"]
    # What every process writes to is there once Django has started.
    assert (tmp_path / "d" / "webhooker.sqlite3").is_file()
    assert (tmp_path / "d" / "metrics").is_dir()


def test_importing_settings_creates_no_folders(load, tmp_path):
    load(
        SECRET_KEY="from-env-" + "x" * 50, WEBHOOKER_ENCRYPTION_KEYS=Fernet.generate_key().decode()
    )
    assert not (tmp_path / "d").exists()
    # Without keys in the environment, the key files are the one thing written.
    load()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["encryption_keys", "secret_key"]


def test_encryption_keys_come_from_the_environment_or_are_made_once(load, tmp_path):
    first, second = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    assert load(WEBHOOKER_ENCRYPTION_KEYS=f"{first}, {second}")["ENCRYPTION_KEYS"] == [
        first,
        second,
    ]
    made = load()["ENCRYPTION_KEYS"]
    assert len(made) == 1 and Fernet(made[0])
    assert load()["ENCRYPTION_KEYS"] == made  # read back, not made again
    assert (tmp_path / "d" / "encryption_keys").stat().st_mode & 0o077 == 0


def test_a_malformed_encryption_key_is_named_in_words(load):
    key = Fernet.generate_key().decode()
    with pytest.raises(ImproperlyConfigured, match="encryption key 2 is not a Fernet key"):
        load(WEBHOOKER_ENCRYPTION_KEYS=f"{key},not-a-key")


def test_metrics_files_go_to_data_dir_unless_set(load, monkeypatch, tmp_path):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    load()
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "d" / "metrics")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "elsewhere"))
    load()
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path / "elsewhere")


def test_prod_turns_debug_off(load):
    assert load(**PROD, SECRET_KEY="k" * 60)["DEBUG"] is False


def test_database_url_switches_to_postgresql(load):
    loaded = load(DATABASE_URL="postgres://postgres@127.0.0.1:5432/test")
    assert loaded["DATABASES"]["default"]["ENGINE"] == "webhooker.db.postgresql"


def test_secret_key_is_generated_once_and_reused(load, tmp_path):
    first = load()["SECRET_KEY"]
    second = load()["SECRET_KEY"]
    key_file = tmp_path / "d" / "secret_key"
    assert first == second == key_file.read_text().strip()
    assert len(first) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_secret_key_from_environment_wins(load, tmp_path):
    assert load(SECRET_KEY="from-env-" + "x" * 50)["SECRET_KEY"] == "from-env-" + "x" * 50
    assert not (tmp_path / "d" / "secret_key").exists()


def test_alert_settings_and_email_url(load):
    loaded = load()
    assert loaded["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    assert "EMAIL_HOST" not in loaded  # Django's default stays
    assert (loaded["DELIVERY_DISABLE_AFTER"], loaded["ALERT_BREAKER_AFTER"]) == (432_000, 600)
    loaded = load(EMAIL_URL="smtp+tls://alerts:pw@mail.example.com:587", ALERT_BREAKER_AFTER="60")
    assert loaded["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert (loaded["EMAIL_HOST"], loaded["EMAIL_PORT"], loaded["EMAIL_USE_TLS"]) == (
        "mail.example.com",
        587,
        True,
    )
    assert loaded["ALERT_BREAKER_AFTER"] == 60
    with pytest.raises(ImproperlyConfigured, match="EMAIL_URL is not a usable email URL"):
        load(EMAIL_URL="pigeon://loft")
