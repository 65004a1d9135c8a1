"""What the admin's theme (django-unfold, settings.UNFOLD) asks for per request: the
sidebar, our stylesheet and script. Each is named by path in the settings and
called with the request, so the sidebar lists only what this user may see."""

from django.templatetags.static import static
from django.urls import reverse

# (title, icon, app label, model name); Material Symbols icon names.
CONSOLE = [
    ("Webhooks", "webhook", "deliveries", "webhook"),
    ("Targets", "call_split", "deliveries", "target"),
    ("Events", "inbox", "deliveries", "event"),
    ("Deliveries", "send", "deliveries", "delivery"),
    ("Replay jobs", "replay", "deliveries", "replayjob"),
    ("Rejected requests", "block", "deliveries", "rejection"),
    ("Alerts", "notifications", "deliveries", "alert"),
    ("API keys", "key", "deliveries", "apikey"),
    ("Audit log", "history", "auditlog", "logentry"),
]
ACCOUNTS = [
    ("Users", "person", "auth", "user"),
    ("Groups", "group", "auth", "group"),
]
# Login throttling (django-axes): only superusers unlock addresses, and the tables
# would crowd the navigation of everyone else.
SECURITY = [
    ("Locked-out addresses", "lock", "axes", "accessattempt"),
    ("Failed logins", "gpp_bad", "axes", "accessfailurelog"),
    ("Logins", "login", "axes", "accesslog"),
]


def _items(request, entries):
    from django.apps import apps
    from django.contrib import admin

    items = []
    for title, icon, app_label, model_name in entries:
        try:
            model_admin = admin.site.get_model_admin(apps.get_model(app_label, model_name))
        except (LookupError, admin.sites.NotRegistered):
            continue
        if not model_admin.has_view_or_change_permission(request):
            continue
        link = reverse(f"admin:{app_label}_{model_name}_changelist")
        items.append({"title": title, "icon": icon, "link": link})
    return items


def navigation(request) -> list[dict]:
    """The sidebar's groups for this request's user (empty groups left out)."""
    groups = [
        {
            "title": "Console",
            "items": [
                {"title": "Dashboard", "icon": "monitoring", "link": reverse("admin:index")},
                *_items(request, CONSOLE),
            ],
        },
        {"title": "Accounts", "items": _items(request, ACCOUNTS)},
    ]
    if request.user.is_superuser:
        groups.append(
            {"title": "Security", "collapsible": True, "items": _items(request, SECURITY)}
        )
    return [group for group in groups if group["items"]]


def stylesheet(request) -> str:
    return static("deliveries/admin.css")


def script(request) -> str:
    return static("deliveries/admin.js")
