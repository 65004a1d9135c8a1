"""Replay jobs in the console: started from a form (prefilled from the event and
delivery lists' filters) after its dry-run count, followed on a page that reloads
itself, paused, resumed and cancelled. The engines run them (deliveries/replays.py)."""

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from unfold.widgets import UnfoldAdminCheckboxSelectMultipleWidget, UnfoldAdminSelectWidget

from deliveries import replays
from deliveries.admin.base import (
    DateTimeLocalWidget,
    OwnedAdmin,
    ask_first,
    badge,
    parse_id,
    post_buttons,
    post_urls,
    redirect_back,
)
from deliveries.admin.filters import WebhookFilter
from deliveries.models import Delivery, ReplayJob, Target, Webhook

State = ReplayJob.State
_COLOURS = {
    State.PLANNING: "#6b7280",
    State.RUNNING: "#1d4ed8",
    State.PAUSED: "#b45309",
    State.CANCELLED: "#6b7280",
    State.DONE: "#15803d",
}
# One per state: a state without a colour is a KeyError when the admin loads.
STATE_COLOURS = {state: _COLOURS[state] for state in State}

# The buttons a job's page shows in each state: (verb, label, css).
CONTROLS = {
    State.PLANNING: [("pause", "Pause", ""), ("cancel", "Cancel", "")],
    State.RUNNING: [("pause", "Pause", ""), ("cancel", "Cancel", "")],
    State.PAUSED: [("resume", "Resume", "wh-button-primary"), ("cancel", "Cancel", "")],
}
VERBS = {"pause": replays.pause, "resume": replays.resume, "cancel": replays.cancel}


class ReplayForm(forms.Form):
    """What a job selects; valid, `criteria` holds it, checked (Criteria.clean())."""

    webhook = forms.ModelChoiceField(
        queryset=Webhook.objects.none(), widget=UnfoldAdminSelectWidget
    )
    since = forms.DateTimeField(
        label="Received since (UTC)",
        widget=DateTimeLocalWidget,
        help_text="Events received at or after this time.",
    )
    until = forms.DateTimeField(
        label="Received before (UTC)",
        required=False,
        widget=DateTimeLocalWidget,
        help_text="Empty: now.",
    )
    target = forms.ModelChoiceField(
        queryset=Target.objects.none(),
        required=False,
        widget=UnfoldAdminSelectWidget,
        label="Only deliveries to",
        help_text="Empty: to any of the webhook's targets.",
    )
    statuses = forms.MultipleChoiceField(
        choices=Delivery.Status.choices,
        required=False,
        widget=UnfoldAdminCheckboxSelectMultipleWidget,
        label="Only deliveries that are",
        help_text="None ticked: every finished one (delivered, failed, filtered). Pending "
        "and retrying ones are on their way already, so only with “Send to”.",
    )
    to_target = forms.ModelChoiceField(
        queryset=Target.objects.none(),
        required=False,
        widget=UnfoldAdminSelectWidget,
        label="Send to",
        help_text="Empty: each delivery again to its own target. A target of the webhook: "
        "each matched event to it instead (a delivery created for it where it had none).",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["webhook"].queryset = Webhook.objects.visible_to(user).order_by("name")
        targets = Target.objects.visible_to(user).select_related("webhook")
        for name in ("target", "to_target"):
            self.fields[name].queryset = targets.order_by("webhook__name", "name")
            self.fields[name].label_from_instance = lambda t: f"{t.webhook.name} → {t.name}"

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        data["until"] = data["until"] or timezone.now()
        self.criteria = replays.Criteria(
            data["webhook"],
            data["since"],
            data["until"],
            data["target"],
            tuple(data["statuses"]),
            data["to_target"],
        )
        try:
            self.criteria.clean()
        except ValidationError as error:
            self.add_error(None, error)  # each message on its field
        return data

    def as_query(self) -> dict:
        """The cleaned selection as the fields post it (the job is started from
        exactly what was counted: `until` fixed)."""
        data = self.cleaned_data
        return {
            "webhook": str(data["webhook"].pk),
            # To the microsecond: the job is the window counted, not its minutes.
            "since": data["since"].isoformat(),
            "until": data["until"].isoformat(),
            "target": str(data["target"].pk) if data["target"] else "",
            "statuses": list(data["statuses"]),
            "to_target": str(data["to_target"].pk) if data["to_target"] else "",
        }


def describe(criteria: replays.Criteria) -> str:
    """The selection in words, for the confirmation page."""
    what = (
        f"the {' or '.join(criteria.statuses)} deliveries"
        if criteria.statuses
        else "the finished deliveries"
    )
    if criteria.target is not None:
        what += f" to {criteria.target.name}"
    window = f"{criteria.since:%Y-%m-%d %H:%M} to {criteria.until:%Y-%m-%d %H:%M} UTC"
    where = (
        f"each of those events is sent to {criteria.to_target.name}"
        if criteria.to_target is not None
        else "each is sent again to its own target"
    )
    return (
        f"Of the events webhook {criteria.webhook.name} received from {window}: {what}; "
        f"{where}, paced by the target's rate limit and breaker."
    )


class ReplayWebhookFilter(WebhookFilter):
    field = "webhook"


# The list filters a "Replay as a job…" link carries over, by list: {its query
# parameter: the form's field}. Ranges are the filters' two inputs, date and time.
FROM_LIST = {
    "event": {
        "webhook": "webhook",
        "delivery_status": "statuses",
        "received_at_from": "since",
        "received_at_to": "until",
    },
    "delivery": {
        "webhook": "webhook",
        "target": "target",
        "status__exact": "statuses",
        "created_at_from": "since",
        "created_at_to": "until",
    },
}


def replay_link(request, model_name: str) -> str:
    """The add page of a replay job, prefilled from a list's current filters; "" for
    a user who may not start one."""
    if not request.user.has_perm("deliveries.add_replayjob"):
        return ""
    query = request.GET
    prefill = {}
    for param, field in FROM_LIST[model_name].items():
        if param.endswith(("_from", "_to")):
            day, time = query.get(f"{param}_0", ""), query.get(f"{param}_1", "")
            if day:  # as the form's datetime-local input writes it
                prefill[field] = f"{day}T{time or '00:00'}"
        elif query.get(param):
            prefill[field] = query.get(param)
    url = reverse("admin:deliveries_replayjob_add")
    return f"{url}?{urlencode(prefill)}" if prefill else url


class OffersReplay:
    """ "Replay as a job…" above a list, prefilled from its filters (`replay_from`:
    which list's, FROM_LIST)."""

    replay_from: str

    def changelist_view(self, request, extra_context=None):
        link = {"replay_url": replay_link(request, self.replay_from)}
        return super().changelist_view(request, {**(extra_context or {}), **link})


@admin.register(ReplayJob)
class ReplayJobAdmin(OwnedAdmin):
    list_display = [
        "name",
        "webhook",
        "window",
        "selection",
        "state_badge",
        "progress",
        "created_at",
    ]
    list_display_links = ["name"]
    list_select_related = ["webhook", "target", "to_target"]
    list_filter = ["state", ReplayWebhookFilter]
    change_form_template = "admin/deliveries/refreshing_change_form.html"
    fieldsets = [
        (None, {"fields": ["controls", ("state_badge", "progress")]}),
        (None, {"fields": [("webhook", "window"), "selection"]}),
        (None, {"fields": [("created_by", "created_at"), ("planned_at", "finished_at")]}),
    ]
    readonly_fields = flatten_fieldsets(fieldsets)

    def get_urls(self):
        return post_urls(self, self.control, VERBS) + super().get_urls()

    def add_view(self, request, form_url="", extra_context=None):
        """The form (prefilled from ?webhook=&since=…), then its dry-run count to
        confirm, then the job."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        posted = request.method == "POST"
        form = ReplayForm(
            request.POST if posted else None, initial=self.prefill(request), user=request.user
        )
        if not posted or not form.is_valid():
            return self.ask(request, form)
        if request.POST.get("confirm") == "1":
            job = replays.start(form.criteria, request.user)
            self.message_user(
                request, f"Replay job {job.pk} started: the engines run it.", messages.SUCCESS
            )
            return HttpResponseRedirect(reverse("admin:deliveries_replayjob_change", args=[job.pk]))
        count = form.criteria.count()
        if not count:
            self.message_user(request, "Nothing matches: no job started.", messages.WARNING)
            return self.ask(request, form)
        return ask_first(
            self,
            request,
            title="Start a replay job",
            intro=describe(form.criteria)
            + " Counted now, a dry run: the job fixes its own list when an engine "
            "plans it.",
            objects=[],
            hidden={**form.as_query(), "confirm": "1"},
            submit=f"Start the replay: {count} deliveries",
            count=count,
            noun="deliveries",
        )

    def ask(self, request, form):
        return ask_first(
            self,
            request,
            title="Replay events",
            intro="Choose what to send again; the next page says exactly how many.",
            objects=[],
            form=form,
            hidden={},
            submit="Count (dry run)",
        )

    def prefill(self, request) -> dict:
        initial = {name: request.GET.get(name) for name in ReplayForm.base_fields}
        initial["statuses"] = request.GET.getlist("statuses")
        initial = {k: v for k, v in initial.items() if v}
        target = parse_id(initial.get("target"))
        if target and "webhook" not in initial:
            webhook = (
                Target.objects.visible_to(request.user)
                .filter(pk=target)
                .values_list("webhook", flat=True)
            )
            initial["webhook"] = webhook.first()
        return initial

    def control(self, verb, request, object_id):
        job = self.get_object(request, object_id)  # 404 for others' jobs
        if not self.has_change_permission(request, job):
            raise PermissionDenied
        if VERBS[verb](job):
            self.message_user(request, f"Replay job {job.pk}: {verb} done.", messages.SUCCESS)
        else:
            job.refresh_from_db()
            self.message_user(
                request, f"Replay job {job.pk} is {job.state}: nothing to {verb}.", messages.INFO
            )
        fallback = reverse("admin:deliveries_replayjob_change", args=[job.pk])
        return redirect_back(request, request.GET.get("next", ""), fallback)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None and not obj.is_over():
            context["refresh_seconds"] = settings.WEBHOOKER_CONSOLE_REFRESH
        context.update(
            show_save=False, show_save_and_continue=False, show_save_and_add_another=False
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description="Job", ordering="pk")
    def name(self, obj):
        return f"Replay {obj.pk}"

    @admin.display(description="Received")
    def window(self, obj):
        return f"{obj.since:%Y-%m-%d %H:%M} – {obj.until:%Y-%m-%d %H:%M}"

    @admin.display(description="Selection")
    def selection(self, obj):
        what = ", ".join(obj.statuses) or "finished"
        if obj.target is not None:
            what += f" to {obj.target.name}"
        where = f"→ {obj.to_target.name}" if obj.to_target is not None else "→ same targets"
        return f"{what} {where}"

    @admin.display(description="State", ordering="state")
    def state_badge(self, obj):
        return badge(STATE_COLOURS[State(obj.state)], obj.state)

    @admin.display(description="Progress")
    def progress(self, obj):
        return render_to_string("admin/deliveries/replayjob/progress.html", {"job": obj})

    @admin.display(description="")
    def controls(self, obj):
        here = reverse("admin:deliveries_replayjob_change", args=[obj.pk])
        return post_buttons(
            [
                (reverse(f"admin:deliveries_replayjob_{verb}", args=[obj.pk]), label, css)
                for verb, label, css in CONTROLS.get(obj.state, [])
            ],
            here,
            empty="–",
        )
