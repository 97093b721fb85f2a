/**
 * jupyter-vram: put BokehJS into the JupyterLab page once, from the local Jupyter server.
 *
 * jupyter_bokeh's widget view calls `window.Bokeh.require(...)` and does not bundle BokehJS.
 * Bokeh's default resources come from a CDN (nothing renders offline), and inline resources put
 * megabytes of JavaScript into every output. The jupyter_vram server extension serves the
 * installed Python bokeh's own BokehJS files, so the version matches the kernel's bokeh (when
 * the kernel runs in the server's environment) and no request leaves the Jupyter server.
 *
 * Activation waits for the scripts (bounded by a timeout), so JupyterLab restores notebooks and
 * renders widgets only after `window.Bokeh` exists.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Token } from '@lumino/coreutils';

/** Server route (below the base URL) of the jupyter_vram server extension's BokehJS files. */
export const BOKEHJS_ROUTE = 'jupyter-vram/bokehjs';

/** Give up waiting (and let JupyterLab start) after this long; loading may still finish. */
const TIMEOUT_MS = 30000;

/** Name of the window property holding the load promise (one load per page, also for tests). */
const GLOBAL_KEY = 'jupyterVramBokehJS';

/** What ended up in the page. */
export interface IBokehJSInfo {
  /** `window.Bokeh.version`. */
  readonly version: string;
  /** `server`: loaded by this extension; `page`: `window.Bokeh` was already there. */
  readonly source: 'server' | 'page';
  /** Script URLs this extension added, in load order (empty for `page`). */
  readonly urls: readonly string[];
}

/** The BokehJS loader service. */
export interface IBokehJSLoader {
  /** Resolves once BokehJS is in the page; rejects (with a logged error) if loading failed. */
  readonly ready: Promise<IBokehJSInfo>;
}

/** Token for plugins that need BokehJS before they render. */
export const IBokehJSLoader = new Token<IBokehJSLoader>(
  'jupyter-vram:IBokehJSLoader',
  'BokehJS loaded once per page from the local Jupyter server.'
);

/** Shape of `GET {base_url}jupyter-vram/bokehjs/manifest.json`. */
interface IManifest {
  version: string;
  files: { name: string; hash: string }[];
}

interface IBokehGlobal {
  version?: string;
}

type BokehWindow = Window & {
  Bokeh?: IBokehGlobal;
  [GLOBAL_KEY]?: Promise<IBokehJSInfo>;
};

const win = window as BokehWindow;

/** Add one classic script; `async = false` keeps execution in insertion order. */
function addScript(url: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const script = document.createElement('script');
    script.src = url;
    script.async = false;
    script.dataset.jupyterVram = 'bokehjs';
    script.onload = () => resolve();
    script.onerror = () => reject(new Error(`could not load ${url}`));
    document.head.appendChild(script);
  });
}

async function fetchManifest(base: string): Promise<IManifest> {
  const url = URLExt.join(base, 'manifest.json');
  const settings = ServerConnection.makeSettings();
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new Error(
      `GET ${url} answered HTTP ${response.status}: is the jupyter_vram server extension ` +
        'enabled in this Jupyter server (`jupyter server extension list`), and is bokeh ' +
        "installed in the server's environment?"
    );
  }
  return (await response.json()) as IManifest;
}

async function load(): Promise<IBokehJSInfo> {
  const existing = win.Bokeh;
  if (existing !== undefined) {
    return { version: existing.version ?? 'unknown', source: 'page', urls: [] };
  }
  const base = URLExt.join(PageConfig.getBaseUrl(), BOKEHJS_ROUTE);
  const manifest = await fetchManifest(base);
  const urls = manifest.files.map(
    f =>
      `${URLExt.join(base, encodeURIComponent(f.name))}?v=${encodeURIComponent(f.hash)}`
  );
  await Promise.all(urls.map(addScript));
  const bokeh = win.Bokeh;
  if (bokeh === undefined) {
    throw new Error(`loaded ${urls.join(', ')} but window.Bokeh is not defined`);
  }
  if (bokeh.version !== manifest.version) {
    console.warn(
      `jupyter-vram: window.Bokeh is ${bokeh.version}, the server's bokeh is ${manifest.version}`
    );
  }
  return { version: bokeh.version ?? manifest.version, source: 'server', urls };
}

/** Rejection of `withTimeout`: the promise may still settle later. */
class TimeoutError extends Error {}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = window.setTimeout(
      () => reject(new TimeoutError(`not loaded after ${ms / 1000} s`)),
      ms
    );
    promise.then(
      value => {
        window.clearTimeout(timer);
        resolve(value);
      },
      (reason: unknown) => {
        window.clearTimeout(timer);
        reject(reason);
      }
    );
  });
}

/** Start loading BokehJS unless this page already did; every caller shares one promise. */
export function loadBokehJS(): Promise<IBokehJSInfo> {
  let ready = win[GLOBAL_KEY];
  if (ready === undefined) {
    ready = load();
    win[GLOBAL_KEY] = ready;
    ready.catch((reason: unknown) => {
      console.error(
        'jupyter-vram: BokehJS could not be loaded from the Jupyter server; bokeh figures ' +
          '(jupyter_bokeh widgets) will not render.',
        reason
      );
    });
  }
  return ready;
}

const plugin: JupyterFrontEndPlugin<IBokehJSLoader> = {
  id: 'jupyter-vram:bokehjs',
  description: 'Loads BokehJS once per page from the local Jupyter server (offline).',
  autoStart: true,
  provides: IBokehJSLoader,
  activate: async (app: JupyterFrontEnd): Promise<IBokehJSLoader> => {
    const ready = loadBokehJS();
    try {
      // JupyterLab awaits start-up plugins before it restores notebooks, so widget views
      // (which need window.Bokeh in their constructor) never run ahead of the scripts.
      const info = await withTimeout(ready, TIMEOUT_MS);
      console.debug(`jupyter-vram: BokehJS ${info.version} ready (${info.source})`);
    } catch (reason) {
      // A failed load was logged by loadBokehJS; a slow one must not block JupyterLab.
      if (reason instanceof TimeoutError) {
        console.error(`jupyter-vram: BokehJS ${reason.message}; starting without it`);
      }
    }
    return { ready };
  }
};

export default plugin;
