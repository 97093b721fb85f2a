/**
 * Which view a jupyter_vram output gets: the live widget app, or the profile drawn from its
 * saved data. Pure, so it is unit tested; `renderer.ts` gathers the facts.
 */

export interface IViewFacts {
  /** The output has a widget reference (`model_id`), and the notebook renders widgets. */
  widget: boolean;
  /** The output is trusted (executed here, or a signed notebook). */
  trusted: boolean;
  /** The notebook's kernel: none, or connected (status not dead). */
  kernel: 'none' | 'connected';
  /**
   * Whether the kernel holds the widget's model: true once its `comm_open` was seen on this
   * page or the kernel listed it (comm_info), false when the kernel said no, null: not asked.
   */
  modelInKernel: boolean | null;
}

/**
 * `widget`: show the app (load BokehJS first); `saved`: draw the saved profile;
 * `ask-kernel`: draw the saved profile and ask the kernel whether it still holds the model.
 *
 * The widget is shown only when its model can be restored: a saved notebook reopened without
 * (or with a new) kernel never gets "Error displaying widget" nor an endless "Loading widget",
 * and no BokehJS is fetched for an app that cannot appear.
 */
export function chooseView(f: IViewFacts): 'widget' | 'saved' | 'ask-kernel' {
  if (!f.widget || !f.trusted || f.kernel === 'none') {
    return 'saved';
  }
  if (f.modelInKernel === null) {
    return 'ask-kernel';
  }
  return f.modelInKernel ? 'widget' : 'saved';
}

/** What a live app says when its kernel goes: the app's buttons would do nothing. */
export const KERNEL_GONE =
  'Kernel gone \u2014 showing the saved profile (the buttons of the live app need its kernel; run the cell again for it).';

/**
 * Whether a kernel status means the live app's kernel is gone: it died, was shut down, or is
 * restarting (a restarted kernel holds none of the app's widgets).
 */
export function kernelGone(status: string): boolean {
  return (
    status === 'dead' ||
    status === 'terminating' ||
    status === 'restarting' ||
    status === 'autorestarting'
  );
}

/** The code that profiles `source`: `%%vram` + the cell, unless it already starts so. */
export function vramCellCode(source: string): string {
  const first = source.replace(/^\s*\n/, '').split('\n', 1)[0].trim();
  if (/^%%vram(\s|$)/.test(first)) {
    return source;
  }
  return `%%vram\n${source}`;
}

/**
 * The key an output's live app opens by, if the output carries a valid one. Only the kernel's
 * own form (32 hex digits) passes: the key goes into the code the kernel evaluates, and a
 * saved notebook's output could hold anything.
 */
export function liveKey(value: unknown): string | null {
  return typeof value === 'string' && /^[0-9a-f]{32}$/.test(value) ? value : null;
}

/** The user expression that opens the live app of the output `key` (see `liveKey`). */
export function openLiveExpression(key: string): string {
  return (
    "(lambda m: 'gone' if m is None else m.open_live('" +
    key +
    "'))(__import__('sys').modules.get('jupyter_vram._app.first_view'))"
  );
}

/** The user expression asking whether the kernel can still open the live app of `key`. */
export function holdsLiveExpression(key: string): string {
  return (
    "(lambda m: m is not None and m.holds('" +
    key +
    "'))(__import__('sys').modules.get('jupyter_vram._app.first_view'))"
  );
}

/**
 * The user expression that tells a kernel with jupyter_vram loaded that this page draws saved
 * profiles itself (its outputs then come without the live app until asked for). It only looks
 * at `sys.modules`: a kernel without jupyter_vram answers False and imports nothing.
 */
export const FRONTEND_EXPRESSION =
  "(lambda m: m is not None and m.frontend_draws_profiles())" +
  "(__import__('sys').modules.get('jupyter_vram._session'))";

/**
 * What the kernel's answer to `openLiveExpression` says: the app's bundle (with its widget
 * view) when it opened, the string 'gone' (its `text/plain` repr) when it cannot.
 */
export function openOutcome(data: unknown): 'opened' | 'gone' | 'unknown' {
  if (typeof data !== 'object' || data === null) {
    return 'unknown';
  }
  const bundle = data as Record<string, unknown>;
  if (typeof bundle['application/vnd.jupyter.widget-view+json'] === 'object') {
    return 'opened';
  }
  return bundle['text/plain'] === "'gone'" ? 'gone' : 'unknown';
}

/** What an output whose live app cannot be opened says (its saved profile stays). */
export const LIVE_GONE =
  'This profile is no longer in the kernel\u2019s memory (a newer one replaced it, or the kernel restarted): run the cell again for its live app.';
