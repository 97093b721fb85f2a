"""The jupyter_vram server extension serves exactly bokeh's BokehJS scripts, cacheably, and a
kernel's GPU memory as NVML sees it (for the status bar while the kernel is busy).

Plain HTTP against the real server (no browser needed): the manifest, the scripts and their
cache headers, that nothing else (other files, path traversal) can be reached, and the kernel
route's answers.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import bokeh
import pytest
from tornado import httputil, web

from jupyter_vram import _server as server

from .lab import Lab

SCRIPTS = ["bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js"]


def raw_get(lab: Lab, path: str) -> int:
    """Status of a GET sent with the path exactly as given (no client-side normalisation);
    a redirect (jupyter_server strips trailing slashes) is followed once."""
    host, port = lab.url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        location = response.getheader("Location")
        response.read()
        if response.status in (301, 302) and location and location.startswith("/"):
            conn.request("GET", location)
            response = conn.getresponse()
        return response.status
    finally:
        conn.close()


def test_entry_points_name_the_server_module() -> None:
    import jupyter_vram

    assert jupyter_vram._jupyter_server_extension_points() == [{"module": "jupyter_vram._server"}]
    assert server._jupyter_server_extension_points() == [{"module": "jupyter_vram._server"}]


def test_install_put_both_extensions_into_the_environment() -> None:
    """`pip install (-e) .` installed the prebuilt lab extension and the server config."""
    from jupyter_core.paths import jupyter_config_path, jupyter_path

    lab = [Path(d) / "jupyter-vram" for d in jupyter_path("labextensions")]
    built = [d for d in lab if (d / "package.json").is_file()]
    assert built, f"no jupyter-vram lab extension in {lab}"
    package = json.loads((built[0] / "package.json").read_text())
    assert package["name"] == "jupyter-vram"
    assert package["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    configs = [
        Path(d) / "jupyter_server_config.d" / "jupyter_vram.json" for d in jupyter_config_path()
    ]
    enabled = [json.loads(c.read_text()) for c in configs if c.is_file()]
    assert {"ServerApp": {"jpserver_extensions": {"jupyter_vram": True}}} in enabled


def test_manifest_lists_existing_scripts_in_load_order() -> None:
    js_dir = server.bokehjs_dir()
    assert js_dir is not None
    body = server.manifest(js_dir)
    assert body["version"] == bokeh.__version__
    assert [f["name"] for f in body["files"]] == SCRIPTS
    for f in body["files"]:
        digest = hashlib.sha256((js_dir / f["name"]).read_bytes()).hexdigest()
        assert digest.startswith(f["hash"])


def test_server_serves_manifest_and_scripts_without_token(lab: Lab) -> None:
    status, headers, body = lab.get("jupyter-vram/bokehjs/manifest.json")
    assert status == 200, lab.log_tail()
    assert headers["Cache-Control"] == "no-cache"
    manifest = json.loads(body)
    assert manifest["version"] == bokeh.__version__
    js_dir = server.bokehjs_dir()
    assert js_dir is not None
    for f in manifest["files"]:
        status, headers, script = lab.get(f"jupyter-vram/bokehjs/{f['name']}?v={f['hash']}")
        assert status == 200
        assert script == (js_dir / f["name"]).read_bytes()
        assert "javascript" in headers["Content-Type"]
        assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
        # Without (or with a stale) version the browser must revalidate.
        for query in ("", "?v=stale"):
            status, headers, _ = lab.get(f"jupyter-vram/bokehjs/{f['name']}{query}")
            assert status == 200
            assert headers["Cache-Control"] == "no-cache"


def test_revalidation_answers_not_modified(lab: Lab) -> None:
    status, headers, _ = lab.get("jupyter-vram/bokehjs/bokeh-gl.min.js")
    assert status == 200
    status, _, body = lab.get(
        "jupyter-vram/bokehjs/bokeh-gl.min.js", headers={"If-None-Match": headers["Etag"]}
    )
    assert status == 304
    assert body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/jupyter-vram/bokehjs/compiler.js",
        "/jupyter-vram/bokehjs/bokeh.js",
        "/jupyter-vram/bokehjs/bokeh-mathjax.min.js",
        "/jupyter-vram/bokehjs/lib/",
        "/jupyter-vram/bokehjs/",
        "/jupyter-vram/bokehjs/../../../../../etc/passwd",
        "/jupyter-vram/bokehjs/..%2F..%2F..%2Fpaths.py",
        "/jupyter-vram/bokehjs/%2e%2e/%2e%2e/paths.py",
        "/jupyter-vram/bokehjs/bokeh.min.js/../../../__init__.py",
        "/jupyter-vram/bokehjs//etc/passwd",
        "/jupyter-vram/bokehjs/bokeh.min.js%00.py",
    ],
)
def test_nothing_else_is_reachable(lab: Lab, path: str) -> None:
    status = raw_get(lab, path)
    assert status in (403, 404), (path, status)


def test_route_matches_only_the_allow_list() -> None:
    js_dir = server.bokehjs_dir()
    route = re.compile(server.handlers("/", js_dir)[1][0] + "$")  # tornado anchors routes so
    for name in SCRIPTS:
        assert route.match(f"/jupyter-vram/bokehjs/{name}")
    for bad in ["compiler.js", "bokeh.min.jsx", "lib/bokeh.min.js", "bokeh.min.js/../x", "x.js"]:
        assert not route.match(f"/jupyter-vram/bokehjs/{bad}"), bad


def test_handler_refuses_names_outside_the_allow_list() -> None:
    """Defence in depth: a route that let another name through would still get a 404."""
    js_dir = server.bokehjs_dir()
    assert js_dir is not None
    start = httputil.RequestStartLine("GET", "/x", "HTTP/1.1")
    headers = httputil.HTTPHeaders({"Host": "127.0.0.1"})
    request = httputil.HTTPServerRequest(start_line=start, headers=headers, connection=mock.Mock())
    handler = server.BokehJSHandler(web.Application(), request, path=str(js_dir))
    handler.path = "bokeh.min.js"  # set by StaticFileHandler.get before it validates
    root = str(js_dir)
    assert handler.validate_absolute_path(root, str(js_dir / "bokeh.min.js"))
    for bad in [js_dir / "compiler.js", js_dir / "lib" / "bokeh.min.js", js_dir.parent / "x.js"]:
        with pytest.raises(web.HTTPError) as err:
            handler.validate_absolute_path(root, str(bad))
        assert err.value.status_code == 404


def test_without_bokeh_the_routes_answer_404(tmp_path: Path) -> None:
    routes = server.handlers("/base/", None)
    assert routes[0][0] == "/base/jupyter-vram/bokehjs/manifest.json"
    assert routes[1][1] is server.MissingBokehJSHandler


class FakeNVML:
    """Two devices: device 0 runs the kernel (pid 111) and its worker (112) beside another
    process (999); device 1 runs only the other process."""

    GIB = 2**30

    def __init__(self) -> None:
        proc = lambda pid, gib: SimpleNamespace(pid=pid, usedGpuMemory=gib * self.GIB)  # noqa: E731
        self.procs = {0: [proc(111, 2), proc(999, 5), proc(112, 1)], 1: [proc(999, 7)]}

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return self.procs[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(10 + handle) * self.GIB, total=80 * self.GIB)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return f"Fake H{handle}".encode()


def test_kernel_gpu_memory_counts_only_the_kernels_processes() -> None:
    gib = 2**30
    devices = server.kernel_gpu_memory(FakeNVML(), {111, 112})
    assert devices == [
        {"index": 0, "name": "Fake H0", "used": 10 * gib, "total": 80 * gib, "kernel_used": 3 * gib}
    ]
    assert server.kernel_gpu_memory(FakeNVML(), {4242}) == []


def test_process_tree_finds_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = server.process_tree(os.getpid())
        assert os.getpid() in tree
        assert child.pid in tree
    finally:
        child.kill()
        child.wait()


def test_kernel_gpu_route(lab: Lab) -> None:
    auth = {"Authorization": f"token {lab.token}"}
    status, _, _ = lab.get("jupyter-vram/kernels/nosuchkernel/gpu", headers=auth)
    assert status == 404
    request = urllib.request.Request(
        f"{lab.url}api/kernels", method="POST", data=b"{}", headers=auth
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        kernel_id = json.loads(response.read())["id"]
    try:
        status, _, _ = lab.get(f"jupyter-vram/kernels/{kernel_id}/gpu")  # no token
        assert status == 403
        status, headers, body = lab.get(f"jupyter-vram/kernels/{kernel_id}/gpu", headers=auth)
        assert status == 200
        assert headers["Cache-Control"] == "no-store"
        reading = json.loads(body)
        assert reading["nvml"] is (server._nvml() is not None)
        if not reading["nvml"]:  # no GPU here: nothing to list
            assert reading["devices"] == []
    finally:
        delete = urllib.request.Request(
            f"{lab.url}api/kernels/{kernel_id}", method="DELETE", headers=auth
        )
        urllib.request.urlopen(delete, timeout=30).close()
