"""The target and entrypoint forms: one proper field per config key instead of raw JSON.

Each target type declares the form fields of its config next to its clean_config()
(deliveries/targets); the target form holds the fields of every type and reads those
of the type chosen. The entrypoint form does the same for verification presets.
"""

import copy
import json

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
from unfold.widgets import (
    UnfoldAdminIntegerFieldWidget,
    UnfoldAdminTextareaWidget,
    UnfoldAdminTextInputWidget,
    UnfoldBooleanSwitchWidget,
)

from deliveries import verification
from deliveries.models import Entrypoint, Event, Target
from deliveries.targets import TARGET_TYPES, clean_config
from deliveries.targets.base import MASK, keep_secrets, masked_keys
from webhooker import encryption

# {type: {config key: form field}}. A field marked required there is required when
# its type is chosen; in the form every one is optional.
CONFIG_FIELDS = {type_: kind.form_fields() for type_, kind in TARGET_TYPES.items()}


def _optional(field: forms.Field) -> forms.Field:
    field = copy.deepcopy(field)
    field.required = False
    return _styled(field)


def _styled(field: forms.Field) -> forms.Field:
    """The field with unfold's widget of its kind, its attributes kept (the admin
    gives the model's fields unfold's widgets; the form's own fields were bare,
    borderless inputs). Widths are the page's: no size or cols."""
    widget = field.widget
    attrs = {k: v for k, v in widget.attrs.items() if k not in ("size", "cols")}
    if isinstance(widget, forms.CheckboxInput):
        styled = UnfoldBooleanSwitchWidget(attrs)
    elif isinstance(widget, forms.Textarea):
        styled = UnfoldAdminTextareaWidget(attrs)
    elif isinstance(widget, forms.NumberInput):
        styled = UnfoldAdminIntegerFieldWidget(attrs)
    elif isinstance(widget, forms.widgets.Input) and widget.input_type in ("text", "url"):
        styled = UnfoldAdminTextInputWidget(attrs)
        styled.input_type = widget.input_type
    else:
        return field
    field.widget = styled
    return field


# Declared on a form class, not added in __init__, so that the admin's fieldsets
# may name them.
_ConfigFields = type(
    "ConfigFields",
    (forms.Form,),
    {
        "__module__": __name__,
        **{
            name: _optional(field)
            for fields in CONFIG_FIELDS.values()
            for name, field in fields.items()
        },
    },
)


class FiltersField(forms.JSONField):
    """The filter rules as indented JSON, one rule a line or so, not one long line."""

    def prepare_value(self, value):
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value or [], indent=2, ensure_ascii=False)


class RetryScheduleField(forms.CharField):
    """A retry schedule typed as delays in seconds, "5, 60, 600"; the model checks
    the numbers (backoff.clean_schedule)."""

    def prepare_value(self, value):
        if isinstance(value, list):
            return ", ".join(f"{delay:g}" for delay in value)
        return value

    def to_python(self, value):
        delays = []
        for n, part in enumerate((value or "").replace(",", " ").split(), 1):
            try:
                number = float(part)
            except ValueError:
                raise ValidationError(f"Retry {n}: {part!r} is not a number of seconds.") from None
            delays.append(int(number) if number.is_integer() else number)
        return delays


class TargetForm(forms.ModelForm, _ConfigFields):
    type_fields = {type_: tuple(fields) for type_, fields in CONFIG_FIELDS.items() if fields}
    # Who edits (for_user): named in the reason when they pause without giving one.
    user = None

    filters = FiltersField(
        required=False,
        widget=UnfoldAdminTextareaWidget(
            attrs={"rows": 4, "class": "wh-json-input", "data-filter-rows": "1"}
        ),
        help_text=Target._meta.get_field("filters").help_text
        + " One rule a row: a header's value, a dotted path into a JSON body, or the "
        "event's type; ops equals, one of (comma-separated), exists, not equals. "
        '(As JSON: [{"source": "header", "name": "X-GitHub-Event", "op": "equals", '
        '"value": "push"}].)',
    )

    retry_schedule = RetryScheduleField(
        required=False,
        label="Retry schedule",
        help_text="Seconds before each retry, e.g. 5, 60, 600, 3600 (empty: exponential "
        "backoff up to Max retries). When set, its length is the number of retries.",
    )

    class Meta:
        model = Target
        fields = [
            "name",
            "type",
            "active",
            "max_retries",
            "retry_schedule",
            "max_queue_size",
            "paused",
            "paused_reason",
            *Target.DELIVERY_SETTINGS,
        ]
        labels = {"paused_reason": "Reason", "rate_limit": "Rate limit (per second)"}
        widgets = {
            "transform": UnfoldAdminTextareaWidget(
                attrs={
                    "rows": 5,
                    "class": "wh-json-input",
                    "spellcheck": "false",
                    "placeholder": '{body: {text: "\\(.event.type): \\(.body.id)"}}',
                }
            )
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kind = TARGET_TYPES.get(self.instance.type)
        shown = kind.shown_config(self.instance.config or {}) if kind else {}
        for name in _ConfigFields.base_fields.keys() & shown.keys():
            self.initial.setdefault(name, shown[name])
        self.fields["type"].widget.attrs["data-target-type"] = "1"
        if self.instance.webhook_id:
            # The "deliver only these event types" shortcut offers what it has seen.
            seen = Event.objects.recent_types(self.instance.webhook_id)
            self.fields["filters"].widget.attrs["data-event-types"] = json.dumps(seen)
        # The engine pauses targets by itself: the form compares what it was shown
        # (a hidden initial) with what comes back, so a page opened before the engine
        # paused the target does not resume it on save unless the box was unticked.
        for name in ("paused", "paused_reason"):
            self.fields[name].show_hidden_initial = True
        # Empty means no limit, as 0 does.
        self.fields["rate_limit"].required = False

    @classmethod
    def for_user(cls, user):
        """The form for one request's user (the admin builds its form classes)."""
        return type(cls.__name__, (cls,), {"user": user, "__module__": cls.__module__})

    def clean_rate_limit(self):
        return self.cleaned_data.get("rate_limit") or 0

    def _clean_pause(self, cleaned):
        """Pause state from what the user changed, everything else as it is now."""
        instance = self.instance
        if "paused" not in self.changed_data:
            cleaned["paused"] = instance.paused
            if not (instance.paused and "paused_reason" in self.changed_data):
                cleaned["paused_reason"] = instance.paused_reason
        elif cleaned.get("paused"):
            who = self.user.get_username() if self.user else "hand"
            cleaned["paused_reason"] = cleaned.get("paused_reason") or f"paused by {who}"
            instance.paused_at = timezone.now()
        else:
            cleaned["paused_reason"] = ""
            instance.paused_at = None

    @classmethod
    def type_fieldsets(cls) -> list:
        """Admin fieldsets of each type's fields; admin.js shows the chosen type's."""
        return [
            (TARGET_TYPES[type_].label, {"fields": list(names), "classes": [f"wh-type-{type_}"]})
            for type_, names in cls.type_fields.items()
        ]

    def clean(self):
        cleaned = super().clean()
        self._clean_pause(cleaned)
        type_ = cleaned.get("type")
        if not type_:
            return cleaned
        config = {}
        stored = self.instance.config if self.instance.pk else {}
        fields = CONFIG_FIELDS[type_]
        if encryption.unreadable(stored) and not any(cleaned.get(name) for name in fields):
            return cleaned  # kept as stored until typed again (README, Secrets at rest)
        for name, field in fields.items():
            value = cleaned.get(name)
            if value not in (None, "", {}):
                config[name] = value
            elif field.required and name not in self.errors:
                self.add_error(name, field.error_messages["required"])
        if not self.errors and stored and type_ == self.instance.type:
            # What the form showed of the stored config, sent back, keeps it.
            shown = TARGET_TYPES[type_].shown_config(stored)
            try:
                config = keep_secrets(config, shown, stored)
            except ValidationError as exc:
                self.add_error(TARGET_TYPES[type_].main_field, exc)
        elif not self.errors and masked_keys(config):
            self.add_error(
                TARGET_TYPES[type_].main_field, f"Type the secrets themselves, not {MASK}."
            )
        if not self.errors:
            # The validation Target.clean_fields() applies to every other way of
            # saving; it leaves the config to this form, which has no config field.
            try:
                self.instance.config = clean_config(type_, config)
            except ValidationError as exc:
                self.add_error(TARGET_TYPES[type_].main_field, exc.messages)
        return cleaned


class PauseForm(forms.Form):
    """The target list's Pause action asks why."""

    reason = forms.CharField(
        max_length=500,
        required=False,
        widget=forms.TextInput(attrs={"size": 60}),
        help_text="Shown on the target while it is paused (empty: “paused by” you).",
    )


class RedeliverFailedForm(forms.Form):
    """The target list's Redeliver failed action asks since when."""

    since = forms.DateTimeField(
        label="Failed since (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Every delivery of these targets that failed at or after this time is "
        "sent again (its earlier attempts are kept).",
    )


class EntrypointForm(forms.ModelForm):
    """An entrypoint with its verification preset's settings as fields.

    Secrets are write-only: the page never sends them back, and a secret field left
    blank keeps the one stored for the same preset.
    """

    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The signing secret or token the sender was given (blank: keep the current one).",
    )
    header = forms.CharField(
        required=False,
        max_length=100,
        help_text="The header carrying the signature or token, e.g. X-Signature.",
    )
    algorithm = forms.ChoiceField(
        required=False, choices=[(a, a.upper()) for a in verification.ALGORITHMS]
    )
    encoding = forms.ChoiceField(required=False, choices=[(e, e) for e in verification.ENCODINGS])
    prefix = forms.CharField(
        required=False,
        strip=False,
        max_length=50,
        help_text="Text before the signature in the header, e.g. sha256= (may be empty).",
    )
    username = forms.CharField(required=False, max_length=150)
    password = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Blank: keep the current one.",
    )

    # Every config key has a field of the same name above.
    config_keys = ("secret", "header", "algorithm", "encoding", "prefix", "username", "password")

    class Meta:
        model = Entrypoint
        fields = ["description", "active", "verification", "dedup", "dedup_source"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        preset = verification.PRESETS.get(self.instance.verification)
        config = self.instance.verification_config or {}
        for key in self.config_keys:
            if preset is not None and key not in preset.secret_keys and key in config:
                self.initial.setdefault(key, config[key])
        # What trust.js needs to show only the chosen preset's fields.
        self.fields["verification"].widget.attrs.update(
            {
                "data-preset-keys": json.dumps(
                    {name: list(p.keys) for name, p in verification.PRESETS.items()}
                ),
                "data-all-keys": json.dumps(self.config_keys),
            }
        )

    def clean(self):
        cleaned = super().clean()
        name = cleaned.get("verification")
        preset = verification.PRESETS.get(name)
        if preset is None:
            return cleaned
        stored = self.instance.verification_config or {}
        # The stored secrets are kept only for the preset they were entered for.
        kept = stored if self.instance.pk and self.instance.verification == name else {}
        config = {}
        for key in preset.keys:
            value = cleaned.get(key)
            if key in preset.secret_keys and not value:
                value = kept.get(key)
            if value not in (None, ""):
                config[key] = value
        try:
            self.instance.verification_config = verification.clean_config(name, config)
        except ValidationError as exc:
            for key, messages in exc.message_dict.items():
                self.add_error(key if key in self.fields else None, messages)
        return cleaned


def clean_header_lines(lines) -> list[list[str]]:
    """[[name, value], ...] as an event keeps them, or ValidationError naming the line."""
    from deliveries.targets.http import valid_header

    if not isinstance(lines, list):
        raise ValidationError("Headers are a list of [name, value] lines.")
    cleaned = []
    for n, line in enumerate(lines, 1):
        if (
            not isinstance(line, list | tuple)
            or len(line) != 2
            or not all(isinstance(part, str) for part in line)
            or not valid_header(line[0], line[1])
        ):
            raise ValidationError(f"Line {n} is not a valid [name, value] header line.")
        cleaned.append([line[0], line[1]])
    return cleaned


class ResendForm(forms.Form):
    """Edit and resend: an event's header lines and body, as the new event gets them."""

    headers = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "class": "wh-json-input"}),
        help_text="One 'Name: value' line each, in order; repeated names stay apart.",
    )
    body = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 14, "class": "wh-json-input"}),
        help_text="Sent as UTF-8.",
    )

    def clean_headers(self):
        lines = []
        for line in self.cleaned_data["headers"].splitlines():
            if line.strip():
                name, sep, value = line.partition(":")
                lines.append([name.strip(), value.strip()] if sep else [line, None])
        return clean_header_lines(lines)

    def clean_body(self):
        return self.cleaned_data["body"].encode("utf-8")
