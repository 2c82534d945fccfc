"""NVML clients that hold a GPU while its MIG mode changes: the charm's own, and its neighbours'.

NVIDIA's MIG-backed vGPU guide lists as a prerequisite that no other process
(CUDA, monitoring, another nvidia-smi) uses the GPU when MIG mode changes; a
client that holds it leaves ``-mig 1`` pending (MIG user guide, "Enable MIG
Mode"). Whether that still holds on Hopper and Blackwell, where the mode needs
no GPU reset (NVIDIA/gpu-operator issue 2600, PR 2603), is not settled: the
charm acts so that it is right either way, by having no client hold the GPU.

* The charm's own exporter (:data:`OURS`) keeps an NVML session for its whole
  life. Its unit starts ``After=nvidia-vgpu-vfs.service`` (the boot unit), and
  the charm stops it around a MIG mode change it makes and starts it again
  after (:func:`ours_stopped`), without asking: it is the charm's.
* Neighbours' clients (:data:`NEIGHBOURS`): NVIDIA's mig-parted stops
  ``nvsm.service``, ``nvidia-dcgm.service`` and ``dcgm-exporter.service``
  before a mode change and starts them after (``deployments/systemd/hooks.sh``);
  hardware-observer's ``dcgm`` snap runs ``snap.dcgm.nv-hostengine.service`` and
  ``snap.dcgm.dcgm-exporter.service``. At boot the boot unit is ordered
  ``Before=`` all of them. On demand they are never stopped unasked
  (hardware-observer's hooks fail while its exporter is down, and snapd may
  restart a snap's services at any time): the ``enable-mig`` action names those
  active and refuses, unless run with ``stop-gpu-clients=true``; then
  :func:`stopped` stops them, and starts them again whatever happened.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple, TypeVar

from . import services
from .errors import MigError, ServiceError, VgpuError

log = logging.getLogger(__name__)
T = TypeVar("T")

OURS = "nvidia-vgpu-exporter.service"  # vgpu.exporter.UNIT
NEIGHBOURS = ("snap.dcgm.nv-hostengine.service", "snap.dcgm.dcgm-exporter.service",
              "nvidia-dcgm.service", "dcgm-exporter.service", "nvsm.service")
STOP_PARAM = "stop-gpu-clients"  # the enable-mig action's parameter


def active(names: Iterable[str] = NEIGHBOURS) -> List[str]:
    """The units of ``names`` systemd says are active now; ServiceError when it cannot say."""
    return [name for name, state in services.states(names).items()
            if state in ("active", "reloading", "activating")]


def advice(gpu: str, clients: Iterable[str], unit: str = "") -> str:
    """What a hook's status says when NVML clients hold a GPU whose MIG mode must change."""
    run = f"juju run {unit} enable-mig" if unit else "run the enable-mig action with"
    return (f"NVML clients hold GPU {gpu} while its MIG mode must change: "
            f"{', '.join(clients)}; {run} gpu={gpu} {STOP_PARAM}=true stops them, turns MIG "
            "mode on and starts them again")


class Stopped:
    """What :func:`stopped` did: the units it stopped, and those it could not start again."""

    def __init__(self) -> None:
        """Nothing stopped yet."""
        self.stopped: List[str] = []
        self.not_started: Dict[str, str] = {}

    def said(self) -> str:
        """One line for an action's result."""
        if not self.stopped:
            return "none stopped"
        out = f"stopped {', '.join(self.stopped)} around the change"
        started = [n for n in self.stopped if n not in self.not_started]
        if started:
            out += f"; started again: {', '.join(started)}"
        if self.not_started:
            out += "; NOT started again: " + "; ".join(
                f"{n} ({why})" for n, why in self.not_started.items())
        return out


@contextlib.contextmanager
def stopped(names: Iterable[str], wait: bool = True,
            done: Optional[Stopped] = None) -> Iterator[Stopped]:
    """Stop each unit of ``names`` for the block; start each again afterwards, whatever happened.

    A stop that fails raises ServiceError after those already stopped are
    started again. ``wait`` False starts them with ``--no-block`` (the boot
    step: a unit ordered after it would wait for it). ``done``: the record to fill (the
    caller keeps it when the block raises).
    """
    done = Stopped() if done is None else done
    try:
        for name in names:
            services.stop(name)
            done.stopped.append(name)
        yield done
    finally:
        for name in reversed(done.stopped):
            try:
                services.start(name, wait=wait)
            except ServiceError as error:
                log.error("could not start %s again: %s", name, error)
                done.not_started[name] = str(error)


@contextlib.contextmanager
def ours_stopped(wait: bool = True) -> Iterator[None]:
    """The charm's exporter stopped for the block when it runs (it holds NVML), started after.

    Only when systemd says it is active: at boot its start waits for the boot
    unit (``After=``), and stopping it then would cancel that start. What
    systemctl cannot do is logged: the mode change is tried all the same.
    """
    try:
        running = services.states([OURS]).get(OURS) in ("active", "reloading")
    except ServiceError as error:
        log.warning("cannot ask systemd about %s: %s", OURS, error)
        running = False
    if running:
        log.info("stopping %s while MIG mode changes (it holds the GPUs through NVML)", OURS)
        try:
            services.stop(OURS)
        except ServiceError as error:  # the change is tried regardless
            log.warning("%s", error)
            running = False
    try:
        yield
    finally:
        if running:
            try:
                services.start(OURS, wait=wait)
            except ServiceError as error:
                log.error("could not start %s again: %s", OURS, error)


def around(change: Callable[[], T], gpu: str, stop_neighbours: bool) -> Tuple[T, Stopped]:
    """``change()`` (a MIG mode change on ``gpu``) with no known NVML client holding the GPU.

    The charm's exporter is stopped and started again without asking. The
    neighbours' clients that are active are named and the change refused
    (MigError) unless ``stop_neighbours``: then they are stopped, the change made,
    and they are started again whatever happened in between (see :class:`Stopped`).
    """
    try:
        clients = active()
    except (ServiceError, ValueError) as error:  # what cannot be told counts as held
        raise MigError(f"cannot tell which NVML clients run ({error}); nothing changed") from None
    if clients and not stop_neighbours:
        raise MigError(f"NVML clients that hold GPU {gpu} are active: {', '.join(clients)}; a "
                       "MIG mode change needs none holding it (NVIDIA's MIG-backed vGPU guide), "
                       f"and the charm never stops a neighbour's service unasked: run again with "
                       f"{STOP_PARAM}=true to stop them, change the mode and start them again")
    done = Stopped()
    try:
        with ours_stopped(), stopped(clients, done=done):
            result = change()
    except VgpuError as error:  # the record goes with the failure: what was left stopped
        raise ModeChangeError(str(error), done) from error
    return result, done


class ModeChangeError(MigError):
    """The mode change failed; ``clients`` says which clients were stopped and started again."""

    def __init__(self, message: str, clients: Stopped) -> None:
        """The mode change's failure, and the record of the clients around it."""
        super().__init__(message)
        self.clients = clients
