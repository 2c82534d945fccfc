# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The charm's monitoring, wired to its events: the metrics exporter and the cos-agent relation.

The exporter's unit is :mod:`vgpu.exporter` (a plain module); this helper
only decides, per hook, what of it runs: the unit kept while ``cos-agent`` is
related and removed when it goes (config-changed, upgrade-charm, which
restarts it on the new code, and the relation's own hooks), and the cos_agent
charm library's provider, which gives the collector the scrape job, the alert
rules and the dashboard. ``src/charm.py`` creates one :class:`Monitoring`
and asks it for its status (:meth:`Monitoring.problem`) and on remove.

The library (pydantic, cosl: about a quarter of a second) is not imported on
a hook that does not need it. The exporter adds to update-status only the
status's look at whether the operator masked its unit (two ``readlink`` calls,
:meth:`Monitoring.notes`).
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional

import ops

COS_AGENT = "cos-agent"  # the endpoint to the collector (opentelemetry-collector)
DASHBOARDS = "./src/grafana_dashboards"  # relative to the charm's directory, where Juju runs hooks
REFRESHED_BY = ("hooks/config-changed", "hooks/upgrade-charm")  # new rules, dashboards or port


def wants_library(dispatch_path: str, related: Callable[[], bool]) -> bool:
    """Whether the hook ``dispatch_path`` (``JUJU_DISPATCH_PATH``) has work for the library.

    cos-agent's own relation hooks, and config-changed and upgrade-charm while
    ``related()`` (asked only then: it runs a hook tool).
    """
    return dispatch_path.startswith(f"hooks/{COS_AGENT}-relation-") or (
        dispatch_path in REFRESHED_BY and related())


class Monitoring(ops.Object):
    """The exporter while cos-agent is related, and what the collector is given over it.

    ``stored``: the charm's StoredState, whose ``exporter`` ({"problem": why}
    or {}) says why the exporter was last refused, for the status and for the
    next hook to set the unit up again.
    """

    def __init__(self, charm: ops.CharmBase, stored: ops.BoundStoredState):
        """Observe the hooks that change the exporter; make the library's provider where needed."""
        super().__init__(charm, COS_AGENT)
        self._stored = stored
        on = charm.on
        for event in (on.config_changed, on.upgrade_charm, on[COS_AGENT].relation_joined,
                      on[COS_AGENT].relation_changed, on[COS_AGENT].relation_broken):
            self.framework.observe(event, self._on_exporter)
        self.provider = self._provider(charm)

    def problem(self) -> str:
        """Why the exporter was last refused ("" when it was not): a blocked status."""
        return self._stored.exporter.get("problem", "")

    def notes(self) -> tuple:
        """What the active status adds: the operator masked the exporter (persistent or runtime).

        Only while cos-agent is related: without it no metrics are asked for, and
        the exporter's module is not loaded.
        """
        if not self.model.relations[COS_AGENT]:
            return ()
        from vgpu import exporter

        return (exporter.MASKED,) if exporter.masked() else ()

    def remove(self) -> None:
        """Remove the exporter (charm removal); a problem is logged."""
        from vgpu import exporter

        exporter.sync(related=False)

    def _provider(self, charm: ops.CharmBase) -> Optional[object]:
        """The cos_agent library's provider, on the hooks where it has work; else None."""
        if not wants_library(os.environ.get("JUJU_DISPATCH_PATH", ""),
                             lambda: bool(self.model.relations[COS_AGENT])):
            return None
        from charms.grafana_agent.v0.cos_agent import COSAgentProvider

        # Rules in the library's default src/prometheus_alert_rules. Its src/loki_alert_rules
        # is left absent: a Loki rule over the kernel log never fires (cosl's Rules inject this
        # charm's juju_application; the collector labels /var/log with its own): Xid errors
        # are the exporter's metrics (vgpu.xid).
        return COSAgentProvider(
            charm, relation_name=COS_AGENT, scrape_configs=self._scrape_configs,
            dashboard_dirs=[DASHBOARDS], refresh_events=[charm.on.config_changed,
                                                         charm.on.upgrade_charm])

    @staticmethod
    def _scrape_configs() -> List[dict]:
        import socket

        from vgpu import exporter

        return exporter.scrape_configs(socket.getfqdn())

    def _on_exporter(self, event: ops.EventBase) -> None:
        """The exporter runs while cos-agent is related (vgpu.exporter); else it is removed."""
        from vgpu import exporter

        related = (not isinstance(event, ops.RelationBrokenEvent)
                   and bool(self.model.relations[COS_AGENT]))
        failed = bool(self.problem())  # systemctl's part is done again
        problem = exporter.sync(related, self.model.config.get(exporter.OPTION),
                                restart=isinstance(event, ops.UpgradeCharmEvent) or failed,
                                tenants=self.model.config.get(exporter.TENANTS_OPTION))
        if self.problem() != problem:
            self._stored.exporter = {"problem": problem} if problem else {}
