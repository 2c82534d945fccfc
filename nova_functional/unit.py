"""The charm driven as the unit tests drive it, and the nova.conf nova-compute renders from it.

A :class:`Unit` is one host root (``VGPU_HOST_ROOT``) built by a fixture of
``unit_tests/fakehost.py``, the stand-in host tools of ``unit_tests/faketools.py``
on PATH, the vGPU host driver installed by the charm's own code, and the real
charm under ``ops.testing``. nova-compute's side is charmhelpers' own
``SubordinateConfigContext`` reading the relation data (``unit_tests/principal.py``)
and charm-nova-compute's nova.conf template (``fakehost.render_principal_nova_conf``).
"""

import json
from pathlib import Path
from typing import Optional, Sequence

from nova import version as nova_version
from ops import testing

from charm import NovaComputeNvidiaVgpuCharm
from unit_tests import debs, principal
from unit_tests.fakehost import FakeHost
from unit_tests.faketools import Tools
from vgpu import driver

APP = "nova-compute"
RESOURCE = "nvidia-vgpu-software"
NOVA_VERSION = nova_version.version_string()


class Unit:
    """The charm on one fixture host; the caller sets the environment (:meth:`environ`)."""

    def __init__(self, base: Path):  # noqa: D107
        self.base = Path(base)
        self.root = self.base / "host"
        self.root.mkdir(parents=True)
        self.tools = Tools(self.base / "tools")
        (self.base / "debs").mkdir()
        self.ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
        self.state: Optional[testing.State] = None
        self.deb: Optional[Path] = None

    def environ(self) -> dict:
        return {"VGPU_HOST_ROOT": str(self.root), **self.tools.environ()}

    def ready(self, host: FakeHost) -> FakeHost:
        """The driver installed (real dpkg, the charm's install code), its daemons up."""
        # The host's Nova is the harness's: the charm picks Nova's options by nova-common's
        # version (written first: dpkg's status file is rewritten whole).
        host.nova(f"3:{NOVA_VERSION}-0ubuntu1")
        self.deb = debs.host_driver(self.base / "debs")
        driver.install(driver.inspect_deb(self.deb))
        host.loaded_driver(debs.OLD)  # the package's version: no reboot pending
        host.install_sriov_manage()
        self.tools.set_active("nvidia-vgpu-mgr")
        self.tools.set_active("nvidia-vgpud")
        return host

    def configure(self, **config) -> testing.State:
        """A config-changed hook with these options (names with _ for -), after the last hook."""
        options = {key.replace("_", "-"): value for key, value in config.items()}
        if self.state is None:
            state = testing.State(
                config=options,
                relations=[testing.SubordinateRelation("nova-vgpu", remote_app_name=APP)],
                resources={testing.Resource(name=RESOURCE, path=self.deb)})
        else:
            state = testing.State(config={**self.state.config, **options},
                                  relations=self.state.relations, resources=self.state.resources,
                                  stored_states=self.state.stored_states)
        self.state = self.ctx.run(self.ctx.on.config_changed(), state)
        return self.state

    def new_relation(self) -> testing.State:
        """The nova-vgpu relation removed and made again (juju remove-relation, integrate).

        The new relation's data starts empty; its relation-joined hook runs with the
        unit's stored state as the last hook left it.
        """
        assert self.state is not None
        relation = testing.SubordinateRelation("nova-vgpu", remote_app_name=APP)
        state = testing.State(config=dict(self.state.config), relations=[relation],
                              resources=self.state.resources, stored_states=self.state.stored_states)
        self.state = self.ctx.run(self.ctx.on.relation_joined(relation), state)
        return self.state

    def status(self):
        assert self.state is not None
        return self.state.unit_status

    def published(self) -> dict:
        """This unit's data in the nova-vgpu relation, without Juju's own keys."""
        assert self.state is not None
        data = self.state.get_relations("nova-vgpu")[0].local_unit_data
        return {k: v for k, v in data.items() if not k.startswith(("egress", "ingress", "private"))}

    def sections(self) -> dict:
        """The sections nova-compute's template context gets from this unit (charmhelpers)."""
        return principal.nova_context(self.published()).get("sections", {})

    def action(self, name: str) -> dict:
        assert self.state is not None
        self.ctx.run(self.ctx.on.action(name), self.state)
        return dict(self.ctx.action_results or {})

    def render_nova_conf(self, whitelist: Optional[str] = None, aliases: Sequence[str] = ()) -> Path:
        """nova-compute's /etc/nova/nova.conf on this host, rendered with this unit's sections.

        charm-nova-compute's template with its ``pci-passthrough-whitelist`` and
        ``pci-alias`` where it puts them, and the subordinate's sections as
        charmhelpers hands them to the template.
        """
        subordinate = principal.render_nova_conf(principal.nova_context(self.published()))
        return self.host().principal_nova_conf(whitelist, aliases, subordinate)

    def host(self) -> FakeHost:
        """The fixture host under this unit's root."""
        return FakeHost(self.root, write_defaults=False)


def alias_of(results: dict, profile: str) -> str:
    """The ``[pci] alias`` list-vgpu-types prints for a profile (by name or type id)."""
    for gpu in results["gpus"].values():
        for type_id, entry in gpu["types"].items():
            if profile in (type_id, entry["name"]) or entry["name"].endswith(" " + profile):
                if "pci-alias" in entry:
                    return entry["pci-alias"]
    raise KeyError(f"list-vgpu-types gives no pci-alias for {profile}: {json.dumps(results)[:2000]}")


def flavor_property(results: dict, address: str, profile: str) -> str:
    """The flavor property list-vgpu-types prints for a type on one GPU."""
    for gpu in results["gpus"].values():
        if gpu["address"] == address:
            for type_id, entry in gpu["types"].items():
                if profile in (type_id, entry["name"]) or entry["name"].endswith(" " + profile):
                    return entry["flavor-property"]
    raise KeyError(f"list-vgpu-types lists no {profile} on {address}")



