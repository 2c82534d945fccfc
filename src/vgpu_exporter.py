#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Entry point of nvidia-vgpu-exporter.service: ``vgpu_exporter.py --port <port>`` (see vgpu.exporter).

Serves the metrics of :mod:`vgpu.metrics` in Prometheus' text format on
``http://127.0.0.1:<port>/metrics`` (127.0.0.1 only: the collector on the
same machine scrapes it), through :mod:`vgpu.serve` (connections bounded,
idle ones timed out), with prometheus-client from the charm's own venv (the
unit puts it on ``PYTHONPATH``), until SIGTERM. Each scrape reads the host
afresh; one NVML session lives as long as the process, read by one scrape at
a time: a scrape that cannot have it within :data:`NVML_WAIT` seconds says
the source down and answers with the rest, so a read that hangs never holds
later scrapes. ``--tenant-identities`` (the charm's
``exporter-tenant-identities``) adds the ``*_tenant_info`` series to the
answers of root's connections only (the collector runs as root); every other
user gets the same scrape without them. One :class:`vgpu.xid.Watch` lives as
long as the process too, fed from the journal (the kernel's Xid lines) by a
thread of its own: a scrape takes what it last read and never waits on
journalctl. Run as a script, its own directory
(the charm's ``src/``) comes first on ``sys.path``.
"""

import argparse
import logging
import signal
import sys
import threading

ADDRESS = "127.0.0.1"
NVML_WAIT = 5.0  # seconds a scrape waits for the NVML session another scrape reads
TEXT = "text/plain; version=0.0.4; charset=utf-8"


class SharedSession:
    """An NVML session read by one scrape at a time; a scrape that waits too long gets none."""

    def __init__(self, session, wait: float = NVML_WAIT) -> None:
        """``session``: a :class:`vgpu.nvml.Session` (or a stand-in with ``read``)."""
        self._session = session
        self._wait = wait
        self._lock = threading.Lock()

    def read(self, *args):
        """The session's reading; RuntimeError (a source down) when another scrape holds it."""
        if not self._lock.acquire(timeout=self._wait):
            raise RuntimeError(f"another scrape has read NVML for more than {self._wait:g} s")
        try:
            return self._session.read(*args)
        finally:
            self._lock.release()


def registry(session=None, tenants: bool = False, watch=None):
    """A registry holding the vGPU collector (and the process' own metrics: memory, CPU).

    ``session``: read by the scrapes of every registry made with it (a
    :class:`SharedSession`, or a plain session for one scrape at a time).
    ``tenants``: the collector adds the ``*_tenant_info`` series.
    ``watch``: the process' :class:`vgpu.xid.Watch` (None: no Xid series).
    """
    from prometheus_client import CollectorRegistry, ProcessCollector
    from prometheus_client.core import GaugeMetricFamily

    from vgpu import metrics

    class VgpuCollector:
        """One reading of the host per scrape; nothing held between scrapes."""

        def collect(self):
            samples = metrics.collect(session, xid_watch=watch, tenants=tenants)
            for name, group in metrics.families(samples).items():
                if name.endswith("_tenant_info") and not tenants:
                    continue  # not even named to whoever may not have them
                metric = metrics.BY_NAME[name]
                family = GaugeMetricFamily(name, metric.help, labels=list(metric.labels))
                for sample in group:
                    family.add_metric(list(sample.labels), sample.value)
                yield family

    out = CollectorRegistry(auto_describe=False)
    out.register(VgpuCollector())
    ProcessCollector(registry=out)
    return out


def answerer(session, tenant_identities: bool, watch=None):
    """What the server answers: /metrics, with tenant series only for root where opted in."""
    from prometheus_client import generate_latest

    def answer(uid, path):
        if path.split("?", 1)[0] not in ("/metrics", "/"):
            return "404 Not Found", "text/plain", b"/metrics\n"
        tenants = tenant_identities and uid == 0
        return "200 OK", TEXT, generate_latest(registry(session, tenants=tenants, watch=watch))

    return answer


def main(argv) -> int:
    """Serve until SIGTERM or SIGINT; 2 when the port cannot be taken."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenant-identities", action="store_true",
                        help="serve instance and project identities to root's scrapes")
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from vgpu import nvml, serve, xid

    session = nvml.Session()
    watch = xid.Watch(known=xid.host_gpus)
    try:
        server = serve.Server(ADDRESS, args.port,
                              answerer(SharedSession(session), args.tenant_identities, watch),
                              identify=args.tenant_identities)
    except OSError as error:
        logging.error("cannot listen on %s:%d: %s", ADDRESS, args.port, error.strerror or error)
        return 2
    stop = threading.Event()
    threading.Thread(target=watch.run, args=(stop,), name="journal", daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    started = logging.getLogger("vgpu_exporter")
    started.setLevel(logging.INFO)  # a normal start is news, not a warning
    started.info("serving http://%s:%d/metrics", ADDRESS, args.port)
    server.serve()
    stop.set()
    watch.close()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
