"""The target form: one proper field per config key instead of raw JSON."""

from django import forms
from django.core.exceptions import ValidationError

from deliveries.models import Target
from deliveries.targets import clean_config
from deliveries.targets.http import DROPPED_HEADERS, MAX_TIMEOUT, _has_newline, _token


class HeadersField(forms.CharField):
    """Extra headers, one `Name: value` per line."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": "X-Token: secret"})

    def prepare_value(self, value):
        if isinstance(value, dict):
            return "\n".join(f"{k}: {v}" for k, v in value.items())
        return value

    def to_python(self, value):
        headers = {}
        for n, line in enumerate((value or "").splitlines(), 1):
            if not line.strip():
                continue
            name, sep, val = line.partition(":")
            name, val = name.strip(), val.strip()
            if not sep or not _token(name) or _has_newline(val):
                raise ValidationError(f"Line {n} is not a valid 'Name: value' header.")
            if name.lower() in DROPPED_HEADERS:
                raise ValidationError(f"Line {n}: {name} is set by webhooker itself.")
            headers[name] = val
        return headers


class TargetForm(forms.ModelForm):
    url = forms.URLField(
        label="URL",
        required=False,
        assume_scheme="https",
        help_text="HTTP targets: where the event is POSTed (http:// or https://).",
        widget=forms.URLInput(attrs={"size": 60}),
    )
    headers = HeadersField(
        required=False, help_text="HTTP targets: extra headers, one 'Name: value' per line."
    )
    timeout = forms.FloatField(
        required=False,
        min_value=0.1,
        max_value=MAX_TIMEOUT,
        help_text="HTTP targets: seconds per attempt (empty: the engine's default).",
    )
    webhook_url = forms.URLField(
        label="Slack webhook URL",
        required=False,
        assume_scheme="https",
        help_text="Slack targets: the incoming-webhook URL (Slack, Mattermost, …).",
        widget=forms.URLInput(attrs={"size": 60}),
    )

    type_fields = {
        Target.Type.HTTP: ("url", "headers", "timeout"),
        Target.Type.SLACK: ("webhook_url",),
    }

    class Meta:
        model = Target
        fields = ["name", "type", "active", "max_retries", "max_queue_size"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.instance.config or {}
        for name in ("url", "headers", "timeout", "webhook_url"):
            if name in config:
                self.initial.setdefault(name, config[name])
        self.fields["type"].widget.attrs["data-target-type"] = "1"

    def clean(self):
        cleaned = super().clean()
        type_ = cleaned.get("type")
        config = {}
        for name in self.type_fields.get(type_, ()):
            value = cleaned.get(name)
            if value not in (None, "", {}):
                config[name] = value
        if type_ == Target.Type.HTTP and "url" not in config and "url" not in self.errors:
            self.add_error("url", "An HTTP target needs a URL.")
        if (
            type_ == Target.Type.SLACK
            and "webhook_url" not in config
            and "webhook_url" not in self.errors
        ):
            self.add_error("webhook_url", "A Slack target needs its webhook URL.")
        main_field = "webhook_url" if type_ == Target.Type.SLACK else "url"
        value = config.get(main_field, "")
        if value and not value.lower().startswith(("http://", "https://")):
            self.add_error(main_field, "Only http:// and https:// URLs can be targets.")
        if type_ and not self.errors:
            # The same validation Target.clean() applies to every way of saving.
            try:
                self.instance.config = clean_config(type_, config)
            except ValidationError as exc:
                self.add_error(main_field, exc.messages)
        return cleaned

    def _update_errors(self, errors):
        # Target.clean() reports config problems on `config`, which this form shows
        # as separate fields: put them on the field the user can correct.
        config_errors = getattr(errors, "error_dict", {}).pop("config", None)
        if config_errors:
            field = "webhook_url" if self.cleaned_data.get("type") == Target.Type.SLACK else "url"
            if field not in self.errors:
                for error in config_errors:
                    self.add_error(field, error)
        super()._update_errors(errors)
