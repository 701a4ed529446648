"""The resume form: an interrupt's payload entered field by field, as its serializer declares it.

Each writable field of the payload serializer becomes an HTML input of its kind (a text box, a
number, a checkbox, a list of choices, a date); a field HTML has no input for (a nested
serializer, a list, a dictionary, any JSON) gets a JSON text box of its own, and an interrupt
without a serializer (or whose reactor this process does not know) a JSON text box for the
whole payload. The form only turns what was typed into a payload: the serializer validates it,
in ``services.resume_interrupt``, exactly as it does a payload sent to the API.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

#: The form's fields of the payload are named ``payload-<serializer field>`` (so that a field
#: of the payload never meets the form's own ``background``); without a serializer the whole
#: payload is ``payload``.
PREFIX = "payload-"
WHOLE = "payload"


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
        return [_example_value(field.child)]
    if isinstance(field, serializers.DictField | serializers.JSONField):
        return {}
    return ""


def serializer_example(serializer: Any) -> dict[str, Any]:
    """A JSON object with every writable field of ``serializer`` (required ones first)."""
    fields = [f for f in serializer.fields.values() if not f.read_only]
    fields.sort(key=lambda f: not f.required)
    return {f.field_name: _example_value(f) for f in fields}


def _default(field: Any) -> Any:
    """The field's declared default, or None (none, or one computed per call)."""
    from rest_framework.fields import empty

    default = field.default
    if default is empty or callable(default):
        return None
    return default


def _bounds(field: Any) -> dict[str, str]:
    attrs = {}
    for name, attr in (("min_value", "min"), ("max_value", "max")):
        value = getattr(field, name, None)
        if value is not None:
            attrs[attr] = str(value)
    return attrs


class JSONText(forms.CharField):
    """A JSON value typed as text, for a field HTML has no input for."""

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text is None or text in self.empty_values:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(
                _("This is not valid JSON: %(error)s"), params={"error": exc}
            ) from None


class Choice(forms.ChoiceField):
    """A list of choices whose value the serializer checks, not the form (as for the API)."""

    def valid_value(self, value: Any) -> bool:
        return True


class Choices(forms.MultipleChoiceField):
    """Several choices, checked by the serializer."""

    def valid_value(self, value: Any) -> bool:
        return True


def form_field(field: Any) -> tuple[forms.Field, str]:
    """:func:`input_for` one DRF serializer field, marked ``required`` (for people and screen
    readers: the form is sent without the browser's checks, the serializer does them) when the
    serializer requires it and the input is not a checkbox."""
    shown, kind = input_for(field)
    if field.required and kind != "flag":
        shown.widget.attrs["required"] = "required"
    return shown, kind


def input_for(field: Any) -> tuple[forms.Field, str]:
    """The form field for one DRF serializer field, and its kind: ``text`` (sent as typed,
    empty sends nothing), ``flag`` (a checkbox: true or false), ``choice``, ``many``, ``json``
    (parsed from the text) or ``blankable`` (text a required field may also take empty)."""
    from rest_framework import serializers

    label = str(field.label or field.field_name.replace("_", " ").capitalize())
    common: dict[str, Any] = {
        "label": label,
        "required": False,  # the serializer says what is missing, as for the API
        "help_text": field.help_text or "",
    }
    default = _default(field)
    if isinstance(field, serializers.BaseSerializer | serializers.ListField):
        example = _example_value(field)
        return (
            JSONText(
                **common,
                initial=json.dumps(default if default is not None else example, indent=2),
                widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "class": "vLargeTextField"}),
            ),
            "json",
        )
    if isinstance(field, serializers.DictField | serializers.JSONField | serializers.HStoreField):
        return (
            JSONText(
                **common,
                initial=json.dumps(default if default is not None else {}),
                widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "class": "vLargeTextField"}),
            ),
            "json",
        )
    if isinstance(field, serializers.BooleanField) and not field.allow_null:
        return forms.BooleanField(**common, initial=bool(default)), "flag"
    if isinstance(field, serializers.BooleanField):
        return forms.NullBooleanField(**common, initial=default), "choice"
    if isinstance(field, serializers.MultipleChoiceField):
        choices = [(str(key), label) for key, label in field.choices.items()]
        return (
            Choices(
                **common,
                choices=choices,
                initial=[str(v) for v in default] if default else [],
            ),
            "many",
        )
    if isinstance(field, serializers.ChoiceField):
        choices = [("", "---------")] + [(str(key), label) for key, label in field.choices.items()]
        initial = "" if default is None else str(default)
        return Choice(**common, choices=choices, initial=initial), "choice"
    initial = "" if default is None else str(default)
    if isinstance(field, serializers.IntegerField):
        widget: forms.Widget = forms.NumberInput(attrs={**_bounds(field), "step": "1"})
    elif isinstance(field, serializers.FloatField | serializers.DecimalField):
        widget = forms.NumberInput(attrs={**_bounds(field), "step": "any"})
    elif isinstance(field, serializers.DateTimeField):
        widget = forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
        )
    elif isinstance(field, serializers.DateField):
        widget = forms.DateInput(attrs={"type": "date"})
    elif isinstance(field, serializers.TimeField):
        widget = forms.TimeInput(attrs={"type": "time", "step": "1"})
    elif isinstance(field, serializers.EmailField):
        widget = forms.EmailInput(attrs={"class": "vTextField"})
    elif isinstance(field, serializers.URLField):
        widget = forms.URLInput(attrs={"class": "vURLField"})
    elif isinstance(field, serializers.CharField):
        attrs = {"class": "vTextField"}
        if field.max_length is not None:
            attrs["maxlength"] = str(field.max_length)
        widget = forms.TextInput(attrs=attrs)
        return forms.CharField(**common, initial=initial, widget=widget, strip=False), ("blankable")
    elif isinstance(field, serializers.Field):
        widget = forms.TextInput(attrs={"class": "vTextField"})
    return forms.CharField(**common, initial=initial, widget=widget, strip=False), "text"


class ResumeForm(forms.Form):
    """An interrupt's payload, field by field (see the module), where the rest of the run
    goes, and why (recorded with who delivered it). :meth:`payload` is what it sends to the
    serializer; :meth:`refused` puts the serializer's errors under the fields they are
    about."""

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

    def __init__(self, *args: Any, serializer_class: type | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        background = self.fields.pop("background")
        #: The serializer field behind each form field, with its kind (see ``form_field``).
        self.payload_fields: dict[str, tuple[Any, str]] = {}
        if serializer_class is None:
            self.fields[WHOLE] = JSONText(
                label=_("Payload (JSON object)"),
                initial="{}",
                widget=forms.Textarea(attrs={"rows": 12, "cols": 80, "class": "vLargeTextField"}),
            )
        else:
            for field in serializer_class().fields.values():
                if field.read_only or type(field).__name__ == "HiddenField":
                    continue
                shown, kind = form_field(field)
                self.fields[PREFIX + field.field_name] = shown
                self.payload_fields[PREFIX + field.field_name] = (field, kind)
        self.fields["background"] = background

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if WHOLE in self.fields and WHOLE not in self.errors:
            value = data.get(WHOLE)
            if not isinstance(value, dict):
                self.add_error(WHOLE, _("The payload must be a JSON object ({...})."))
        return data

    def payload(self) -> dict[str, Any]:
        """The payload the serializer gets: what was typed, each value as its input gives it
        (the serializer turns ``"12"`` into 12 as it would for the API); an empty input sends
        nothing, so that the field's default applies, or the serializer says it is required."""
        if WHOLE in self.fields:
            whole: dict[str, Any] = self.cleaned_data[WHOLE]
            return whole
        payload: dict[str, Any] = {}
        for name, (field, kind) in self.payload_fields.items():
            value = self.cleaned_data.get(name)
            if kind == "flag":
                payload[field.field_name] = bool(value)
            elif kind == "many":
                if value or field.required:
                    payload[field.field_name] = list(value or [])
            elif kind == "json":
                if value is not None:
                    payload[field.field_name] = value
            elif value not in (None, ""):
                payload[field.field_name] = value
            elif kind == "blankable" and field.required:
                payload[field.field_name] = ""  # the serializer decides whether blank will do
        return payload

    def refused(self, messages: list[tuple[str, str]]) -> None:
        """Put each ``(field path, message)`` of the serializer's errors under its field; an
        error of the whole payload, or of a field without an input, above the form."""
        for path, message in messages:
            head, _dot, rest = path.partition(".")
            name = PREFIX + head if head else ""
            if WHOLE in self.fields:
                self.add_error(WHOLE, f"{path}: {message}" if path else message)
            elif name in self.fields:
                self.add_error(name, f"{rest}: {message}" if rest else message)
            else:
                self.add_error(None, f"{path}: {message}" if path else message)
