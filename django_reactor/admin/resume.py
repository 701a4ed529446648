"""The resume page of a paused run's interrupt: its payload entered field by field
(``forms.ResumeForm``), delivered through ``services.resume_interrupt``, which validates it as
it does a payload sent to the API, counts a refused one and logs each outcome.

A refused payload is said once: one note above the form (how many invalid payloads the
interrupt has taken, and that the run stays paused), each error under the field it is about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from .. import registry, services, store
from ..engine.validation import error_messages
from ..exceptions import (
    AlreadyResumed,
    InterruptClosed,
    InvalidPayload,
    NotWaiting,
    ReactorError,
    ReactorNotRegistered,
)
from ..models import Execution, Interrupt
from ..states import ExecutionStatus, InterruptStatus
from .display import APP, status_badge_of
from .forms import ResumeForm

if TYPE_CHECKING:
    from .operations import ExecutionOperations


def payload_serializer(interrupt: Interrupt, step: str) -> tuple[type | None, str]:
    """The interrupt's payload serializer (None: any JSON object), and what is wrong with its
    definition, if anything (the reactor gone from this process, the step no longer an
    interrupt)."""
    try:
        spec = registry.get(interrupt.reactor).definition.by_name.get(interrupt.step)
    except ReactorNotRegistered as exc:
        return None, str(exc)
    if spec is None or spec.interrupt is None:
        return None, f"{step!r} is no longer an interrupt of {interrupt.reactor}"
    serializer: type | None = spec.interrupt.payload
    return serializer, ""


def resume_view(
    admin: ExecutionOperations, request: HttpRequest, object_id: str, step: str
) -> HttpResponse:
    """The resume page: GET shows the form, POST delivers the payload."""
    if not admin.has_resume_interrupt_permission(request):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    row = admin._get_run(request, object_id)
    change_url = reverse(f"admin:{APP}_execution_change", args=[quote(str(row.pk))])
    if row.parent_id is not None and not row.detached:
        # A composed child's interrupts are resumed through the run at the top, by path.
        try:
            services.find_interrupt(execution_id=row.pk, step=step)
        except ReactorError as exc:
            admin.message_user(request, str(exc), messages.ERROR)
        return redirect(change_url)
    # ``step`` may be a path through composed children (checkout.approval).
    interrupt = store.interrupts.at(row.pk, step)
    if interrupt is None:
        raise Http404(f"execution {row.id} has no interrupt {step!r}")
    serializer_class, definition_problem = payload_serializer(interrupt, step)
    initial = {"background": interrupt.resume_mode == "background"}
    refusal = ""
    if request.method == "POST":
        form = ResumeForm(request.POST, initial=initial, serializer_class=serializer_class)
        if form.is_valid():
            try:
                services.resume_interrupt(
                    row.id,
                    step=step,
                    payload=form.payload(),
                    background=form.cleaned_data["background"],
                    reason=form.cleaned_data["reason"],
                )
            except InvalidPayload as exc:
                limit = f" of {exc.max_attempts}" if exc.max_attempts else ""
                admin.log_change(
                    request,
                    row,
                    f"Invalid payload for interrupt {step!r} (attempt {exc.attempts}{limit})",
                )
                if exc.run_failed:
                    admin.message_user(request, str(exc), messages.ERROR)
                    return redirect(change_url)
                form.refused(error_messages(exc.errors))
                refusal = str(
                    _(
                        "The payload was refused (invalid payload %(attempts)s%(limit)s); the run "
                        "stays paused. Correct what is marked below."
                    )
                    % {"attempts": exc.attempts, "limit": limit}
                )
                interrupt.refresh_from_db()
            except AlreadyResumed as exc:
                admin.message_user(request, str(exc), messages.WARNING)
                return redirect(change_url)
            except (InterruptClosed, NotWaiting, ReactorError, LookupError) as exc:
                admin.message_user(request, str(exc), messages.ERROR)
                return redirect(change_url)
            else:
                status = Execution.objects.filter(pk=row.pk).values_list("status", flat=True).get()
                label = dict(ExecutionStatus.choices).get(status, status)
                admin.log_change(request, row, f"Resumed interrupt {step!r}")
                admin.message_user(
                    request,
                    _("Payload accepted for %(step)s; the run is now %(status)s.")
                    % {"step": step, "status": str(label).lower()},
                    messages.SUCCESS,
                )
                return redirect(change_url)
    else:
        form = ResumeForm(initial=initial, serializer_class=serializer_class)
    context: dict[str, Any] = {
        **admin.admin_site.each_context(request),
        "title": _("Resume %(step)s") % {"step": step},
        "opts": admin.model._meta,
        "original": row,
        "change_url": change_url,
        "interrupt": interrupt,
        "interrupt_path": step,
        "interrupt_badge": status_badge_of(interrupt),
        "waiting": interrupt.status == InterruptStatus.WAITING,
        "form": form,
        "refusal": refusal,
        "serializer_name": serializer_class.__name__ if serializer_class else "",
        "definition_problem": definition_problem,
        "status_badge": status_badge_of(row),
    }
    request.current_app = admin.admin_site.name
    return TemplateResponse(request, "admin/django_reactor/execution/resume.html", context)
