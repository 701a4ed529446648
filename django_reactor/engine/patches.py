"""Patches: which branch of a changed step body a run takes (``self.context.patched(name)``).

Code changes while runs are in flight. A step body that changes what it does (its external
calls, the shape of its result) asks ``patched("tax-v2")``: True takes the new branch, False
the old one. Each run decides once per patch name, and the decision is recorded durably
before ``patched()`` returns, so every later call for that run (the same step again after a
crash, a retry, other steps, its undo) gets the same answer.

The first decision: True (the run reaches the patch after it was deployed), except in a step
that an earlier process of this run may have started (:attr:`StepContext.attempted_before`,
worked out by ``RunState.restore``): that attempt may have run code without the patch, the old
branch, and done part of its work, so the run stays on the old branch (False). Attempts made
by this process ran this code: they would have recorded a decision had they reached the call.

Both branches must stay correct while runs may be on either: that is a patch's contract.
``deprecated_patch(name)`` marks the old branch removed (see :meth:`Patches.deprecate`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Protocol

from ..exceptions import PatchError, PatchRemoved
from .serialization import safe_repr

#: A patch's name: letters, digits and ``._:-``, starting with a letter or a digit.
PATCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
#: The longest patch name.
MAX_PATCH_NAME = 100


class PatchBook(Protocol):
    """Where a run's patch decisions are kept (the run's journal: the store's, or in memory)."""

    def patch_decisions(self) -> Mapping[str, bool]:
        """Every decision the run recorded, by patch name (one read)."""
        ...

    def decide_patch(self, name: str, taken: bool, step: str) -> bool:
        """Record that the run takes the new branch of patch ``name`` (``taken``) or the old
        one, decided in ``step``, unless a decision is recorded already; return the recorded
        one. Durable when it returns."""
        ...


def check_name(name: object, where: str) -> str:
    """``name`` when it is a patch name; else PatchError saying what one is."""
    if isinstance(name, str) and len(name) <= MAX_PATCH_NAME and PATCH_NAME.fullmatch(name):
        return name
    raise PatchError(
        f"{where}({safe_repr(name)}) takes a patch name of at most {MAX_PATCH_NAME} letters, "
        "digits and '._:-', starting with a letter or a digit (such as 'tax-v2')"
    )


class Patches:
    """One run's patch decisions as this process knows them: read from its book on first use
    (never for a run whose steps ask nothing), then kept; decisions made here are added.

    Shared by the run's steps, also those running side by side in threads.
    """

    def __init__(self, book: PatchBook) -> None:
        self._book = book
        self._known: dict[str, bool] | None = None
        self._lock = threading.Lock()

    def recorded(self, name: str) -> bool | None:
        """The run's decision for ``name``; None when it has none."""
        with self._lock:
            return self._read().get(name)

    def decide(self, name: str, step: str, *, attempted_before: bool) -> bool:
        """The run's decision for ``name``, made now in ``step`` when it has none (True, unless
        an earlier process may have started the step: see the module's docstring)."""
        with self._lock:
            known = self._read()
            if name not in known:
                # Another lane, or another process, may decide at the same time: the book keeps
                # the first decision and says which it is.
                known[name] = self._book.decide_patch(name, not attempted_before, step)
            return known[name]

    def deprecate(self, name: str, step: str, *, attempted_before: bool, deciding: bool) -> None:
        """The code no longer has the old branch of ``name``: a run without a decision is
        decided as ``patched()`` would (``deciding``: in a step's run; an undo or compensate
        decides nothing); a run on the old branch raises PatchRemoved."""
        taken = (
            self.decide(name, step, attempted_before=attempted_before)
            if deciding
            else self.recorded(name) is not False
        )
        if taken:
            return
        raise PatchRemoved(
            f"step {step!r} calls deprecated_patch({name!r}), but this run took the old branch "
            f"of patch {name!r} (patched({name!r}) returned False for it), which this code no "
            f"longer has. Nothing was rolled back. Deploy code that still has "
            f"patched({name!r}) and move the run back with reactor_migrate to finish it, or "
            "undo() or cancel() it",
            patch=name,
            step=step,
        )

    def _read(self) -> dict[str, bool]:
        if self._known is None:
            self._known = dict(self._book.patch_decisions())
        return self._known
