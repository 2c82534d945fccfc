"""vgpu.serve: the exporter's HTTP server, on 127.0.0.1 and a free port, in this process.

No test times anything: each waits for an event (an answer, a closed connection) with a
generous bound that only a defect reaches. The exporter as its own process, with more idle
connections than its unit's tasks: test_exporter.py.
"""

import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from vgpu import serve


@pytest.fixture
def server():
    """A server answering ``uid path`` for each request; stopped after the test."""
    started = []

    def answer(uid, path):
        return "200 OK", "text/plain", f"{uid} {path}\n".encode()

    def make(**kwargs):
        made = serve.Server("127.0.0.1", 0, kwargs.pop("answer", answer), **kwargs)
        thread = threading.Thread(target=made.serve, daemon=True)
        thread.start()
        started.append((made, thread))
        return made

    yield make
    for made, thread in started:
        made.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def get(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return answer.status, answer.read().decode()


def closed_by_server(connection):
    """Whether the server closed ``connection`` (it reads end of file; waits up to 30 s)."""
    connection.settimeout(30)
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_request_is_answered_with_who_asked_where_asked_to_look(server):
    made = server(identify=True)
    assert get(made.port, "/metrics?x=1") == (200, f"{os.getuid()} /metrics?x=1\n")
    assert get(server().port) == (200, "None /metrics\n")  # no need: the kernel's table unread


def test_the_peer_is_found_in_the_kernels_socket_table_as_its_owner():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with client, accepted:
            assert serve.peer_uid(accepted) == os.getuid()


def test_a_peer_not_in_the_table_is_unknown(monkeypatch):
    monkeypatch.setattr(serve, "PROC_NET", ())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with client, accepted:
            assert serve.peer_uid(accepted) is None


def test_past_the_cap_the_longest_waiting_connection_is_closed_and_the_new_one_answered(server):
    made = server(connections=4)
    idle = [socket.create_connection(("127.0.0.1", made.port)) for _ in range(4)]
    try:
        assert get(made.port)[0] == 200  # the fifth: the first idle one made room
        assert closed_by_server(idle[0])
    finally:
        for connection in idle:
            connection.close()


def test_a_connection_that_sends_no_whole_request_is_closed(server):
    made = server(idle=0.2)
    with socket.create_connection(("127.0.0.1", made.port)) as connection:
        connection.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the blank line
        assert closed_by_server(connection)


def test_requests_past_the_workers_are_told_to_come_back(server):
    release = threading.Event()
    entered = threading.Event()

    def slow(uid, path):
        entered.set()
        release.wait(30)
        return "200 OK", "text/plain", b"done\n"

    made = server(workers=1, answer=slow)
    first = threading.Thread(target=get, args=(made.port,))
    first.start()
    try:
        assert entered.wait(30)
        with pytest.raises(urllib.error.HTTPError) as error:
            get(made.port)
        assert error.value.code == 503
    finally:
        release.set()
        first.join(timeout=30)


def test_only_get_is_answered(server):
    made = server()
    request = urllib.request.Request(f"http://127.0.0.1:{made.port}/metrics", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=30)
    assert error.value.code == 405


def test_an_answer_that_fails_is_a_500_and_the_server_goes_on(server):
    calls = []

    def failing(uid, path):
        calls.append(path)
        if len(calls) == 1:
            raise RuntimeError("an unforeseen fault")
        return "200 OK", "text/plain", b"fine\n"

    made = server(answer=failing)
    with pytest.raises(urllib.error.HTTPError) as error:
        get(made.port)
    assert error.value.code == 500
    assert get(made.port) == (200, "fine\n")


def test_a_head_request_gets_the_head_alone(server):
    made = server()
    request = urllib.request.Request(f"http://127.0.0.1:{made.port}/metrics", method="HEAD")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200 and answer.headers["Content-Type"] == "text/plain"
        assert answer.headers["Content-Length"] == "0"


def test_a_500_says_failed_as_plain_text_and_logs_the_path(server, caplog):
    def failing(uid, path):
        raise RuntimeError("an unforeseen fault")

    made = server(answer=failing)
    with pytest.raises(urllib.error.HTTPError) as error:
        get(made.port, "/metrics?name=x")
    assert error.value.headers["Content-Type"] == "text/plain" and error.value.read() == b"failed\n"
    assert "answering /metrics?name=x" in [r.getMessage() for r in caplog.records
                                            if r.name == "vgpu.serve"]


@pytest.mark.parametrize("family, host", [
    (socket.AF_INET, "127.0.0.200"),  # the last byte's high bit: the kernel's hex is unsigned
    (socket.AF_INET6, "::1"),  # /proc/net/tcp6: four words in host byte order
])
def test_the_peer_is_found_over_any_local_address(family, host):
    try:
        listener = socket.create_server((host, 0), family=family)
    except OSError:  # pragma: no cover - a machine without IPv6 on loopback
        pytest.skip(f"cannot listen on {host}")
    with listener:
        client = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        with client, accepted:
            assert serve.peer_uid(accepted) == os.getuid()


def test_a_head_longer_than_its_bound_is_closed_unanswered(server):
    made = server()
    with socket.create_connection(("127.0.0.1", made.port)) as connection:
        connection.sendall(b"GET /" + b"x" * serve.HEAD)  # no end of head, past the bound
        assert closed_by_server(connection)


def test_stopping_closes_the_connections_still_waiting_and_serve_returns(server):
    made = serve.Server("127.0.0.1", 0, lambda uid, path: ("200 OK", "text/plain", b""))
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", made.port)) as connection:
        connection.sendall(b"GET /metrics HTTP/1.0\r\n")  # a head not yet whole: pending
        time.sleep(0.2)  # accepted and read by the server
        made.stop()
        thread.join(timeout=30)
        assert not thread.is_alive() and closed_by_server(connection)
