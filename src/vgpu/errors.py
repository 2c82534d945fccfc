"""Domain errors. The charm maps each one to a unit status or an action failure."""


class VgpuError(Exception):
    """Base of every error the host modules raise on purpose."""


class HostReadError(VgpuError):
    """A host path exists but cannot be read (permissions, a loop, a directory for a file)."""


class CommandError(VgpuError):
    """A host command could not run, ran out of time or failed. ``str()`` says why, cause first."""

    def __init__(self, message: str, cause: str, returncode=None, stderr: str = ""):
        """Keep the cause (one line), the exit status and stderr beside the message."""
        super().__init__(message)
        self.cause = cause  # the reason alone, without the command's name when it failed
        self.returncode = returncode
        self.stderr = stderr


class UnsupportedReleaseError(VgpuError):
    """The installed Nova is too old, or its version cannot be read."""


class ResourceMissingError(VgpuError):
    """The nvidia-vgpu-software resource is not attached, or is empty."""


class ResourceInvalidError(VgpuError):
    """The attached file is not NVIDIA's vGPU host driver for this machine."""


class InstallError(VgpuError):
    """dpkg or apt failed to install the host driver."""


class ServiceError(VgpuError):
    """systemctl failed to stop or start a vGPU service."""


class GuestsRunningError(VgpuError):
    """Guests (running, or shut off with their devices kept) hold vGPUs that must not change."""

    def __init__(self, guests, unit: str = ""):
        """Name the guests (see :func:`guests_named`) in the message; ``guests`` keeps every one.

        ``unit``: this unit's name, for the ``juju run`` that lists those not named.
        """
        self.guests = list(guests)
        running = all(g.state == "running" and not g.problem for g in self.guests)
        head = "running guest(s) use vGPUs" if running else "guest(s) hold vGPUs, running or shut off"
        super().__init__(f"{len(self.guests)} {head}: {guests_named(self.guests, unit)}")


# A refusal becomes the unit's status: one line of `juju status`' table, where three guests
# (each ``instance-0000002a (vm-1, <36-character uuid>, shut off)``, 70 characters or more)
# already take a few lines of a terminal. The rest are counted, and where to list them said.
NAMED = 3


def guests_named(guests, unit: str = "") -> str:
    """``a (...), b (...), c (...)`` (``vgpu.guests.Guest.describe``): every guest, up to NAMED.

    Beyond that NAMED are named, files that cannot be read first (no action lists
    them), and the rest counted: ``... and 189 more (juju run gpu-a/0 vgpu-usage
    lists the vGPUs guests hold)``, files that cannot be read apart. Which guests
    hold vGPUs is not changed, only how many are named.
    """
    guests = list(guests)
    if len(guests) <= NAMED:
        return ", ".join(g.describe() for g in guests)
    order = sorted(range(len(guests)), key=lambda i: not guests[i].problem)  # stable
    named, left = order[:NAMED], [guests[i] for i in sorted(order[NAMED:])]
    files = sum(1 for g in left if g.problem)
    where = f"juju run {unit} vgpu-usage" if unit else "the vgpu-usage action"
    tail = []
    if len(left) > files:
        tail.append(f"{len(left) - files} more ({where} lists the vGPUs guests hold)")
    if files:
        tail.append(f"{files} more domain file(s) that cannot be read, counted as in use")
    return ", ".join(guests[i].describe() for i in named) + " and " + " and ".join(tail)


class SriovError(VgpuError):
    """Virtual functions could not be enabled, or the boot unit not installed."""


class VfTypeError(VgpuError):
    """A vGPU type could not be written to (or released from) a virtual function."""


class PrincipalConfigError(VgpuError):
    """The principal's nova.conf cannot be parsed (oslo.config, so nova-compute, would refuse it)."""


class UncheckedEntryError(VgpuError):
    """A principal's configuration entry is beyond what the charm evaluates (size, depth, time)."""


class MigError(VgpuError):
    """MIG mode could not be read or changed (nvidia-smi missing, failing or silent)."""


class HostBusyError(VgpuError):
    """Another process (the boot step) holds the host lock (:mod:`vgpu.hostlock`) past the wait."""


class MigInUseError(MigError):
    """GPU instances in the way hold vGPUs of these VFs: a hook changes none of them."""

    def __init__(self, message: str, vfs):
        """The message with the steps; ``vfs``: the VFs whose vGPUs are in the way."""
        super().__init__(message)
        self.vfs = tuple(vfs)


class ExporterError(VgpuError):
    """The metrics exporter's unit could not be written or started, or its port is refused."""
