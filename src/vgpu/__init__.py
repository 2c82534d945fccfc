"""Host side of the nova-compute-nvidia-vgpu charm.

Nothing in this package imports ``ops``: each module reads or changes the host
under one root (see :mod:`vgpu.hostroot`) and returns plain data, so the charm
stays thin and every module can be tested on a fixture tree.
"""

# Defined once; status messages, the attach hint and the files the charm writes use them.
APP = "nova-compute-nvidia-vgpu"
RESOURCE = "nvidia-vgpu-software"
OPTION = "vgpu-device-mappings"  # the charm option that maps vGPU types to GPUs
PCI_IN_PLACEMENT = "pci-in-placement"  # VFIO VFs reported to Placement ([pci] report_in_placement)
LIVE_MIGRATION = "vfio-live-migration"  # VFIO device specs and aliases live_migratable
RELATION = "nova-vgpu"  # the endpoint to nova-compute
ONE_TIME_USE = "passthrough-one-time-use"  # whole GPUs' device specs one_time_use (Nova 32+)

# Patterns several modules check (the boot step's parsers load without vgpu.pci): plain
# strings, compiled by re where they are used.
PCI_ADDRESS = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"  # a PCI function, as sysfs names it
MDEV_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # an mdev, lower case
