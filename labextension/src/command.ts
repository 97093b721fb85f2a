/**
 * "Profile cell memory": run the active code cell under `%%vram`, loading the jupyter_vram
 * IPython extension first if the kernel has not. The cell's text is not changed: the magic is
 * added to the code sent to the kernel only.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { CodeCell } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { OutputArea } from '@jupyterlab/outputarea';

import { vramCellCode } from './decide';

export const COMMAND_ID = 'jupyter-vram:profile-cell';

/** Loads the IPython extension quietly (the magic would print "already loaded"). */
export const LOAD_EXTENSION =
  "get_ipython().extension_manager.load_extension('jupyter_vram')";

/** Load jupyter_vram in the kernel; the error text when that failed, else null. */
async function loadExtension(sessionContext: ISessionContext): Promise<string | null> {
  const kernel = sessionContext.session?.kernel;
  if (!kernel) {
    return 'the notebook has no kernel';
  }
  const reply = await kernel.requestExecute({
    code: LOAD_EXTENSION,
    silent: true,
    store_history: false
  }).done;
  const content = reply.content;
  if (content.status === 'error') {
    return `${content.ename}: ${content.evalue}`;
  }
  return null;
}

/** Run the panel's active cell under %%vram; returns false (after telling the user) if not. */
export async function profileActiveCell(panel: NotebookPanel): Promise<boolean> {
  const cell = panel.content.activeCell;
  if (!(cell instanceof CodeCell)) {
    return false;
  }
  const ctx = panel.sessionContext;
  await ctx.ready;
  const source = cell.model.sharedModel.getSource();
  if (!source.trim()) {
    return false;
  }
  const error = await loadExtension(ctx);
  if (error !== null) {
    void showDialog({
      title: 'Profile cell memory',
      body: `jupyter_vram could not be loaded in this kernel (${error}). Is jupyter_vram installed in the kernel's environment?`,
      buttons: [Dialog.okButton()]
    });
    return false;
  }
  const model = cell.model;
  model.sharedModel.transact(() => {
    model.clearExecution();
    cell.outputHidden = false;
  }, false);
  model.executionState = 'running';
  model.trusted = true;
  try {
    const reply = await OutputArea.execute(vramCellCode(source), cell.outputArea, ctx, {
      cellId: model.sharedModel.getId()
    });
    if (reply) {
      model.executionCount = reply.content.execution_count;
    }
    return reply?.content.status === 'ok';
  } finally {
    model.executionState = 'idle';
  }
}
