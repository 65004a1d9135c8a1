"""The target form: one proper field per config key instead of raw JSON.

Each target type declares the form fields of its config next to its clean_config()
(deliveries/targets); this form holds the fields of every type and reads those of
the type chosen.
"""

import copy

from django import forms
from django.core.exceptions import ValidationError

from deliveries.models import Target
from deliveries.targets import TARGET_TYPES, clean_config

# {type: {config key: form field}}. A field marked required there is required when
# its type is chosen; in the form every one is optional.
CONFIG_FIELDS = {type_: kind.form_fields() for type_, kind in TARGET_TYPES.items()}


def _optional(field: forms.Field) -> forms.Field:
    field = copy.deepcopy(field)
    field.required = False
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


class TargetForm(forms.ModelForm, _ConfigFields):
    type_fields = {type_: tuple(fields) for type_, fields in CONFIG_FIELDS.items() if fields}

    class Meta:
        model = Target
        fields = ["name", "type", "active", "max_retries", "max_queue_size"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.instance.config or {}
        for name in _ConfigFields.base_fields.keys() & config.keys():
            self.initial.setdefault(name, config[name])
        self.fields["type"].widget.attrs["data-target-type"] = "1"

    @classmethod
    def type_fieldsets(cls) -> list:
        """Admin fieldsets of each type's fields; admin.js shows the chosen type's."""
        return [
            (TARGET_TYPES[type_].label, {"fields": list(names), "classes": [f"wh-type-{type_}"]})
            for type_, names in cls.type_fields.items()
        ]

    def clean(self):
        cleaned = super().clean()
        type_ = cleaned.get("type")
        if not type_:
            return cleaned
        config = {}
        for name, field in CONFIG_FIELDS[type_].items():
            value = cleaned.get(name)
            if value not in (None, "", {}):
                config[name] = value
            elif field.required and name not in self.errors:
                self.add_error(name, field.error_messages["required"])
        if not self.errors:
            # The validation Target.clean_fields() applies to every other way of
            # saving; it leaves the config to this form, which has no config field.
            try:
                self.instance.config = clean_config(type_, config)
            except ValidationError as exc:
                self.add_error(TARGET_TYPES[type_].main_field, exc.messages)
        return cleaned
