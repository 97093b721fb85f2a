/**
 * MIME renderer for `application/vnd.jupyter-vram.profile+json`, ranked before ipywidgets'
 * widget view so it sees every jupyter_vram output first. It shows the live app (the widget
 * view from the same output bundle, rendered by the notebook's own ipywidgets renderer) when
 * the kernel still holds the app's model, and otherwise draws the saved profile (view.ts).
 * BokehJS is loaded here, right before the first app is shown.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { Panel, Widget } from '@lumino/widgets';

import { loadBokehJS } from './bokeh';
import { chooseView, KERNEL_GONE, kernelGone, LIVE_GONE, liveKey } from './decide';
import { forgetKernel, kernelHoldsLive, openLive, tellKernel } from './live';
import { checkPayload, PROFILE_MIME, WIDGET_MIME } from './payload';
import { renderProfile } from './view';

/** ipywidgets' comm target: a widget model id is the id of its comm. */
const WIDGET_TARGET = 'jupyter.widget';

/** Where an output lives: what the renderer needs to decide on, and show, the widget. */
export interface IOutputHost {
  /** The notebook's rendermime (with ipywidgets' renderer bound to its widget manager). */
  readonly rendermime: IRenderMimeRegistry;
  readonly sessionContext: ISessionContext;
  /** Widget model ids whose `comm_open` this page saw from the current kernel. */
  readonly seenModels: Set<string>;
}

/** Follow a notebook's kernel: remember the widget models it opens, forget them on restart. */
export function trackWidgetModels(sessionContext: ISessionContext): Set<string> {
  const seen = new Set<string>();
  sessionContext.iopubMessage.connect((_, msg) => {
    if (msg.header.msg_type === 'comm_open') {
      const content = (msg as KernelMessage.ICommOpenMsg).content;
      if (content.target_name === WIDGET_TARGET) {
        seen.add(content.comm_id);
      }
    } else if (msg.header.msg_type === 'comm_close') {
      seen.delete((msg as KernelMessage.ICommCloseMsg).content.comm_id);
    }
  });
  sessionContext.kernelChanged.connect(() => seen.clear());
  sessionContext.statusChanged.connect((_, status) => {
    if (status === 'restarting' || status === 'dead') {
      seen.clear();
      forgetKernel(sessionContext.session?.kernel);
    }
  });
  return seen;
}

function liveKernel(ctx: ISessionContext): Kernel.IKernelConnection | null {
  const kernel = ctx.session?.kernel ?? null;
  if (kernel === null || kernel.isDisposed || kernel.status === 'dead') {
    return null;
  }
  return kernel;
}

/** Whether the kernel still has the comm (= model) `modelId` open; false if it cannot say. */
async function kernelHolds(kernel: Kernel.IKernelConnection, modelId: string): Promise<boolean> {
  try {
    const reply = await kernel.requestCommInfo({ target_name: WIDGET_TARGET });
    const content = reply.content;
    return content.status === 'ok' && modelId in content.comms;
  } catch {
    return false;
  }
}

export class ProfileRenderer extends Panel implements IRenderMime.IRenderer {
  constructor(
    options: IRenderMime.IRendererOptions,
    private readonly host: IOutputHost | null
  ) {
    super();
    this.addClass('jp-VramOutput');
    this.mimeType = options.mimeType;
  }

  readonly mimeType: string;

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const generation = ++this._generation;
    this._clear();
    const check = checkPayload(model.data[PROFILE_MIME]);
    const ref = model.data[WIDGET_MIME] as { model_id?: string } | undefined;
    const modelId = typeof ref?.model_id === 'string' && ref.model_id ? ref.model_id : null;
    const host = this.host;
    const canWidget =
      modelId !== null && host !== null && host.rendermime.getFactory(WIDGET_MIME) !== undefined;
    const key = check.ok ? liveKey(check.payload.live) : null;
    let kernel = host === null ? null : liveKernel(host.sessionContext);
    if (kernel === null && host !== null && (canWidget || key !== null) && model.trusted) {
      // A notebook being opened renders its outputs before its session connects: draw the
      // saved profile now, and ask the kernel once the session is ready (a page reloaded
      // while the kernel runs gets its app back, or the button that opens it).
      this._showSaved(check, null);
      await host.sessionContext.ready.catch(() => undefined);
      if (generation !== this._generation || this.isDisposed) {
        return;
      }
      kernel = liveKernel(host.sessionContext);
    }
    const facts = {
      widget: canWidget,
      trusted: model.trusted,
      kernel: kernel === null ? ('none' as const) : ('connected' as const),
      modelInKernel: modelId !== null && host?.seenModels.has(modelId) ? true : null
    };
    let choice = chooseView(facts);
    if (choice !== 'widget') {
      this._showSaved(check, null);
    }
    if (choice === 'ask-kernel' && kernel !== null && modelId !== null) {
      const holds = await kernelHolds(kernel, modelId);
      if (generation !== this._generation || this.isDisposed) {
        return;
      }
      choice = chooseView({ ...facts, modelInKernel: holds });
    }
    if (choice === 'widget' && host !== null) {
      await this._showWidget(model, host, check, generation);
    }
    if (choice === 'saved' && key !== null && kernel !== null && model.trusted) {
      const held = await kernelHoldsLive(kernel, key);
      if (generation !== this._generation || this.isDisposed) {
        return;
      }
      if (held) {
        this._offerLive(model, kernel, key, generation);
      }
    }
    if (kernel !== null) {
      void tellKernel(kernel); // this page draws saved profiles: the kernel may send them first
    }
  }

  /**
   * A saved view sent first (the kernel holds its profile): a button that builds its live
   * app in the kernel, which then replaces this output.
   */
  private _offerLive(
    model: IRenderMime.IMimeModel,
    kernel: Kernel.IKernelConnection,
    key: string,
    generation: number
  ): void {
    const bar = document.createElement('div');
    bar.className = 'jp-VramOutput-live';
    const button = document.createElement('button');
    button.className = 'jp-mod-styled jp-mod-accept jp-VramOutput-open';
    button.textContent = 'Open the live app';
    const hint = document.createElement('span');
    hint.textContent =
      'reruns with AMP, checkpointing or offload \u00b7 leaks \u00b7 allocator state \u00b7 ' +
      'sortable sites \u00b7 make it fit';
    bar.append(button, hint);
    this.insertWidget(0, new Widget({ node: bar }));
    const current = (): boolean => generation === this._generation && !this.isDisposed;
    button.addEventListener('click', () => {
      button.disabled = true;
      hint.textContent = 'opening the live app\u2026';
      void openLive(kernel, key).then(
        said => {
          if (!current()) {
            return; // the output was replaced by the app
          }
          if (said.outcome === 'opened' && said.data !== null) {
            // the kernel's update did not reach this output (a page loaded after it ran)
            model.setData({ data: said.data as IRenderMime.IMimeModel['data'] });
          } else if (said.outcome === 'gone') {
            hint.textContent = LIVE_GONE;
          } else {
            button.disabled = false;
            hint.textContent = `The live app could not be opened: ${said.error ?? said.outcome}`;
          }
        },
        (reason: unknown) => {
          if (current()) {
            button.disabled = false;
            hint.textContent = `The live app could not be opened: ${String(reason)}`;
          }
        }
      );
    });
  }

  /** Which view is showing: `saved` or `widget` (read by tests through the DOM). */
  get view(): string {
    return this._view;
  }

  private async _showWidget(
    model: IRenderMime.IMimeModel,
    host: IOutputHost,
    check: ReturnType<typeof checkPayload>,
    generation: number
  ): Promise<void> {
    let conflict: string | null = null;
    try {
      conflict = (await loadBokehJS()).conflict;
    } catch (reason) {
      this._showSaved(check, `The interactive app needs BokehJS, which could not be loaded: ${String(reason)}`);
      return;
    }
    if (generation !== this._generation || this.isDisposed) {
      return;
    }
    const inner = host.rendermime.createRenderer(WIDGET_MIME);
    inner.hide();
    this.addWidget(inner);
    await inner.renderModel(model);
    if (generation !== this._generation || this.isDisposed) {
      return;
    }
    this._watchKernel(host, check, generation);
    const outcome = widgetOutcome(inner);
    if (outcome === 'shown') {
      this._adopt(inner, conflict);
    } else if (outcome === 'failed') {
      inner.dispose();
      this._showSaved(check, null);
    } else {
      // The widget manager is still restoring (a reloaded page with a live kernel): show the
      // saved profile meanwhile and swap when the view appears, or give up after a while.
      this._showSaved(check, null);
      this._await(inner, conflict, generation);
    }
  }

  private _adopt(inner: IRenderMime.IRenderer, conflict: string | null): void {
    this._removeSaved();
    if (conflict !== null) {
      this.insertWidget(0, note(conflict, 'jp-VramOutput-conflict'));
    }
    inner.show();
    this._setView('widget');
  }

  private _await(inner: IRenderMime.IRenderer, conflict: string | null, generation: number): void {
    const stop = (): void => {
      observer.disconnect();
      window.clearTimeout(timer);
    };
    const check = (): void => {
      if (generation !== this._generation || this.isDisposed || inner.isDisposed) {
        stop();
        return;
      }
      const outcome = widgetOutcome(inner);
      if (outcome === 'shown') {
        stop();
        this._adopt(inner, conflict);
      } else if (outcome === 'failed') {
        stop();
        inner.dispose();
      }
    };
    const observer = new MutationObserver(check);
    observer.observe(inner.node, { childList: true, characterData: true, subtree: false });
    const timer = window.setTimeout(() => {
      stop();
      if (!inner.isDisposed && widgetOutcome(inner) !== 'shown') {
        inner.dispose();
      }
    }, PENDING_MS);
  }

  /**
   * Once the app's kernel dies, shuts down, restarts or is replaced, the app's buttons do
   * nothing: swap it for the saved profile, saying why.
   */
  private _watchKernel(
    host: IOutputHost,
    check: ReturnType<typeof checkPayload>,
    generation: number
  ): void {
    this._unwatch();
    const ctx = host.sessionContext;
    const kernel = ctx.session?.kernel ?? null;
    const gone = (): void => {
      this._unwatch();
      if (generation !== this._generation || this.isDisposed) {
        return;
      }
      for (const w of [...this.widgets]) {
        w.dispose();
      }
      this._saved = null;
      this._showSaved(check, KERNEL_GONE);
    };
    const onStatus = (_: unknown, status: string): void => {
      if (kernelGone(status)) {
        gone();
      }
    };
    const onKernel = (): void => {
      if ((ctx.session?.kernel ?? null) !== kernel) {
        gone();
      }
    };
    ctx.statusChanged.connect(onStatus);
    ctx.kernelChanged.connect(onKernel);
    this._unwatch = () => {
      ctx.statusChanged.disconnect(onStatus);
      ctx.kernelChanged.disconnect(onKernel);
      this._unwatch = () => undefined;
    };
  }

  dispose(): void {
    this._unwatch();
    super.dispose();
  }

  private _showSaved(check: ReturnType<typeof checkPayload>, why: string | null): void {
    this._removeSaved();
    const body = check.ok
      ? renderProfile(check.payload, why)
      : noteNode(`jupyter_vram: cannot draw this saved profile: ${check.reason}`);
    this._saved = new Widget({ node: body });
    this.insertWidget(0, this._saved);
    this._setView('saved');
  }

  private _setView(view: string): void {
    this._view = view;
    this.node.dataset.vramView = view;
  }

  private _removeSaved(): void {
    this._saved?.dispose();
    this._saved = null;
  }

  private _clear(): void {
    this._unwatch();
    for (const w of [...this.widgets]) {
      w.dispose();
    }
    this._saved = null;
    this._setView('');
  }

  private _generation = 0;
  private _unwatch: () => void = () => undefined;
  private _saved: Widget | null = null;
  private _view = '';
}

function noteNode(text: string, className = 'jp-VramOutput-note'): HTMLElement {
  const div = document.createElement('div');
  div.className = className;
  div.textContent = text;
  return div;
}

function note(text: string, className: string): Widget {
  return new Widget({ node: noteNode(text, className) });
}

/** How long a widget view may stay pending (manager restoring) before it is given up. */
const PENDING_MS = 60000;

/**
 * What ipywidgets' renderer made of the output: a view (`shown`), an error box (`failed`:
 * "Error displaying widget..."), or still waiting for its manager (`pending`).
 */
function widgetOutcome(inner: IRenderMime.IRenderer): 'shown' | 'failed' | 'pending' {
  const children = (inner as unknown as Panel).widgets;
  if (children !== undefined && children.length > 0) {
    return 'shown';
  }
  return inner.node.textContent?.startsWith('Error displaying widget') ? 'failed' : 'pending';
}

/** Renderer factory; `host` null: outside a notebook (console, output view), saved view only. */
export function profileRendererFactory(host: IOutputHost | null): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [PROFILE_MIME],
    defaultRank: RANK,
    createRenderer: options => new ProfileRenderer(options, host)
  };
}

/** Before ipywidgets' widget view (-10), so jupyter_vram outputs come here first. */
export const RANK = -20;
