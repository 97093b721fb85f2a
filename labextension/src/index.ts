/**
 * jupyter-vram JupyterLab / Notebook 7 extension.
 *
 * - `jupyter-vram:renderer`: draws jupyter_vram outputs (`application/vnd.jupyter-vram.profile+json`):
 *   the live app while the kernel holds it (BokehJS loaded then, never at start-up), the saved
 *   profile otherwise (kernel gone, notebook reopened).
 * - `jupyter-vram:plugin`: the "Profile cell memory" command (palette, notebook toolbar,
 *   shortcut), the status-bar memory item, and their settings (schema/plugin.json).
 *
 * Activation does no I/O: nothing is fetched when JupyterLab starts.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { COMMAND_ID, profileActiveCell } from './command';
import { profileRendererFactory, RANK, trackWidgetModels } from './renderer';
import { MemoryStatus } from './status';

export { loadBokehJS, decideBokehJS } from './bokeh';
export type { IBokehJSInfo } from './bokeh';

const rendererPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-vram:renderer',
  description: 'Shows jupyter_vram profiles: the live app, or the saved profile without a kernel.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  activate: (app: JupyterFrontEnd, rendermime: IRenderMimeRegistry) => {
    // Outside notebooks (consoles, output views): the saved profile only.
    rendermime.addFactory(profileRendererFactory(null), RANK);
    // In a notebook: bound to its rendermime (ipywidgets' renderer and widget manager) and
    // session. A widget extension runs when the panel is created, before outputs render.
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: NotebookPanel, _context: DocumentRegistry.IContext<INotebookModel>) => {
        const host = {
          rendermime: panel.content.rendermime,
          sessionContext: panel.sessionContext,
          seenModels: trackWidgetModels(panel.sessionContext)
        };
        panel.content.rendermime.addFactory(profileRendererFactory(host), RANK);
      }
    });
  }
};

const PLUGIN_ID = 'jupyter-vram:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Profile cell memory command, toolbar button, shortcut and status-bar item.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, IStatusBar, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null
  ) => {
    app.commands.addCommand(COMMAND_ID, {
      label: 'Profile cell memory',
      caption: 'Run the active cell under %%vram (loads jupyter_vram in the kernel if needed)',
      iconClass: 'jp-VramIcon',
      isEnabled: () => tracker.currentWidget !== null,
      execute: async () => {
        const panel = tracker.currentWidget;
        return panel === null ? false : profileActiveCell(panel);
      }
    });
    palette?.addItem({ command: COMMAND_ID, category: 'jupyter_vram' });

    if (statusBar !== null) {
      const item = new MemoryStatus();
      const follow = (): void => item.watch(tracker.currentWidget?.sessionContext ?? null);
      tracker.currentChanged.connect(follow);
      follow();
      let enabled = true;
      statusBar.registerStatusItem('jupyter-vram:memory', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => enabled && item.visibleReading,
        activeStateChanged: item.activeChanged
      });
      settingRegistry
        ?.load(PLUGIN_ID)
        .then(settings => {
          const apply = (): void => {
            enabled = settings.get('statusBar').composite as boolean;
            item.refreshInterval = settings.get('refreshInterval').composite as number;
            item.activeChanged.emit();
          };
          settings.changed.connect(apply);
          apply();
        })
        .catch((reason: unknown) => console.error('jupyter-vram: settings not loaded', reason));
    }
  }
};

export default [rendererPlugin, plugin];
