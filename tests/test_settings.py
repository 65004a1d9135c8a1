"""Settings come from the environment; bad values stop the start with a clear error."""

import os
import stat
import subprocess
import sys

import pytest

from tests.processes import ROOT

PRINT = "from django.conf import settings as s; print(s.{})"


def run_settings(tmp_path, expr="DEBUG", **env):
    full = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    full.update(DJANGO_SETTINGS_MODULE="webhooker.settings", DATA_DIR=str(tmp_path / "d"))
    full.update(env)
    code = f"import django; django.setup(); {PRINT.format(expr)}"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WEBHOOKER_ENVIRONMENT": "staging"}, "WEBHOOKER_ENVIRONMENT='staging' is not valid"),
        ({"DELIVERY_WORKERS": "ten"}, "DELIVERY_WORKERS='ten' is not an integer"),
        ({"DELIVERY_WORKERS": "0"}, "DELIVERY_WORKERS='0' must be at least 1"),
        ({"DELIVERY_POLL_INTERVAL": "soon"}, "DELIVERY_POLL_INTERVAL='soon' is not a number"),
        ({"WEBHOOKER_MAX_BODY_BYTES": "-1"}, "WEBHOOKER_MAX_BODY_BYTES='-1' must be at least 1"),
        ({"DATABASE_URL": "mysql://u@h/db"}, "webhooker supports SQLite and PostgreSQL"),
        ({"DATABASE_URL": "nonsense"}, "DATABASE_URL selects no known engine"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud' is not valid"),
        (
            {"WEBHOOKER_ENVIRONMENT": "prod", "SECRET_KEY": "x" * 60},
            "ALLOWED_HOSTS must be set",
        ),
        (
            {
                "WEBHOOKER_ENVIRONMENT": "prod",
                "ALLOWED_HOSTS": "hooks.example.com",
                "SECRET_KEY": "short",
            },
            "SECRET_KEY must be at least 50",
        ),
    ],
)
def test_bad_values_fail_loudly_at_start(tmp_path, env, message):
    result = run_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_defaults_need_nothing_set(tmp_path):
    result = run_settings(tmp_path, "DATABASES['default']['NAME']")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "d" / "webhooker.sqlite3")


def test_sqlite_runs_in_wal_with_immediate_transactions(tmp_path):
    code = (
        "from django.db import connection; c = connection.cursor();"
        "c.execute('PRAGMA journal_mode'); a = c.fetchone()[0];"
        "c.execute('PRAGMA synchronous'); b = c.fetchone()[0];"
        "print(a, b, connection.settings_dict['OPTIONS']['transaction_mode'])"
    )
    full = dict(
        os.environ, DJANGO_SETTINGS_MODULE="webhooker.settings", DATA_DIR=str(tmp_path / "d")
    )
    full.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["wal", "2", "IMMEDIATE"]


def test_prod_turns_debug_off(tmp_path):
    result = run_settings(
        tmp_path,
        WEBHOOKER_ENVIRONMENT="prod",
        ALLOWED_HOSTS="hooks.example.com",
        SECRET_KEY="k" * 60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_database_url_switches_to_postgresql(tmp_path):
    result = run_settings(
        tmp_path,
        "DATABASES['default']['ENGINE']",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/test",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.postgresql"


def test_secret_key_is_generated_once_and_reused(tmp_path):
    first = run_settings(tmp_path, "SECRET_KEY")
    second = run_settings(tmp_path, "SECRET_KEY")
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "d" / "secret_key"
    assert first.stdout.strip() == second.stdout.strip() == key_file.read_text().strip()
    assert len(first.stdout.strip()) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_secret_key_from_environment_wins(tmp_path):
    result = run_settings(tmp_path, "SECRET_KEY", SECRET_KEY="from-env-" + "x" * 50)
    assert result.stdout.strip() == "from-env-" + "x" * 50
    assert not (tmp_path / "d" / "secret_key").exists()
