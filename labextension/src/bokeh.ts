/**
 * BokehJS for jupyter_bokeh's widget views, loaded lazily: only when a jupyter_vram output is
 * about to show its widget, never at JupyterLab start-up. The scripts come from the
 * jupyter_vram server extension (the installed Python bokeh's own files, so no CDN and the
 * version matches the bokeh beside the server).
 *
 * Another BokehJS may already be on the page (panel, holoviews, `output_notebook()`): a page
 * holds one `window.Bokeh`, so a second copy would break the first. With the same
 * major.minor version the page's copy is used; otherwise nothing is loaded and the conflict is
 * reported (console warning and a note above the widget).
 */
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** Server route (below the base URL) of the server extension's BokehJS files. */
export const BOKEHJS_ROUTE = 'jupyter-vram/bokehjs';

/** Window property holding the one load promise of the page (also read by tests). */
export const GLOBAL_KEY = 'jupyterVramBokehJS';

/** What ended up in the page. */
export interface IBokehJSInfo {
  /** `window.Bokeh.version`. */
  readonly version: string;
  /** `server`: loaded by this extension; `page`: `window.Bokeh` was already there. */
  readonly source: 'server' | 'page';
  /** Script URLs this extension added, in load order (empty for `page`). */
  readonly urls: readonly string[];
  /** Why the page's BokehJS may not draw jupyter_vram's figures; null when it fits. */
  readonly conflict: string | null;
}

/** Shape of `GET {base_url}jupyter-vram/bokehjs/manifest.json`. */
export interface IManifest {
  version: string;
  files: { name: string; hash: string }[];
}

/** What to do about BokehJS, given what the page has and what the server serves. */
export type BokehDecision =
  | { action: 'load' }
  | { action: 'use-page' }
  | { action: 'conflict'; message: string };

/** "3.9.2" -> "3.9"; null for something that is not a version. */
export function majorMinor(version: string): string | null {
  const m = /^(\d+)\.(\d+)/.exec(version);
  return m ? `${m[1]}.${m[2]}` : null;
}

/**
 * Load our own copy only when the page has none. A copy already there is used when its
 * major.minor equals the server's bokeh (bokeh's JSON protocol is stable within a minor
 * release); otherwise it is a conflict that cannot be fixed from this page.
 */
export function decideBokehJS(
  pageVersion: string | undefined,
  serverVersion: string | null
): BokehDecision {
  if (pageVersion === undefined) {
    return { action: 'load' };
  }
  if (serverVersion === null) {
    return { action: 'use-page' };
  }
  const page = majorMinor(pageVersion);
  if (page !== null && page === majorMinor(serverVersion)) {
    return { action: 'use-page' };
  }
  return {
    action: 'conflict',
    message:
      `BokehJS ${pageVersion} is already on this page (loaded by another extension, panel, ` +
      `holoviews or bokeh's output_notebook()), but the kernel's bokeh is ${serverVersion}: ` +
      'jupyter_vram cannot load a second BokehJS, so its bokeh figures may not draw. Install ' +
      `bokeh ${pageVersion} beside jupyter_vram, or remove the other BokehJS and reload the page.`
  };
}

/** Script URLs of a manifest, each with its content hash (cacheable for a year). */
export function scriptUrls(base: string, manifest: IManifest): string[] {
  return manifest.files.map(
    f => `${URLExt.join(base, encodeURIComponent(f.name))}?v=${encodeURIComponent(f.hash)}`
  );
}

interface IBokehGlobal {
  version?: string;
}

type BokehWindow = Window & {
  Bokeh?: IBokehGlobal;
  [GLOBAL_KEY]?: Promise<IBokehJSInfo>;
};

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
  const win = window as BokehWindow;
  const base = URLExt.join(PageConfig.getBaseUrl(), BOKEHJS_ROUTE);
  let manifest: IManifest | null = null;
  try {
    manifest = await fetchManifest(base);
  } catch (reason) {
    if (win.Bokeh === undefined) {
      throw reason;
    }
  }
  const pageVersion = win.Bokeh === undefined ? undefined : (win.Bokeh.version ?? 'unknown');
  const decision = decideBokehJS(pageVersion, manifest?.version ?? null);
  if (decision.action !== 'load' || manifest === null) {
    const conflict = decision.action === 'conflict' ? decision.message : null;
    if (conflict !== null) {
      console.warn(`jupyter-vram: ${conflict}`);
    }
    return { version: pageVersion ?? 'unknown', source: 'page', urls: [], conflict };
  }
  const urls = scriptUrls(base, manifest);
  await Promise.all(urls.map(addScript));
  const bokeh = win.Bokeh;
  if (bokeh === undefined) {
    throw new Error(`loaded ${urls.join(', ')} but window.Bokeh is not defined`);
  }
  return { version: bokeh.version ?? manifest.version, source: 'server', urls, conflict: null };
}

/** Start loading BokehJS unless this page already did; every caller shares one promise. */
export function loadBokehJS(): Promise<IBokehJSInfo> {
  const win = window as BokehWindow;
  let ready = win[GLOBAL_KEY];
  if (ready === undefined) {
    ready = load();
    win[GLOBAL_KEY] = ready;
    ready.catch((reason: unknown) => {
      console.error(
        'jupyter-vram: BokehJS could not be loaded from the Jupyter server; the profile is ' +
          'shown from its saved data instead of the interactive app.',
        reason
      );
    });
  }
  return ready;
}
