"""Where the boot step's data lives, and its bounds: what the hooks need of it on every run.

:mod:`vgpu.bootdata` (its shape, the parser the boot step uses) takes these
from here; :mod:`vgpu.sriov` writes the file and renders the unit with them,
and imports the parser only when it has to read the file back.
"""

DATA_FILE = "var/lib/nova-compute-nvidia-vgpu/boot.json"  # beside catalogue.FILE
DATA_VERSION = 1
LIMIT = 1 << 20  # bytes: far more than 64 GPUs of 64 VFs each take
TOTAL = 600  # seconds for the whole boot step; the unit's TimeoutStartSec is a minute more
