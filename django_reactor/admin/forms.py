"""The resume form: an interrupt's payload as JSON, with help from its serializer."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _


def _example_value(field: Any) -> Any:
    """A placeholder value of the right JSON type for a DRF serializer field."""
    from rest_framework import serializers

    if isinstance(field, serializers.ListSerializer):
        return [_example_value(field.child)]
    if isinstance(field, serializers.BaseSerializer):
        return serializer_example(field)
    if isinstance(field, serializers.BooleanField):
        return False
    if isinstance(field, serializers.IntegerField):
        return field.min_value if isinstance(field.min_value, int) else 0
    if isinstance(field, serializers.FloatField | serializers.DecimalField):
        return 0
    if isinstance(field, serializers.ChoiceField):
        return next(iter(field.choices), "")
    if isinstance(field, serializers.ListField):
        return []
    if isinstance(field, serializers.DictField | serializers.JSONField):
        return {}
    return ""


def serializer_example(serializer: Any) -> dict[str, Any]:
    """A JSON object with every writable field of ``serializer`` (required ones first)."""
    fields = [f for f in serializer.fields.values() if not f.read_only]
    fields.sort(key=lambda f: not f.required)
    return {f.field_name: _example_value(f) for f in fields}


def serializer_help(serializer_class: type | None) -> list[dict[str, Any]]:
    """One row per writable field: name, type, required, help text."""
    if serializer_class is None:
        return []
    rows = []
    for field in serializer_class().fields.values():
        if field.read_only:
            continue
        choices = getattr(field, "choices", None)
        rows.append(
            {
                "name": field.field_name,
                "type": type(field).__name__.removesuffix("Field") or type(field).__name__,
                "required": field.required,
                "help_text": field.help_text or "",
                "choices": ", ".join(str(c) for c in choices) if choices else "",
            }
        )
    return rows


class ResumeForm(forms.Form):
    """The payload of an interrupt as a JSON object, where the rest of the run goes, and why
    (recorded with who delivered it)."""

    payload = forms.CharField(
        label=_("Payload (JSON object)"),
        widget=forms.Textarea(attrs={"rows": 12, "cols": 80, "class": "vLargeTextField"}),
    )
    background = forms.BooleanField(
        label=_("Run the rest on a worker"),
        required=False,
        help_text=_(
            "Checked: a worker runs the rest of the run and this page returns at once. "
            "Unchecked: this request runs it."
        ),
    )
    reason = forms.CharField(
        label=_("Reason (optional)"),
        required=False,
        max_length=500,
        widget=forms.TextInput(attrs={"class": "vTextField"}),
        help_text=_("Why: kept with your name in the run's trace and the steering history."),
    )

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"]
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(
                _("This is not valid JSON: %(error)s"), params={"error": exc}
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(_("The payload must be a JSON object ({...})."))
        return value
