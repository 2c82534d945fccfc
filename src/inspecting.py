# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The read-only actions list-vgpu-types and vgpu-usage, wired to their events.

What they say is :mod:`vgpu.report`, :mod:`vgpu.usage` and :mod:`vgpu.capacity`
(plain modules); this helper gathers their inputs from the dispatch's reading
of the host, the charm's options and this unit's nova-vgpu data, and sets the
results. Nothing is written: no StoredState, no relation data, no host lock.
``src/charm.py`` creates one :class:`Inspecting`.
"""

from __future__ import annotations

from typing import Callable, List, Mapping

import ops

from fleet import principal_app
from vgpu import (
    LIVE_MIGRATION,
    PCI_IN_PLACEMENT,
    RELATION,
    catalogue,
    mappings,
    novaconf,
    pci,
    reconcile,
    virt,
)
from vgpu.errors import HostReadError


def learnt(host: pci.Host) -> catalogue.Table:
    """The VFIO type names learnt while VFs were free; none read on a host without VFIO GPUs."""
    return catalogue.load() if any(g.framework == pci.VFIO for g in host.gpus) else {}


class Inspecting(ops.Object):
    """Answers list-vgpu-types and vgpu-usage from the host as this dispatch reads it.

    ``host``: the charm's reading of the host for this dispatch; ``checked``:
    the option's checked text (the charm's, recorded by fingerprint).
    """

    def __init__(self, charm: ops.CharmBase, host: reconcile.Host,
                 checked: Callable[[], mappings.Validation]):
        """Observe the two actions."""
        super().__init__(charm, "inspecting")
        self._charm = charm
        self._host = host
        self._checked = checked
        self.framework.observe(charm.on.list_vgpu_types_action, self._on_list_vgpu_types)
        self.framework.observe(charm.on.vgpu_usage_action, self._on_vgpu_usage)

    def _ours(self) -> List[Mapping[str, str]]:
        """This unit's data on each nova-vgpu relation."""
        return [r.data[self._charm.unit] for r in self.model.relations[RELATION]]

    def _on_list_vgpu_types(self, event: ops.ActionEvent) -> None:
        from vgpu import capacity, multivgpu, report, table

        try:
            here = self._host.facts()
            host = pci.with_available(here.pci)  # what each function can still create
            held = capacity.held()  # what guests hold: counted as the status and the exporter do
        except HostReadError as error:
            event.fail(str(error))
            return
        names = learnt(host)
        offered = catalogue.offered(host, here.loaded_driver_version, names)
        config = self._charm.config
        options = {"mdev_class": bool(config.get(reconcile.MDEV_CLASS)),
                   "pci_in_placement": bool(config.get(PCI_IN_PLACEMENT)),
                   "live_migration": bool(config.get(LIVE_MIGRATION))}
        mig_off = report.not_in_mig_mode(host, offered)  # MIG-backed types: none available there
        # What nova-compute has now: published types that share a resource class are flagged.
        published = next(map(novaconf.sections_from_relation, self._ours()[:1]), {})
        whole = catalogue.whole_gpus(host, names)  # counts time-sliced VFIO types on full GPUs
        live = virt.action_results(here, options["live_migration"], self._host.principal_conf,
                                   principal_app(self.model))
        # Several vGPUs per instance (NVML, nvidia-smi -q, Nova); GPUs given whole (passthrough).
        multi = multivgpu.read(host, offered, here.supported_release())
        given = self._checked().passthrough
        event.set_results(table.fit({
            "gpus": report.gpu_results(host, offered=offered, whole_gb=whole, held=held,
                                       published=published, multi=multi, whole=given, mig_off=mig_off,
                                       **options),
            "table": report.types_table(host, offered, whole_gb=whole, held=held,
                                        published=published, multi=multi, whole=given, mig_off=mig_off,
                                        **options),
            **live,
            **({"nvml": f"{multi.nvml}: NVIDIA's rules give each type's most per instance"}
               if multi.nvml else {}),
        }, depth=4, records="gpus", what="types"))

    def _on_vgpu_usage(self, event: ops.ActionEvent) -> None:
        from vgpu import usage  # XML parsing: actions only

        try:
            here = self._host.facts()
        except HostReadError as error:
            event.fail(str(error))
            return
        event.set_results(usage.results(usage.in_use(
            here.pci, learnt=learnt(here.pci), driver_version=here.loaded_driver_version)))
