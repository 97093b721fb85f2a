"""Jupyter server extension: serve the installed bokeh's own BokehJS to the JupyterLab page.

jupyter_bokeh's widgets need BokehJS in the page but do not ship it; bokeh's default resources
come from a CDN (nothing renders offline) and inline resources put megabytes of JavaScript into
every output. The ``jupyter-vram`` lab extension instead loads, once per page, the files this
handler serves from the Python ``bokeh`` package, so the version matches the bokeh installed
beside the server and nothing leaves the Jupyter server.

Routes (below ``base_url``):

- ``jupyter-vram/bokehjs/manifest.json``: ``{"version", "files": [{"name", "hash"}]}``, the
  scripts in load order with a content hash for cache-busting URLs (``?v=<hash>``).
- ``jupyter-vram/bokehjs/<name>``: one of those scripts; a matching ``?v=`` makes it cacheable
  for a year, anything else is revalidated (``no-cache``).

- ``jupyter-vram/kernels/<kernel_id>/gpu`` (token required): the GPU memory NVML sees for that
  kernel's process, for the lab extension's status bar while the kernel is busy (when it cannot
  answer itself); ``{"nvml": bool, "devices": [{"index", "name", "used", "total",
  "kernel_used"}]}``, only devices where the kernel process holds memory.

Only the names in :data:`BOKEHJS_FILES` are reachable (the route's pattern is built from them),
so nothing outside bokeh's static ``js`` directory can be asked for. Like JupyterLab's own
extension assets (``/lab/extensions/...``), these public, versioned library files are served
without authentication: the page's ``<script>`` tags cannot send the token header, and the files
reveal nothing but the bokeh version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

if TYPE_CHECKING:
    from jupyter_server.serverapp import ServerApp

ROUTE = "jupyter-vram/bokehjs"
"""URL path below the server's ``base_url``; the lab extension uses the same constant."""

BOKEHJS_FILES = (
    "bokeh.min.js",
    "bokeh-gl.min.js",
    "bokeh-widgets.min.js",
    "bokeh-tables.min.js",
)
"""Load order. Core, WebGL, widgets, then DataTable (needs widgets). ``bokeh-mathjax`` (1.8 MB)
is left out: jupyter_vram draws no LaTeX labels. ``bokeh-api`` is for building plots in JS."""

YEAR = 365 * 24 * 3600


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """Tell jupyter_server which module holds ``_load_jupyter_server_extension``."""
    return [{"module": "jupyter_vram._server"}]


def bokehjs_dir() -> Path | None:
    """bokeh's static ``js`` directory, or None when bokeh is not installed beside the server."""
    try:
        from bokeh.util.paths import bokehjs_path
    except ImportError:
        return None
    return Path(bokehjs_path()) / "js"


@lru_cache(maxsize=16)
def _file_hash(path: Path, mtime_ns: int, size: int) -> str:
    """Short content hash; keyed on mtime and size so an upgraded bokeh gets new URLs."""
    del mtime_ns, size  # only part of the cache key
    return hashlib.sha256(path.read_bytes()).hexdigest()[:20]


def file_hash(path: Path) -> str:
    """Content hash of ``path`` (cached until the file changes)."""
    st = path.stat()
    return _file_hash(path, st.st_mtime_ns, st.st_size)


def bokeh_version() -> str:
    """Version of the installed bokeh distribution, read fresh (not the imported module's)."""
    try:
        return dist_version("bokeh")
    except PackageNotFoundError:
        return "unknown"


def manifest(js_dir: Path) -> dict[str, Any]:
    """What the lab extension loads: bokeh's version and the scripts, in order, with hashes."""
    files = [{"name": name, "hash": file_hash(js_dir / name)} for name in BOKEHJS_FILES]
    return {"version": bokeh_version(), "files": files}


class ManifestHandler(JupyterHandler):
    """``manifest.json``: tells the page which scripts to load (never cached)."""

    js_dir: Path | None

    def initialize(self, js_dir: Path | None) -> None:
        self.js_dir = js_dir

    @allow_unauthenticated
    def get(self) -> None:
        if self.js_dir is None:
            raise web.HTTPError(404, "bokeh is not installed in the Jupyter server's environment")
        try:
            body = manifest(self.js_dir)
        except OSError as err:
            raise web.HTTPError(404, f"BokehJS files not found: {err}") from err
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-cache")
        self.finish(json.dumps(body))


class BokehJSHandler(JupyterHandler, web.StaticFileHandler):
    """One BokehJS script from bokeh's static directory, with cache headers keyed on ``?v=``."""

    @allow_unauthenticated
    def get(self, path: str, include_body: bool = True) -> Any:
        return web.StaticFileHandler.get(self, path, include_body)

    @allow_unauthenticated
    def head(self, path: str) -> Any:
        return web.StaticFileHandler.head(self, path)

    def validate_absolute_path(self, root: str, absolute_path: str) -> str | None:
        """Only the allow-listed names, directly inside ``root`` (defence in depth: the route
        already admits nothing else); tornado then checks existence and symlinks."""
        path = os.path.abspath(absolute_path)
        inside = os.path.dirname(path) == os.path.abspath(root)
        if not inside or os.path.basename(path) not in BOKEHJS_FILES:
            raise web.HTTPError(404)
        return super().validate_absolute_path(root, absolute_path)

    def _versioned(self) -> bool:
        """Whether the URL's ``?v=`` is the file's current hash (so its content never changes)."""
        assert self.absolute_path is not None
        return self.get_query_argument("v", None) == file_hash(Path(self.absolute_path))

    def get_cache_time(self, path: str, modified: Any, mime_type: str) -> int:
        return YEAR if self._versioned() else 0

    def set_extra_headers(self, path: str) -> None:
        if self._versioned():
            self.set_header("Cache-Control", f"public, max-age={YEAR}, immutable")
        else:
            self.set_header("Cache-Control", "no-cache")

    def compute_etag(self) -> str | None:
        assert self.absolute_path is not None
        return f'"{file_hash(Path(self.absolute_path))}"'


class MissingBokehJSHandler(JupyterHandler):
    """Answers for the scripts when bokeh is not installed: a clear 404, not a login page."""

    @allow_unauthenticated
    def get(self, path: str) -> None:
        raise web.HTTPError(404, "bokeh is not installed in the Jupyter server's environment")


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (Linux ``/proc``; elsewhere ``pid`` alone)."""
    found = {pid}
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                children = [int(c) for c in task.read_text().split()]
            except (OSError, ValueError):
                continue
            todo.extend(c for c in children if c not in found)
            found.update(children)
    return found


def kernel_gpu_memory(nvml: Any, pids: set[int]) -> list[dict[str, Any]]:
    """Per NVML device holding memory of ``pids``: its used / total bytes and the processes'
    share. NVML numbers devices itself (CUDA_VISIBLE_DEVICES does not apply). A process in
    another PID namespace (some containers) is not matched: then nothing is listed."""
    devices = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported on some drivers / vGPUs
            continue
        mine = [
            int(p.usedGpuMemory)
            for p in procs
            if p.pid in pids and isinstance(getattr(p, "usedGpuMemory", None), int)
        ]
        if not mine:
            continue
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        devices.append(
            {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "used": int(info.used),
                "total": int(info.total),
                "kernel_used": sum(mine),
            }
        )
    return devices


@lru_cache(maxsize=1)
def _nvml() -> Any | None:
    """The initialised pynvml module, or None without the package, a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, DriverNotLoaded
        return None
    return pynvml


class KernelGPUHandler(APIHandler):
    """GPU memory of one kernel's processes, as NVML sees it from outside the kernel."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    def get(self, kernel_id: str) -> None:
        try:
            kernel = self.kernel_manager.get_kernel(kernel_id)
        except KeyError as err:
            raise web.HTTPError(404, f"no kernel {kernel_id}") from err
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        nvml = _nvml()
        devices: list[dict[str, Any]] = []
        if nvml is not None and isinstance(pid, int):
            try:
                devices = kernel_gpu_memory(nvml, process_tree(pid))
            except Exception as err:  # noqa: BLE001 - a driver error must not break the page
                self.log.debug("jupyter_vram: NVML query failed: %s", err)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"nvml": nvml is not None, "devices": devices}))


def handlers(base_url: str, js_dir: Path | None) -> list[tuple[str, type[Any], dict[str, Any]]]:
    """Tornado routes for the BokehJS files (and the kernel GPU reading) below ``base_url``."""
    kernel_gpu: tuple[str, type[Any], dict[str, Any]] = (
        url_path_join(base_url, "jupyter-vram/kernels", r"(?P<kernel_id>[\w-]+)", "gpu"),
        KernelGPUHandler,
        {},
    )
    return [*_bokehjs_handlers(base_url, js_dir), kernel_gpu]


def _bokehjs_handlers(
    base_url: str, js_dir: Path | None
) -> list[tuple[str, type[Any], dict[str, Any]]]:
    route = url_path_join(base_url, ROUTE)
    names = "|".join(re.escape(name) for name in BOKEHJS_FILES)
    script = url_path_join(route, f"({names})")
    manifest_route = url_path_join(route, "manifest.json")
    if js_dir is None:
        return [
            (manifest_route, ManifestHandler, {"js_dir": None}),
            (script, MissingBokehJSHandler, {}),
        ]
    return [
        (manifest_route, ManifestHandler, {"js_dir": js_dir}),
        (script, BokehJSHandler, {"path": str(js_dir)}),
    ]


def _load_jupyter_server_extension(serverapp: ServerApp) -> None:
    """Register the BokehJS routes on the running server."""
    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    js_dir = bokehjs_dir()
    # ServerWebApplication.add_handlers (untyped) also audits the handlers' auth decorators.
    web_app.add_handlers(".*$", handlers(base_url, js_dir))  # type: ignore[no-untyped-call]
    if js_dir is None:
        serverapp.log.warning(
            "jupyter_vram: bokeh is not installed here; bokeh figures will not render in Lab"
        )
    else:
        url = url_path_join(base_url, ROUTE)
        serverapp.log.info(f"jupyter_vram: serving BokehJS from {js_dir} at {url}/")
