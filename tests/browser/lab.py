"""Drive a real JupyterLab from tests: start the server, write notebooks, run them in a page.

Everything that touches JupyterLab internals goes through ``window.jupyterapp`` (exposed by
``--LabApp.expose_app_in_browser``), not through toolbar widgets: the execution indicator goes
idle before a kernel even exists, so only the session's kernel object tells the truth.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import nbformat

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # Offline on any machine: every host name but the loopback fails to resolve, so a page
    # that renders here also renders without internet.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
"""Flags known to work for headless Debian chromium here (``headless=True`` adds --headless)."""

LOCAL_HOSTS = frozenset({"127.0.0.1"})
LOCAL_SCHEMES = frozenset({"data", "blob", "about"})


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Lab:
    """A running JupyterLab server."""

    url: str  # ends with "/", e.g. http://127.0.0.1:8123/
    token: str
    root_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def lab_url(self, path: str = "lab") -> str:
        """URL of a page below the server, with the token (which also sets the login cookie)."""
        sep = "&" if "?" in path else "?"
        return f"{self.url}{path}{sep}token={self.token}"

    def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """Plain HTTP GET below the server (no token unless the caller adds it)."""
        request = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-chars:]


@contextmanager
def running_lab(tmp: Path, startup_timeout: float = 60.0) -> Iterator[Lab]:
    """Start ``jupyter lab`` on 127.0.0.1 with a token, isolated config/state under ``tmp``.

    User config, data and workspaces are redirected into ``tmp`` so a developer's own
    ~/.jupyter cannot change what the test sees; the venv's (sys.prefix) config still
    applies, which is where ``pip install`` put the jupyter_vram server and lab extensions.
    """
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "JUPYTER_PLATFORM_DIRS": "1",
        # the app at once in every output, as the tests of the app expect; a test of the
        # saved view first sets "auto" in its kernel (tests/browser/test_saved_first.py)
        "JUPYTER_VRAM_FIRST_VIEW": "app",
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        "--allow-root",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp / 'settings'}",
        # No server-side fetches from the internet either.
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    # No "get Jupyter news?" toast over the notebook, and no update checks.
    notification = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True, exist_ok=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    if _serve_this_build(tmp / "path"):
        env["JUPYTER_PATH"] = os.pathsep.join(
            [str(tmp / "path"), *filter(None, os.environ.get("JUPYTER_PATH", "").split(os.pathsep))]
        )
    log_path = tmp / "jupyter-lab.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    lab = Lab(f"http://127.0.0.1:{port}/", token, root, log_path, process)
    try:
        _wait_until_up(lab, startup_timeout)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: The lab extension as this checkout built it (labextension/ -> `jlpm build`).
BUILT_EXTENSION = Path(__file__).resolve().parents[2] / "jupyter_vram" / "labextension"


def _serve_this_build(data_dir: Path) -> bool:
    """Put the checkout's own build of the lab extension, when there is one, in ``data_dir``
    (to go first on ``JUPYTER_PATH``): JupyterLab takes an extension from the first data
    directory that has it, and ``JUPYTER_PATH`` comes before the environment's, where ``pip
    install`` put a copy that may be of another checkout, or older than the last
    ``jlpm build``. False: not built here, the installed copy serves."""
    if not (BUILT_EXTENSION / "package.json").is_file():
        return False
    target = data_dir / "labextensions" / "jupyter-vram"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.symlink_to(BUILT_EXTENSION, target_is_directory=True)
    return True


def _wait_until_up(lab: Lab, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {lab.process.returncode}:\n{lab.log_tail()}"
            )
        try:
            status, _, _ = lab.get(f"api/status?token={lab.token}")
        except OSError:
            status = 0
        if status == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"jupyter lab did not answer within {timeout} s:\n{lab.log_tail()}")


def write_notebook(root: Path, name: str, cells: list[str]) -> Path:
    """Write an unexecuted notebook of code cells with the python3 kernelspec (no kernel prompt)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = root / name
    nbformat.write(nb, path)
    return path


def read_notebook(root: Path, name: str) -> Any:
    """The notebook as saved on disk (an nbformat NotebookNode)."""
    return nbformat.read(root / name, as_version=4)


def is_local(url: str) -> bool:
    """True for a request that stays on this machine's test server (or never hits the network)."""
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS


def assert_all_local(urls: list[str]) -> None:
    """Fail listing every request that went to another host than 127.0.0.1."""
    remote = sorted({u for u in urls if not is_local(u)})
    assert not remote, f"{len(remote)} request(s) left 127.0.0.1: {remote}"


# --- JavaScript run in the page through window.jupyterapp ------------------------------------

_FIND_PANEL = """
(path) => {
  const app = window.jupyterapp;
  if (!app) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.sessionContext) return w;
  }
  return null;
}
"""

_KERNEL_IDLE = f"""
(path) => {{
  const w = ({_FIND_PANEL})(path);
  if (!w || !w.context.isReady) return false;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}}
"""

_RUN_ALL = f"""
async (path) => {{
  const app = window.jupyterapp;
  const w = ({_FIND_PANEL})(path);
  app.shell.activateById(w.id);
  if (app.shell.currentWidget !== w) throw new Error('could not make ' + path + ' current');
  return await app.commands.execute('notebook:run-all-cells');
}}
"""

_SAVE = f"""
async (path) => {{
  const w = ({_FIND_PANEL})(path);
  await w.context.save();
}}
"""

_WIDGET_ERRORS = """
() => {
  const boxes = [...document.querySelectorAll('.jupyter-widgets-error-widget')]
    .map(e => 'error widget: ' + e.textContent.trim());
  const failed = [...document.querySelectorAll('.jp-OutputArea-output')]
    .filter(e => e.textContent.trim().startsWith('Error displaying widget'))
    .map(e => e.textContent.trim());
  return boxes.concat(failed);
}
"""


class PageLog:
    """Everything a page asked for and complained about, recorded from its creation on."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.failed_requests: list[str] = []
        self.console_errors: list[str] = []
        self.console_warnings: list[str] = []

    def attach(self, page: Page) -> None:
        """Listen on a Playwright page (requests of its workers included via the context)."""
        page.context.on("request", lambda r: self.requests.append(r.url))
        page.context.on(
            "requestfailed", lambda r: self.failed_requests.append(f"{r.url} ({r.failure})")
        )
        page.on(
            "console",
            lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
        )
        page.on(
            "console",
            lambda m: self.console_warnings.append(m.text) if m.type == "warning" else None,
        )
        page.on("pageerror", lambda e: self.console_errors.append(f"uncaught: {e}"))


def open_notebook(page: Page, lab: Lab, name: str, timeout_ms: float = 60_000) -> None:
    """Open ``name`` (relative to the root dir) in a fresh workspace and wait for its kernel."""
    page.goto(lab.lab_url(f"lab/tree/{name}?reset"), wait_until="domcontentloaded")
    wait_for_kernel_idle(page, name, timeout_ms)


def wait_for_kernel_idle(page: Page, name: str, timeout_ms: float = 60_000) -> None:
    """Wait until the notebook's session has a connected kernel that is idle."""
    page.wait_for_function(_KERNEL_IDLE, arg=name, timeout=timeout_ms, polling=100)


def run_all_cells(page: Page, name: str, timeout_ms: float = 60_000) -> bool:
    """Run every cell; returns when all replies are in and the kernel is idle again.

    The result is False when a cell raised (JupyterLab then stops at that cell).
    """
    page.set_default_timeout(timeout_ms)
    ok = bool(page.evaluate(_RUN_ALL, name))
    wait_for_kernel_idle(page, name, timeout_ms)
    return ok


def save_notebook(page: Page, name: str) -> None:
    """Save the notebook from the page (outputs as the frontend holds them)."""
    page.evaluate(_SAVE, name)


_CHANGE_THEME = """
async (theme) => await window.jupyterapp.commands.execute('apputils:change-theme', {theme})
"""

_SPLASH_GONE = "() => document.getElementById('jupyterlab-splash') === null"


def change_theme(page: Page, light: bool) -> None:
    """Switch to JupyterLab Light or Dark; returns once JupyterLab has finished the switch.

    A theme load ends with JupyterLab fading its splash screen out and removing it 200 ms
    later. A second switch inside those 200 ms shows the same splash again, the pending
    removal takes it away, and the second load's own removal then fails: an uncaught
    "Failed to execute 'removeChild' on 'Node'" in JupyterLab (4.6), not in the app. So
    each switch first waits for the previous one's splash to be gone (the start-up load's
    too), and then for its own, as a user between two clicks would.
    """
    page.wait_for_function(_SPLASH_GONE)
    page.evaluate(_CHANGE_THEME, "JupyterLab Light" if light else "JupyterLab Dark")
    flag = "true" if light else "false"
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{flag}'")
    page.wait_for_function(_SPLASH_GONE)


def widget_errors(page: Page) -> list[str]:
    """Texts of ipywidgets error boxes and 'Error displaying widget' outputs in the page."""
    return list(page.evaluate(_WIDGET_ERRORS))


def output_errors(nb: Any) -> list[str]:
    """Tracebacks (``error`` outputs) in a saved notebook."""
    return [
        f"{o.get('ename')}: {o.get('evalue')}"
        for cell in nb.cells
        for o in cell.get("outputs", [])
        if o.get("output_type") == "error"
    ]


def output_size(cell: Any) -> int:
    """Bytes of a cell's saved outputs, as JSON."""
    return len(json.dumps(cell.get("outputs", [])))
