"""What more than one model's admin uses: ownership scoping (OwnedAdmin) and the
owner column (OwnerMixin), read-only records, the capped count of long lists (and
of their filters' "Show counts"), a page past the end kept filtered, the
intermediate page of an action that asks first (ask_first(), confirmed()), the
redirect back to a page (redirect_back()), and small HTML helpers (badges, codes,
the delivery buttons), whose markup is in templates/admin/deliveries/."""

import functools

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.templatetags.admin_urls import admin_urlname
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import InvalidPage, Paginator
from django.forms import Media
from django.http import Http404, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import formats
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_POST
from unfold.admin import ModelAdmin, TabularInline
from unfold.widgets import UnfoldAdminTextInputWidget

from deliveries import export
from deliveries.audit import Audited
from deliveries.fields import EncryptedTextField
from deliveries.models import Delivery
from webhooker import encryption

_COLOURS = {
    Delivery.Status.PENDING: "#6b7280",
    Delivery.Status.RETRYING: "#b45309",
    Delivery.Status.DELIVERED: "#15803d",
    Delivery.Status.FAILED: "#b91c1c",
    Delivery.Status.FILTERED: "#0e7490",
}
# One per member of the model's choices: a status the model gains without a colour
# above is a KeyError here, when the admin loads, not a grey badge.
STATUS_COLOURS = {status: _COLOURS[status] for status in Delivery.Status}


def badge(colour: str, text):
    return format_html('<span class="wh-badge" style="background:{}">{}</span>', colour, text)


def status_badge(status, text=None):
    """A delivery status as a coloured badge; ValueError for what is no status."""
    return badge(STATUS_COLOURS[Delivery.Status(status)], text or status)


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
        return capped_count(self.object_list)


def capped_count(queryset) -> int:
    """The number of rows of `queryset`, counting at most CappedCountPaginator.CAP
    + 1 of them (a LIMIT subquery): an AtLeast past the cap. The list's own count,
    and each of its filters' "Show counts"."""
    cap = CappedCountPaginator.CAP
    count = queryset[: cap + 1].count()
    return AtLeast(count) if count > cap else count


def ask_first(
    model_admin,
    request,
    *,
    title: str,
    objects,
    hidden: dict,
    submit: str,
    describe=str,
    form=None,
    intro: str = "",
    count: int | None = None,
    noun: str = "",
):
    """The intermediate page of an action that asks before it acts, one template for
    all: its title, the `objects` it applies to (links to their pages, each as
    `describe` puts it; a sample when `count` says there are more), the question's
    `form` if it has one, and the submit and Cancel buttons. Its hidden fields post
    the same selection back to the list, with `hidden` (what marks the answer)."""
    opts = model_admin.opts
    change = admin_urlname(opts, "change")
    objects = [(describe(obj), reverse(change, args=[obj.pk])) for obj in objects]
    hidden = {
        "action": request.POST.get("action", ""),
        "select_across": request.POST.get("select_across", "0"),
        "index": "0",
        ACTION_CHECKBOX_NAME: request.POST.getlist(ACTION_CHECKBOX_NAME),
        **hidden,
    }
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": opts,
        "title": title,
        "intro": intro,
        "count": count,
        "noun": noun,
        "objects": objects,
        "more": count - len(objects) if count is not None else 0,
        "form": form,
        "hidden": hidden,
        "hidden_fields": [
            (name, item)
            for name, value in hidden.items()
            for item in (value if isinstance(value, list) else [value])
        ],
        "submit": submit,
        "media": model_admin.media + (form.media if form is not None else Media()),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/deliveries/confirm_action.html", context)


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
                return confirm_page(self, request, queryset, action.short_description, noun)
            return func(self, request, queryset.filter(pk__lte=upto))

        return action

    return wrap


def confirm_page(model_admin, request, queryset, description, noun):
    count = queryset.count()
    if not count:
        model_admin.message_user(request, f"No {noun} to act on.", messages.WARNING)
        return None
    upto = queryset.order_by("-pk").values_list("pk", flat=True)[0]
    return ask_first(
        model_admin,
        request,
        title=description,
        objects=queryset.order_by("-pk")[:10],
        hidden={"upto": str(upto), "confirm": "1"},
        submit=f"{description}: {count} {noun}",
        count=count,
        noun=noun,
    )


def post_urls(model_admin, view, names) -> list:
    """One POST-only URL per name, `<object id>/<name with dashes>/`, named
    `<app>_<model>_<name>`, calling view(name, request, object_id): the buttons
    of an object's page (post_buttons())."""
    opts = model_admin.opts
    return [
        path(
            f"<path:object_id>/{name.replace('_', '-')}/",
            model_admin.admin_site.admin_view(require_POST(functools.partial(view, name))),
            name=f"{opts.app_label}_{opts.model_name}_{name}",
        )
        for name in names
    ]


def redirect_back(request, url: str, fallback: str) -> HttpResponseRedirect:
    """To `url` (a ?next= or the Referer) when it is on this site, else to `fallback`."""
    if not url_has_allowed_host_and_scheme(
        url, {request.get_host()}, require_https=request.is_secure()
    ):
        url = fallback
    return HttpResponseRedirect(url)


class PastTheEnd(Exception):
    """A change list asked for a page it does not have; `url` is its nearest page."""

    def __init__(self, url: str):
        super().__init__(url)
        self.url = url


class PageKeepingChangeList(ChangeList):
    """A page number out of range (?p=500, ?p=0) goes to the nearest page with the
    same filters and search, where Django drops them all (?e=1)."""

    def get_results(self, request):
        try:
            super().get_results(request)
        except IncorrectLookupParameters as exc:
            if not isinstance(exc.__context__, InvalidPage):
                raise
            paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
            page = paginator.num_pages if self.page_num > 1 else 1
            raise PastTheEnd(request.path + self.get_query_string({PAGE_VAR: page})) from exc


class OwnedAdmin(ModelAdmin):
    """Scopes every query to the requesting user's webhooks."""

    def get_queryset(self, request):
        return super().get_queryset(request).visible_to(request.user)

    def get_changelist(self, request, **kwargs):
        return PageKeepingChangeList

    def changelist_view(self, request, extra_context=None):
        try:
            return super().changelist_view(request, extra_context)
        except PastTheEnd as past:
            return HttpResponseRedirect(past.url)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # The History button, on the pages of the objects the audit log records.
        extra_context = {**(extra_context or {}), "show_history": issubclass(self.model, Audited)}
        return super().change_view(request, object_id, form_url, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        """An object's history: the audit log narrowed to it (admin/audit.py)."""
        obj = self.get_object(request, unquote(object_id))
        content_type = ContentType.objects.get_for_model(self.model)
        query = urlencode({"content_type": content_type.pk, "object_id": obj.pk})
        return HttpResponseRedirect(f"{reverse('admin:auditlog_logentry_changelist')}?{query}")

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            # The admin would redirect with "doesn't exist"; another user's
            # object must look exactly like one that does not exist at all.
            raise Http404("No such object.")
        if request.method == "GET":
            warn_unreadable(request, obj)
            for warning in self.warnings(obj):
                messages.warning(request, warning)
        return obj

    def warnings(self, obj) -> list[str]:
        """What the object's page warns about (a target: its client certificate)."""
        return []


def warn_unreadable(request, obj) -> None:
    """Say on the object's page which of its secrets no encryption key opens: they
    are used by nothing (a target's deliveries fail in words) until the key is back
    or they are entered again."""
    for field in obj._meta.concrete_fields:
        if isinstance(field, EncryptedTextField) and encryption.unreadable(
            getattr(obj, field.attname)
        ):
            messages.error(
                request,
                f"Its {field.verbose_name} {encryption.PROBLEM}. Until the key is back, or "
                "the value is entered again and saved, it is not used.",
            )


class ExportsList:
    """ "Export these rows" above a list: every row its filters and search let
    through, streamed as CSV or JSON Lines (deliveries/export.py), under the same
    ownership rule as the list."""

    export_columns: dict
    list_before_template = "admin/deliveries/export_links.html"

    def export_rows(self, queryset):
        return queryset

    def get_urls(self):
        opts = self.model._meta
        return [
            path(
                "export/<str:kind>/",
                self.admin_site.admin_view(self.export_view),
                name=f"{opts.app_label}_{opts.model_name}_export",
            ),
            *super().get_urls(),
        ]

    def export_view(self, request, kind):
        if kind not in export.FORMATS:
            raise Http404("No such format.")
        rows = self.export_rows(self.get_changelist_instance(request).queryset)
        return export.stream(
            rows, self.export_columns, kind, str(self.model._meta.verbose_name_plural)
        )


class OwnerMixin:
    """Whose rows these are (`owner_field`, a user): a column and a form field for
    superusers only, since everyone else sees their own rows alone; left empty on
    a new row, it is the user who saves it."""

    owner_field = "owner"
    owner_help_text = "Whose this is (empty: yours)."

    def owner_fields(self, request) -> list[str]:
        return [self.owner_field] if request.user.is_superuser else []

    def get_list_display(self, request):
        columns = list(super().get_list_display(request))
        return [*columns[:1], *self.owner_fields(request), *columns[1:]]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        field = form.base_fields.get(self.owner_field)
        if field is not None:
            field.required = False
            field.help_text = self.owner_help_text
        return form

    def save_model(self, request, obj, form, change):
        if not getattr(obj, f"{self.owner_field}_id"):
            setattr(obj, self.owner_field, request.user)
        super().save_model(request, obj, form, change)


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
    names = ("url", "webhook_url", "alert_url", "oauth_token_url", "proxy")
    return [value for key, value in post.items() if key.rsplit("-", 1)[-1] in names]


def copyable_code(code, url=None):
    """The first 8 characters of a code (a link to `url` if given); the whole on
    hover and on Copy."""
    return render_to_string(
        "admin/deliveries/copyable_code.html", {"code": code, "short": str(code)[:8], "url": url}
    )


def copyable_text(text):
    """A value shown whole (an inbound URL) with its Copy button."""
    return render_to_string("admin/deliveries/copyable_text.html", {"text": text})


def post_buttons(buttons, next_url: str, empty: str = ""):
    """Submit buttons, each (url, label, css), that post the page's form, CSRF token
    included, to an action URL that sends the browser back to `next_url` (a change
    page is one form already; forms cannot nest). `empty` stands in for none."""
    context = {
        "buttons": [{"url": url, "label": label, "css": css} for url, label, css in buttons],
        "next": next_url,
        "empty": empty,
    }
    return render_to_string("admin/deliveries/post_buttons.html", context)


def delivery_buttons(delivery, next_url: str, empty: str = ""):
    """Retry now (while it waits for a retry) and Redeliver (once finished)."""
    buttons = []
    if delivery.status == Delivery.Status.RETRYING:
        buttons.append(("retry_now", "Retry now", "wh-button-primary"))
    if delivery.status in Delivery.FINISHED:
        buttons.append(("redeliver", "Redeliver", ""))
    return post_buttons(
        [
            (reverse(f"admin:deliveries_delivery_{name}", args=[delivery.pk]), label, css)
            for name, label, css in buttons
        ],
        next_url,
        empty,
    )


class DateTimeLocalWidget(UnfoldAdminTextInputWidget):
    """The browser's date and time picker in unfold's style: one field, posted as
    2025-01-31T09:30 (unfold's own date-time widget posts two)."""

    input_type = "datetime-local"

    def format_value(self, value):
        return formats.localize_input(value, "%Y-%m-%dT%H:%M") if value else None
