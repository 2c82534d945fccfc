#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Entry point of nvidia-vgpu-exporter.service: ``vgpu_exporter.py --port <port>`` (see vgpu.exporter).

Serves the metrics of :mod:`vgpu.metrics` in Prometheus' text format on
``http://127.0.0.1:<port>/metrics`` (127.0.0.1 only: the collector on the
same machine scrapes it), with prometheus-client from the charm's own venv
(the unit puts it on ``PYTHONPATH``), until SIGTERM. Each scrape reads the
host afresh; one NVML session lives as long as the process. So does one
:class:`vgpu.xid.Watch`, which a thread of its own feeds from the journal
(the kernel's Xid lines): a scrape takes what it last read and never waits on
journalctl. Run as a script, its own directory (the charm's ``src/``) comes
first on ``sys.path``.
"""

import argparse
import logging
import signal
import sys
import threading

ADDRESS = "127.0.0.1"


def registry(session=None, watch=None):
    """A registry holding the vGPU collector (and the process' own metrics: memory, CPU)."""
    from prometheus_client import CollectorRegistry, ProcessCollector
    from prometheus_client.core import GaugeMetricFamily

    from vgpu import metrics

    class VgpuCollector:
        """One reading of the host per scrape; scrapes at once take turns (NVML's session)."""

        def __init__(self) -> None:
            self._lock = threading.Lock()

        def collect(self):
            with self._lock:
                samples = metrics.collect(session, xid_watch=watch)
            for name, group in metrics.families(samples).items():
                metric = metrics.BY_NAME[name]
                family = GaugeMetricFamily(name, metric.help, labels=list(metric.labels))
                for sample in group:
                    family.add_metric(list(sample.labels), sample.value)
                yield family

    out = CollectorRegistry(auto_describe=False)
    out.register(VgpuCollector())
    ProcessCollector(registry=out)
    return out


def main(argv) -> int:
    """Serve until SIGTERM or SIGINT; 2 when the port cannot be taken."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from prometheus_client import start_wsgi_server

    from vgpu import nvml, xid

    session = nvml.Session()
    watch = xid.Watch()
    try:
        server, _thread = start_wsgi_server(args.port, addr=ADDRESS,
                                            registry=registry(session, watch))
    except OSError as error:
        logging.error("cannot listen on %s:%d: %s", ADDRESS, args.port, error.strerror or error)
        return 2
    stop = threading.Event()
    threading.Thread(target=watch.run, args=(stop,), name="journal", daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logging.getLogger("vgpu").warning("serving http://%s:%d/metrics", ADDRESS, args.port)
    stop.wait()
    server.shutdown()
    watch.close()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
