"""Links of the admin's list pages: reversed once per URL pattern, the same as ``reverse()``."""

from __future__ import annotations

import uuid

from django.urls import clear_script_prefix, reverse, set_script_prefix

from django_reactor.admin.display import admin_url, execution_link


def test_admin_url_is_reverse_under_any_script_prefix() -> None:
    run = uuid.uuid4()
    change = "admin:django_reactor_execution_change"
    elements = "admin:django_reactor_mapresult_changelist"
    try:
        for prefix in ("/", "/ops/"):
            set_script_prefix(prefix)
            assert admin_url(change, str(run)) == reverse(change, args=[str(run)])
            assert admin_url(elements) == reverse(elements)
            assert admin_url(change, str(run)).startswith(f"{prefix}admin/")
            assert f'href="{reverse(change, args=[str(run)])}"' in execution_link(run)
    finally:
        clear_script_prefix()
