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
