/**
 * Status-bar item: the current notebook kernel's CUDA memory (allocated / reserved by
 * PyTorch's caching allocator, device used), hidden when the kernel has no torch imported or
 * has not initialised CUDA.
 *
 * How it reads the numbers without disturbing the kernel: a silent execute request with empty
 * code and one `user_expressions` entry (no execution count, no history, no output). The
 * expression only looks at `sys.modules`: it never imports torch and never initialises CUDA
 * (a CUDA context costs hundreds of MB of the user's GPU). Requests are sent only while the
 * kernel is idle (never queued behind the user's cells), every `refreshInterval` ms and right
 * when a run ends. While the kernel is busy (it cannot answer then) the item keeps that reading
 * and adds what NVML sees of the kernel's processes from outside, through the server extension
 * (`jupyter-vram/kernels/<id>/gpu`), refreshed at the same interval.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { FRONTEND_EXPRESSION } from './decide';
import { MEMORY_EXPRESSION, parseMemory, pickLiveDevice, statusText } from './memory';
import type { ILiveDevice, MemoryState } from './memory';

/**
 * Ask an idle kernel for its memory state (never queues behind the user's work); `own` gets
 * the request's message id, so the busy/idle it causes is not mistaken for the user's.
 */
export async function readMemory(
  kernel: Kernel.IKernelConnection,
  own: Set<string>
): Promise<MemoryState | null> {
  if (kernel.status !== 'idle') {
    return null;
  }
  const future = kernel.requestExecute(
    {
      code: '',
      silent: true,
      store_history: false,
      // (and, where jupyter_vram is loaded, that this page draws saved profiles: see live.ts)
      user_expressions: { vram: MEMORY_EXPRESSION, vram_frontend: FRONTEND_EXPRESSION },
      allow_stdin: false,
      stop_on_error: false
    },
    true
  );
  own.add(future.msg.header.msg_id);
  const reply = await future.done;
  const content = reply.content;
  if (content.status !== 'ok') {
    return null;
  }
  const result = (content.user_expressions as Record<string, any>)?.vram;
  if (!result || result.status !== 'ok') {
    return { kind: 'no-torch' };
  }
  return parseMemory(result.data?.['text/plain']);
}

/** The status-bar widget; `watch` follows one notebook's session at a time. */
export class MemoryStatus extends Widget {
  constructor() {
    super();
    this.addClass('jp-VramStatus');
    this.node.title = 'GPU memory of this notebook\'s kernel (PyTorch allocator / device)';
    this._render();
  }

  /** Milliseconds between refreshes while idle. */
  set refreshInterval(ms: number) {
    this._interval = Math.max(250, ms);
    this._restartTimer();
  }

  /** Whether a reading is shown (for the status bar's isActive). */
  get visibleReading(): boolean {
    return this._state.kind === 'reading' || (this._busy && this._live !== null);
  }

  /** Emitted when the item may have appeared or disappeared (the status bar re-asks). */
  readonly activeChanged = new Signal<this, void>(this);

  watch(sessionContext: ISessionContext | null): void {
    this._session?.iopubMessage.disconnect(this._onIOPub, this);
    this._session = sessionContext;
    this._state = { kind: 'no-torch' };
    this._busy = false;
    this._live = null;
    sessionContext?.iopubMessage.connect(this._onIOPub, this);
    this._render();
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const kernel = this._session?.session?.kernel;
    if (!kernel || this._inFlight) {
      return;
    }
    if (this._busy) {
      return this._refreshLive(kernel);
    }
    this._inFlight = true;
    try {
      const state = await readMemory(kernel, this._own);
      if (state !== null && this._session?.session?.kernel === kernel) {
        this._state = state;
        this._render();
      }
    } catch {
      // A kernel that went away mid-request: the next tick tries again.
    } finally {
      this._inFlight = false;
    }
  }

  /** While busy: the kernel's processes as NVML sees them, from the server extension. */
  private async _refreshLive(kernel: Kernel.IKernelConnection): Promise<void> {
    this._inFlight = true;
    try {
      const settings = ServerConnection.makeSettings();
      const url = URLExt.join(
        PageConfig.getBaseUrl(), 'jupyter-vram/kernels', encodeURIComponent(kernel.id), 'gpu'
      );
      const response = await ServerConnection.makeRequest(url, {}, settings);
      if (!response.ok) {
        return;
      }
      const body = (await response.json()) as { devices?: ILiveDevice[] };
      if (this._busy && this._session?.session?.kernel === kernel) {
        this._live = pickLiveDevice(body.devices);
        this._render();
      }
    } catch {
      // The server extension is optional for this item: keep the last reading.
    } finally {
      this._inFlight = false;
    }
  }

  dispose(): void {
    window.clearInterval(this._timer);
    this._session?.iopubMessage.disconnect(this._onIOPub, this);
    super.dispose();
  }

  /** Kernel status from iopub, leaving out the busy/idle of this item's own requests. */
  private _onIOPub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    if (msg.header.msg_type !== 'status') {
      return;
    }
    const parent = (msg.parent_header as Partial<KernelMessage.IHeader>).msg_id ?? '';
    const status = (msg as KernelMessage.IStatusMsg).content.execution_state;
    if (this._own.has(parent)) {
      if (status === 'idle') {
        this._own.delete(parent);
      }
      return;
    }
    if (status === 'busy') {
      this._busy = true;
      this._render();
      void this.refresh();
    } else if (status === 'idle') {
      this._busy = false;
      this._live = null;
      void this.refresh();
    } else if (status === 'restarting' || status === 'dead') {
      this._state = { kind: 'no-torch' };
      this._busy = false;
      this._live = null;
      this._render();
    }
  }

  private _restartTimer(): void {
    window.clearInterval(this._timer);
    this._timer = window.setInterval(() => void this.refresh(), this._interval);
  }

  private _render(): void {
    const s = this._state;
    this.node.dataset.state = s.kind;
    this.node.dataset.busy = String(this._busy);
    this.node.textContent = statusText(
      s.kind === 'reading' ? s.reading : null,
      this._busy,
      this._live
    );
    this.activeChanged.emit();
  }

  private _session: ISessionContext | null = null;
  private _state: MemoryState = { kind: 'no-torch' };
  private _busy = false;
  private _live: ILiveDevice | null = null;
  private _inFlight = false;
  private readonly _own = new Set<string>();
  private _interval = 2000;
  private _timer = 0;
}
