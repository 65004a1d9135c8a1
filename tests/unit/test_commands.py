import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_first_start_creates_admin_and_prints_the_password_once():
    out = io.StringIO()
    call_command("ensureadmin", stdout=out)
    printed = out.getvalue()
    password = printed.split("shown this once:")[1].split()[0]
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password(password)

    again = io.StringIO()
    call_command("ensureadmin", stdout=again)
    assert again.getvalue() == ""
    admin.refresh_from_db()
    assert admin.check_password(password)  # later starts leave it alone
