"""What more than one model's admin uses: ownership scoping (OwnedAdmin), read-only
records, the capped count of long lists, confirmed bulk actions, and small HTML
helpers (badges, codes, times, the delivery buttons)."""

import functools

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.paginator import Paginator
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from unfold.admin import ModelAdmin, TabularInline

from deliveries.models import Delivery

STATUS_COLOURS = {
    "pending": "#6b7280",
    "retrying": "#b45309",
    "delivered": "#15803d",
    "failed": "#b91c1c",
    "filtered": "#0e7490",
}


def status_badge(status, text=None):
    return format_html(
        '<span class="wh-badge" style="background:{}">{}</span>',
        STATUS_COLOURS.get(status, "#6b7280"),
        text or status,
    )


class AtLeast(int):
    """A count that was capped: it pages as the number it is, and reads "10000+"
    wherever the admin prints it ("Select all 10000+ deliveries"), never as if it
    were the exact number."""

    def __str__(self):
        return f"{int(self) - 1}+"


class CappedCountPaginator(Paginator):
    """Counts at most CAP rows: a COUNT(*) over millions of rows is the slowest
    query a change list runs, and nobody pages past the first few thousand."""

    CAP = 10_000

    @cached_property
    def count(self):
        count = self.object_list[: self.CAP + 1].count()
        return AtLeast(count) if count > self.CAP else count


def confirmed(noun: str):
    """A bulk action that first shows the exact number of `noun` it will act on.

    The page pins the set: with "select all" it records the highest id shown, so
    rows arriving meanwhile are not swept in, and the count is a real COUNT, not
    the list's capped one.
    """

    def wrap(func):
        @functools.wraps(func)
        def action(self, request, queryset):
            upto = parse_id(request.POST.get("upto"))
            if request.POST.get("confirm") != "1" or not upto:
                return confirm_page(self, request, queryset, action, noun)
            return func(self, request, queryset.filter(pk__lte=upto))

        return action

    return wrap


def confirm_page(model_admin, request, queryset, func, noun):
    count = queryset.count()
    if not count:
        model_admin.message_user(request, f"No {noun} to act on.", messages.WARNING)
        return None
    upto = queryset.order_by("-pk").values_list("pk", flat=True)[0]
    hidden = {
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across", "0"),
        "index": "0",
        ACTION_CHECKBOX_NAME: request.POST.getlist(ACTION_CHECKBOX_NAME),
        "upto": str(upto),
    }
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": func.short_description,
        "count": count,
        "noun": noun,
        "sample": queryset.order_by("-pk")[:10],
        "hidden": hidden,
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/deliveries/confirm_action.html", context)


class OwnedAdmin(ModelAdmin):
    """Scopes every query to the requesting user's webhooks."""

    def get_queryset(self, request):
        return super().get_queryset(request).visible_to(request.user)

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            # The admin would redirect with "doesn't exist"; another user's
            # object must look exactly like one that does not exist at all.
            raise Http404("No such object.")
        return obj


class ReadOnlyMixin:
    """Records of what happened are never edited by hand (actions change them)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


class ReadOnlyInline(TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def parse_id(value) -> int | None:
    """A primary key from a query string, or None for anything else ('²', 10**20…).
    The filters' "show counts" passes their own choices, ints, through here too."""
    value = str(value) if value is not None else ""
    if not value or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value) or None


def posted_urls(post) -> list[str]:
    """The URLs a webhook or target form checks: targets' (with the inline's prefix,
    or without on the target's page) and the webhook's alert URL."""
    names = ("url", "webhook_url", "alert_url")
    return [value for key, value in post.items() if key.rsplit("-", 1)[-1] in names]


def copyable_code(code, url=None):
    """The first 8 characters of a code; the whole on hover and on Copy."""
    short = str(code)[:8]
    text = format_html('<a href="{}">{}</a>', url, short) if url else short
    return format_html(
        '<span class="wh-code" title="{}">{}</span>'
        '<button type="button" class="wh-copy wh-copy-icon" data-copy="{}" title="Copy {}">'
        '<span class="material-symbols-outlined">content_copy</span></button>',
        code,
        text,
        code,
        code,
    )


def when(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S") if moment else "–"


def delivery_buttons(delivery, next_url: str):
    """Retry now (while it waits for a retry) and Redeliver (once finished): submit
    buttons that post the page's form, CSRF token included, to the delivery's
    action URLs (a change page is one form already; forms cannot nest)."""
    buttons = []
    if delivery.status == Delivery.Status.RETRYING:
        buttons.append(("retry_now", "Retry now", "wh-button-primary"))
    if delivery.status in Delivery.FINISHED:
        buttons.append(("redeliver", "Redeliver", ""))
    return format_html_join(
        " ",
        '<button type="submit" class="wh-button {}" formmethod="post" '
        'formaction="{}?next={}" formnovalidate>{}</button>',
        (
            (css, reverse(f"admin:deliveries_delivery_{name}", args=[delivery.pk]), next_url, label)
            for name, label, css in buttons
        ),
    )
