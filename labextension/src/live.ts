/**
 * Talking to the kernel about saved views (see jupyter_vram/_app/first_view.py): telling it
 * this page draws saved profiles, and opening one output's live app. Both are silent execute
 * requests with one user expression (no execution count, no history, no output of their own).
 */
import type { Kernel, KernelMessage } from '@jupyterlab/services';

import {
  FRONTEND_EXPRESSION,
  holdsLiveExpression,
  openLiveExpression,
  openOutcome
} from './decide';

/** Kernels told already (a restarted kernel is a new connection state: told again). */
const told = new WeakMap<Kernel.IKernelConnection, string>();

function quietRequest(
  kernel: Kernel.IKernelConnection,
  expressions: Record<string, string>
): Kernel.IShellFuture<KernelMessage.IExecuteRequestMsg, KernelMessage.IExecuteReplyMsg> {
  return kernel.requestExecute(
    {
      code: '',
      silent: true,
      store_history: false,
      user_expressions: expressions,
      allow_stdin: false,
      stop_on_error: false
    },
    true
  );
}

/** Forget that a kernel was told (it restarted: the new process knows nothing). */
export function forgetKernel(kernel: Kernel.IKernelConnection | null | undefined): void {
  if (kernel) {
    told.delete(kernel);
  }
}

/**
 * Tell an idle kernel that this page draws saved profiles, once per kernel (never queued
 * behind the user's cells: a busy kernel is told at a later output).
 */
export async function tellKernel(kernel: Kernel.IKernelConnection): Promise<void> {
  if (kernel.status !== 'idle' || told.get(kernel) === kernel.id) {
    return;
  }
  try {
    const reply = await quietRequest(kernel, { vram_frontend: FRONTEND_EXPRESSION }).done;
    const said = (reply.content as { user_expressions?: Record<string, any> }).user_expressions
      ?.vram_frontend;
    if (said?.status === 'ok' && said.data?.['text/plain'] === 'True') {
      told.set(kernel, kernel.id);
    }
  } catch {
    // a kernel that went away: a later output tells the next one
  }
}

/**
 * Whether the kernel can still open the live app of the output `key` (a reopened notebook's
 * outputs belong to an earlier kernel). Asked only of an idle kernel: a busy one is taken to
 * hold it (the button then says so if it does not).
 */
export async function kernelHoldsLive(
  kernel: Kernel.IKernelConnection,
  key: string
): Promise<boolean> {
  if (kernel.status !== 'idle') {
    return true;
  }
  try {
    const reply = await quietRequest(kernel, { holds: holdsLiveExpression(key) }).done;
    const said = (reply.content as { user_expressions?: Record<string, any> }).user_expressions
      ?.holds;
    return !(said?.status === 'ok' && said.data?.['text/plain'] === 'False');
  } catch {
    return true;
  }
}

/** What opening a live app gave: the outcome, and the output's new data when it opened. */
export interface ILiveOpened {
  outcome: 'opened' | 'gone' | 'unknown';
  data: Record<string, unknown> | null;
  error: string | null;
}

/** Ask the kernel for the live app of the output `key`; its bundle comes back. */
export async function openLive(
  kernel: Kernel.IKernelConnection,
  key: string
): Promise<ILiveOpened> {
  const reply = await quietRequest(kernel, { open: openLiveExpression(key) }).done;
  const said = (reply.content as { user_expressions?: Record<string, any> }).user_expressions
    ?.open;
  if (reply.content.status !== 'ok' || said?.status !== 'ok') {
    const why = said?.evalue ?? 'the kernel did not run the request';
    return { outcome: 'unknown', data: null, error: String(why) };
  }
  const outcome = openOutcome(said.data);
  return { outcome, data: outcome === 'opened' ? said.data : null, error: null };
}
