# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The enable-mig action, wired to its event, and what it left stopped for the status.

MIG mode itself is :mod:`vgpu.mig` (nvidia-smi) and the neighbours' NVML
clients stopped around it :mod:`vgpu.gpuclients` (plain modules); this helper
checks the GPU and its guests, takes the host lock, remembers in the charm's
StoredState (``clients_left``) the clients it stopped and could not start
again, and sends nova-compute what now applies through the charm's publish
step. ``src/charm.py`` creates one :class:`MigMode` and adds
:meth:`MigMode.left_stopped` to the unit's status.
"""

from __future__ import annotations

import logging
from typing import Callable, List

import ops

from vgpu import hostlock, mappings, reconcile
from vgpu.errors import HostReadError, VgpuError

logger = logging.getLogger(__name__)


class MigMode(ops.Object):
    """enable-mig, and the neighbours' NVML clients it could not start again.

    ``host``: the charm's reading of the host for this dispatch; ``stored``:
    its StoredState (``clients_left``); ``publish``: the charm's publish step
    (raises HostReadError).
    """

    def __init__(self, charm: ops.CharmBase, host: reconcile.Host, stored: ops.BoundStoredState, *,
                 publish: Callable[[], None]):
        """Observe the action."""
        super().__init__(charm, "enable-mig")
        self._host = host
        self._stored = stored
        self._publish = publish
        self.framework.observe(charm.on.enable_mig_action, self._on_enable_mig)

    def left_stopped(self) -> List[str]:
        """The status lines for clients enable-mig left stopped that are still not running.

        Those systemd says run again are forgotten; where it cannot say, they are named.
        """
        names = list(self._stored.clients_left)
        if not names:
            return []
        from vgpu import gpuclients  # only when some were left stopped: not every update-status

        try:
            running = set(gpuclients.active(names))
        except (VgpuError, ValueError):
            running = set()
        left = [n for n in names if n not in running]
        if left != names:
            self._stored.clients_left = left
        return [f"enable-mig stopped {n} and it did not start again: sudo systemctl start {n}"
                for n in left]

    def _on_enable_mig(self, event: ops.ActionEvent) -> None:
        """Turn MIG mode on for one GPU with nvidia-smi; refused while a guest holds its vGPUs."""
        from vgpu import gpuclients, guests, mig
        from vgpu.errors import MigError

        try:
            address = mappings.normalise_address(str(event.params.get("gpu") or ""))
            gpu = self._host.facts().pci.gpu(address)
            if gpu is None or gpu.address != address:
                raise MigError(f"{address} is not an NVIDIA GPU on this host (GPUs: "
                               f"{', '.join(g.address for g in self._host.facts().pci.gpus) or 'none'})")
            # A guest holding a vGPU there (running or shut off) stops it; a shut-off one whose
            # VF lost its type at a reboot does not: MIG mode is what its type needs again.
            event.log(f"checking that no guest holds a vGPU on GPU {address}")
            unit = self.model.unit.name  # names the juju run that lists guests not named
            guests.ensure_no_guests([gpu.address, *(vf.address for vf in gpu.vfs)], unit=unit)
            guests.ensure_no_guests([gpu.address, *(vf.address for vf in gpu.vfs
                                                    if vf.current_type)], defined=True, unit=unit)
            before = mig.modes([address])[address]
            done, clients = None, gpuclients.Stopped()
            if not before.enabled:
                event.log(f"turning MIG mode on: {mig.enable_command(address)}")
                with hostlock.held(hostlock.HOOK_WAIT):  # not while the boot step restores
                    done, clients = gpuclients.around(
                        lambda: mig.enable(address), address,
                        bool(event.params.get(gpuclients.STOP_PARAM)))
        except gpuclients.ModeChangeError as error:  # what it stopped is said, whatever happened
            self._remember(error.clients)
            event.set_results({"gpu-clients": error.clients.said()})
            left = "".join(f"; {name} was stopped and NOT started again"
                           for name in error.clients.not_started)
            event.fail(f"MIG mode not enabled: {error}{left}")
            return
        except (ValueError, VgpuError) as error:
            event.fail(f"MIG mode not enabled: {error}")
            return
        except OSError as error:  # the lock file (a link on the way)
            event.fail(f"MIG mode not enabled: cannot take the host lock /{hostlock.FILE}: "
                       f"{error.strerror or error}")
            return
        self._remember(clients)
        event.set_results({**mig.enable_results(address, done), "gpu-clients": clients.said()})
        event.log("publishing to nova-compute: a mapping that waited for MIG mode applies now")
        self._host.refresh()
        try:
            self._publish()  # a mapping that waited for MIG mode applies now
        except HostReadError as error:
            logger.error("%s", error)

    def _remember(self, clients) -> None:
        """Remember the neighbours' clients enable-mig stopped and could not start again."""
        if clients.not_started:
            self._stored.clients_left = sorted({*self._stored.clients_left,
                                                *clients.not_started})
