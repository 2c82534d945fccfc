# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The preview-mappings action, wired to its event (the work is :mod:`vgpu.preview`).

Read only: a dry :class:`vgpu.reconcile.Host` (nothing learnt is saved), the
charm's options, relation data and StoredState read but never set, no host
lock taken. ``src/charm.py`` creates one :class:`Previewing`.
"""

from __future__ import annotations

from typing import List

import ops

from vgpu import RELATION, mappings, reconcile
from vgpu.errors import HostReadError, VgpuError

ACTION = "preview-mappings"


class Previewing(ops.Object):
    """Answers preview-mappings from the charm's options, relations and StoredState, read only."""

    def __init__(self, charm: ops.CharmBase, stored: ops.BoundStoredState, host: reconcile.Host):
        """Observe the action; ``host``: the dispatch's reading of the host, made dry by it."""
        super().__init__(charm, ACTION)
        self._charm = charm
        self._stored = stored
        self._host = host
        self.framework.observe(charm.on.preview_mappings_action, self._on_preview)

    def _on_preview(self, event: ops.ActionEvent) -> None:
        from vgpu import preview  # the plan's modules: this action only

        text = event.params.get("mappings")
        # The status evaluated after the action reads through the same Host: dry, it saves
        # no type names either.
        self._host.dry = True
        self._host.refresh()
        try:
            event.set_results(preview.preview(None if text is None else str(text),
                                              self._host, self._inputs()))
        except HostReadError as error:
            event.fail(f"no preview: {error}")
        finally:
            self._host.refresh()  # the status reads the option in force, not the previewed value

    def _inputs(self) -> reconcile.Inputs:
        """What a hook's steps get, with the StoredState read only (never the charm's own _inputs)."""
        charm = self._charm

        def attached(_fetch: bool):
            raise VgpuError("a preview never fetches the resource")

        def relations() -> List[reconcile.Published]:
            return [reconcile.Published(r.app.name if r.app else reconcile.PRINCIPAL,
                                        r.data[charm.unit])
                    for r in charm.model.relations[RELATION]]

        return reconcile.Inputs(
            options=charm.config, checked=lambda: mappings.check_text(None),
            attached=attached, relations=relations, unit=charm.unit.name,
            paused=bool(self._stored.paused), reported=bool(self._stored.reported))
