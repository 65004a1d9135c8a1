"""What a client did not mean is refused, never dropped: a request serializer answers
400 for a key it does not know and for a query parameter sent empty. A typo in a
bulk action's selection ("webhok") silently left out would widen what it touches."""

from rest_framework import serializers
from rest_framework.utils import html

UNKNOWN = "Unknown field."
EMPTY = "Give a value, or leave the parameter out."


class RefusesUnknown:
    """Mixed into a request serializer. `context["also_known"]`: names that are
    someone else's (a list's paging parameters, say)."""

    def to_internal_value(self, data):
        if hasattr(data, "keys"):
            known = set(self.fields) | set(self.context.get("also_known", ()))
            errors = {name: [UNKNOWN] for name in sorted(set(data.keys()) - known)}
            if html.is_html_input(data):  # query parameters: `until=` is no filter
                for name in data:
                    field = self.fields.get(name)
                    if data.get(name) == "" and field and not getattr(field, "allow_blank", False):
                        errors[name] = [EMPTY]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)
