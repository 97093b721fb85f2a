"""What the JupyterLab extension costs in the browser (table in bench/README.md):

- JupyterLab start-up (fresh browser context, a notebook opened, cold cache): time until the
  app is restored, requests and bytes, of which the jupyter-vram extension and BokehJS;
- BokehJS loaded from the server extension (what the extension used to add to every start-up,
  blocking it, and now adds only when the first jupyter_vram app shows);
- drawing a saved profile in the browser (no kernel, no BokehJS) for the synthetic 1M-event
  profile and the 500-node wide tree of bench/static_report.py.

Run: PYTHONPATH=.:bench python bench/lab_extension.py  (needs /usr/bin/chromium)
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from playwright.sync_api import Page, sync_playwright
from static_report import wide_profile
from synthetic import synthetic_profile

from jupyter_vram._render.mime import PROFILE_MIME, profile_payload
from tests.browser.lab import CHROMIUM, CHROMIUM_ARGS, running_lab, wait_for_kernel_idle

RUNS = 3

RESTORED_MS = "async () => { await window.jupyterapp.restored; return performance.now(); }"

LOAD_BOKEHJS = """
async () => {
  const t0 = performance.now();
  const base = new URL('jupyter-vram/bokehjs/', document.baseURI.replace(/lab.*$/, ''));
  const manifest = await (await fetch(new URL('manifest.json', base))).json();
  await Promise.all(manifest.files.map(f => new Promise((ok, fail) => {
    const s = document.createElement('script');
    s.src = new URL(f.name + '?v=' + f.hash, base).href;
    s.async = false; s.onload = ok; s.onerror = fail;
    document.head.appendChild(s);
  })));
  return [performance.now() - t0, window.Bokeh.version];
}
"""

DRAW = """
async ([path, mime, payload]) => {
  const app = window.jupyterapp;
  const w = [...app.shell.widgets('main')].find(w => w.context && w.context.path === path);
  const times = [];
  let blocks = 0;
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    const r = w.content.rendermime.createRenderer(mime);
    await r.renderModel({data: {[mime]: payload}, metadata: {}, trusted: true, setData() {}});
    document.body.appendChild(r.node);
    r.node.getBoundingClientRect();  // layout included
    times.push(performance.now() - t0);
    blocks = r.node.querySelectorAll('.jp-VramProfile-block').length;
    r.node.remove();
    r.dispose();
  }
  times.sort((a, b) => a - b);
  return [times[2], blocks];
}
"""


def start_up(page: Page, url: str) -> dict[str, Any]:
    sizes: list[tuple[str, int]] = []

    def on_done(request: Any) -> None:
        try:
            sizes.append((request.url, int(request.sizes()["responseBodySize"])))
        except Exception:  # noqa: BLE001 - a request that never finished
            sizes.append((request.url, 0))

    page.on("requestfinished", on_done)
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_function("() => !!window.jupyterapp", polling=20, timeout=60_000)
    restored_ms = float(page.evaluate(RESTORED_MS))
    page.wait_for_timeout(1500)  # late requests (settings, kernelspecs, ...)
    total = sum(s for _, s in sizes)
    ext = sum(s for u, s in sizes if "/lab/extensions/jupyter-vram/" in u)
    bokeh = sum(s for u, s in sizes if "/jupyter-vram/bokehjs/" in u)
    return {"restored_ms": restored_ms, "requests": len(sizes), "bytes": total, "ext": ext,
            "bokeh": bokeh}  # fmt: skip


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_lab(Path(tmp)) as lab,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nb.cells = [nbformat.v4.new_code_cell("x = 1")]
        nbformat.write(nb, lab.root_dir / "plain.ipynb")
        runs = []
        for _ in range(RUNS):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            runs.append(start_up(page, lab.lab_url("lab/tree/plain.ipynb?reset")))
            if len(runs) == RUNS:
                wait_for_kernel_idle(page, "plain.ipynb")
                load_ms, version = page.evaluate(LOAD_BOKEHJS)
            context.close()
        from jupyter_vram._server import BOKEHJS_FILES, bokehjs_dir

        js_dir = bokehjs_dir()
        assert js_dir is not None
        bokeh_bytes = sum((js_dir / f).stat().st_size for f in BOKEHJS_FILES)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"start-up, median of {RUNS}: restored in {med['restored_ms']:.0f} ms, "
            f"{med['requests']:.0f} requests, {med['bytes'] / 1e6:.2f} MB; jupyter-vram "
            f"extension {med['ext'] / 1e3:.1f} KB; BokehJS {med['bokeh'] / 1e3:.0f} KB"
        )
        print(
            f"BokehJS {version} loaded on demand: {bokeh_bytes / 1e6:.2f} MB in {load_ms:.0f} ms "
            "(cold cache, local server)"
        )

        cases = [
            ("1,000,000 events", synthetic_profile(1_000_000)),
            ("wide tree (900 modules)", wide_profile()),
        ]
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(lab.lab_url("lab/tree/plain.ipynb?reset"), wait_until="domcontentloaded")
        wait_for_kernel_idle(page, "plain.ipynb")
        for label, profile in cases:
            payload = profile_payload(profile)
            ms, blocks = page.evaluate(DRAW, ["plain.ipynb", PROFILE_MIME, payload])
            print(
                f"saved profile drawn in the browser, {label}: {ms:.1f} ms (median of 5), "
                f"{blocks} flame blocks, {len(payload['timeline']['x'])} timeline steps"
            )
        context.close()
        browser.close()


if __name__ == "__main__":
    main()
