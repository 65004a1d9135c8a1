"""What a client did not mean is refused, never dropped: a request serializer answers
400 for a key it does not know and for a query parameter sent empty. A typo in a
bulk action's selection ("webhok") silently left out would widen what it touches."""

from rest_framework import serializers
from rest_framework.utils import html

UNKNOWN = "Unknown field."
EMPTY = "Give a value, or leave the parameter out."


# (field classes, the JSON types they take, in words), first match wins.
JSON_TYPES = (
    (serializers.BooleanField, (bool,), "true or false"),
    ((serializers.IntegerField, serializers.PrimaryKeyRelatedField), (int,), "a whole number"),
    ((serializers.FloatField, serializers.DecimalField), (int, float), "a number"),
    (
        (
            serializers.CharField,
            serializers.UUIDField,
            serializers.DateTimeField,
            serializers.ChoiceField,
        ),
        (str,),
        "a string",
    ),
    (serializers.ListField, (list,), "a list"),
)


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
            elif self._from_json():  # each value of the JSON type its field documents
                errors.update(self._mistyped(data))
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def _from_json(self) -> bool:
        """Whether `data` is an API request's JSON body (a command's options are
        strings, a query string's too)."""
        request = self.context.get("request")
        return request is not None and "json" in (request.content_type or "")

    def _mistyped(self, data) -> dict:
        """DRF takes 0 for false, 1 for true, "5" for 5 and false for the UUID 0:
        a client that sends them means something else. The schema says which JSON
        type each field takes; anything else is refused in words."""
        errors = {}
        for name, value in data.items():
            field = self.fields.get(name)
            if field is None or field.read_only or (value is None and field.allow_null):
                continue
            for kinds, json_types, words in JSON_TYPES:
                if isinstance(field, kinds):
                    if not isinstance(value, json_types) or (
                        isinstance(value, bool) and bool not in json_types
                    ):
                        errors[name] = [f"Must be {words}."]
                    break
        return errors
