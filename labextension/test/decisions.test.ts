import { describe, expect, it } from 'vitest';

import { decideBokehJS, majorMinor, scriptUrls } from '../src/bokeh';
import { vramCellCode } from '../src/decide';
import { chooseView, KERNEL_GONE, kernelGone } from '../src/decide';
import { FRONTEND_EXPRESSION, liveKey, openLiveExpression, openOutcome } from '../src/decide';
import { checkPayload } from '../src/payload';
import { formatMemory, parseMemory, pickLiveDevice, statusText } from '../src/memory';

describe('BokehJS loader decisions', () => {
  it('loads its own copy only when the page has none', () => {
    expect(decideBokehJS(undefined, '3.9.2')).toEqual({ action: 'load' });
    expect(decideBokehJS(undefined, null)).toEqual({ action: 'load' });
  });

  it('uses a compatible BokehJS already on the page', () => {
    expect(decideBokehJS('3.9.0', '3.9.2')).toEqual({ action: 'use-page' });
    expect(decideBokehJS('3.9.2', null)).toEqual({ action: 'use-page' });
  });

  it('names both versions when the page holds another minor release', () => {
    const d = decideBokehJS('3.4.1', '3.9.2');
    expect(d.action).toBe('conflict');
    if (d.action === 'conflict') {
      expect(d.message).toContain('BokehJS 3.4.1');
      expect(d.message).toContain('bokeh is 3.9.2');
    }
    expect(decideBokehJS('unknown', '3.9.2').action).toBe('conflict');
  });

  it('parses versions and builds hashed URLs', () => {
    expect(majorMinor('3.10.0rc1')).toBe('3.10');
    expect(majorMinor('dev')).toBeNull();
    const urls = scriptUrls('/base/jupyter-vram/bokehjs', {
      version: '3.9.2',
      files: [{ name: 'bokeh.min.js', hash: 'abc' }]
    });
    expect(urls).toEqual(['/base/jupyter-vram/bokehjs/bokeh.min.js?v=abc']);
  });
});

describe('which view an output gets', () => {
  const live = { widget: true, trusted: true, kernel: 'connected' as const };
  it('shows the app only when the kernel holds its model', () => {
    expect(chooseView({ ...live, modelInKernel: true })).toBe('widget');
    expect(chooseView({ ...live, modelInKernel: false })).toBe('saved');
    expect(chooseView({ ...live, modelInKernel: null })).toBe('ask-kernel');
  });
  it('draws the saved profile without a kernel, a widget reference or trust', () => {
    expect(chooseView({ ...live, kernel: 'none', modelInKernel: true })).toBe('saved');
    expect(chooseView({ ...live, widget: false, modelInKernel: true })).toBe('saved');
    expect(chooseView({ ...live, trusted: false, modelInKernel: true })).toBe('saved');
  });
});

describe('saved payload checks', () => {
  const good = () => ({
    version: 1,
    categories: ['parameter', 'activation'],
    colors: ['#111', '#222'],
    breakdown: [10, 20],
    peak_bytes: 30,
    flame: { name: ['all', 'a'], parent: [-1, 0], bytes: [30, 30], category: [0, 1] },
    timeline: { axis: 'time', x: [0, 1], total: [0, 30], by_category: {} }
  });
  it('accepts a well-formed payload', () => {
    expect(checkPayload(good()).ok).toBe(true);
  });
  it('says what is wrong otherwise', () => {
    const newer = { ...good(), version: 2 };
    const r1 = checkPayload(newer);
    expect(r1.ok).toBe(false);
    expect(!r1.ok && r1.reason).toContain('version 2');
    const loop = good();
    loop.flame.parent = [-1, 1];
    const r2 = checkPayload(loop);
    expect(!r2.ok && r2.reason).toBe('flame node 1 has parent 1');
    const cat = good();
    cat.flame.category = [0, 2];
    expect(checkPayload(cat).ok).toBe(false);
    expect(checkPayload({ ...good(), breakdown: [1] }).ok).toBe(false);
    expect(checkPayload(null).ok).toBe(false);
  });
});

describe('status bar reading', () => {
  it('parses the kernel expression result', () => {
    expect(parseMemory('None')).toEqual({ kind: 'no-torch' });
    expect(parseMemory(undefined)).toEqual({ kind: 'no-torch' });
    expect(parseMemory(`'{"cuda": false}'`)).toEqual({ kind: 'no-cuda' });
    const gib = 1024 ** 3;
    const text = `'{"cuda": true, "device": 1, "name": "H200", "allocated": ${3 * gib}, "reserved": ${4 * gib}, "free_total": [${10 * gib}, ${80 * gib}]}'`;
    const state = parseMemory(text);
    expect(state).toEqual({
      kind: 'reading',
      reading: { device: 1, name: 'H200', allocated: 3 * gib, reserved: 4 * gib, used: 70 * gib, total: 80 * gib }
    });
    if (state.kind === 'reading') {
      expect(formatMemory(state.reading)).toBe(
        'GPU 1: 3.0 GiB alloc \u00b7 4.0 GiB reserved \u00b7 70.0 GiB / 80.0 GiB used'
      );
    }
    expect(parseMemory(`'{"cuda": true}'`)).toEqual({ kind: 'no-torch' });
    expect(parseMemory('garbage')).toEqual({ kind: 'no-torch' });
  });
});

describe('Profile cell memory', () => {
  it('adds %%vram once', () => {
    expect(vramCellCode('step()')).toBe('%%vram\nstep()');
    expect(vramCellCode('%%vram --amp bf16\nstep()')).toBe('%%vram --amp bf16\nstep()');
    expect(vramCellCode('\n%%vram\nstep()')).toBe('\n%%vram\nstep()');
    expect(vramCellCode('%%vramx\nstep()')).toBe('%%vram\n%%vramx\nstep()');
  });
});

describe('status bar while the kernel is busy', () => {
  const gib = 1024 ** 3;
  const reading = { device: 0, name: 'H200', allocated: 3 * gib, reserved: 4 * gib, used: 70 * gib, total: 80 * gib };
  const live = [
    { index: 0, name: 'H200', used: 71 * gib, total: 80 * gib, kernel_used: 12 * gib },
    { index: 1, name: 'H200', used: 2 * gib, total: 80 * gib, kernel_used: gib / 2 }
  ];
  it('picks the device where the kernel holds the most', () => {
    expect(pickLiveDevice(live)).toBe(live[0]);
    expect(pickLiveDevice([])).toBeNull();
    expect(pickLiveDevice(undefined)).toBeNull();
  });
  it('keeps the idle reading and adds what NVML sees now', () => {
    expect(statusText(reading, false, null)).toBe(
      'GPU 0: 3.0 GiB alloc \u00b7 4.0 GiB reserved \u00b7 70.0 GiB / 80.0 GiB used'
    );
    expect(statusText(reading, true, null)).toBe(
      'GPU 0: 3.0 GiB alloc \u00b7 4.0 GiB reserved \u00b7 70.0 GiB / 80.0 GiB used (busy)'
    );
    expect(statusText(null, true, live[0])).toBe(
      'now: kernel 12.0 GiB \u00b7 71.0 GiB / 80.0 GiB used on H200 (busy)'
    );
    expect(statusText(null, false, live[0])).toBe('');
    expect(statusText(null, false, null)).toBe('');
  });
});

describe('a live app whose kernel goes', () => {
  it('is gone when the kernel dies, shuts down or restarts, not while it works', () => {
    for (const status of ['dead', 'terminating', 'restarting', 'autorestarting']) {
      expect(kernelGone(status)).toBe(true);
    }
    for (const status of ['idle', 'busy', 'starting', 'unknown']) {
      expect(kernelGone(status)).toBe(false);
    }
    expect(KERNEL_GONE.startsWith('Kernel gone \u2014 showing the saved profile')).toBe(true);
  });
});

describe('saved views first: the live app on request', () => {
  it('takes only the kernel-made key into the code it sends', () => {
    const key = '0123456789abcdef0123456789abcdef';
    expect(liveKey(key)).toBe(key);
    expect(liveKey(key.toUpperCase())).toBeNull();
    expect(liveKey(key.slice(1))).toBeNull();
    expect(liveKey(`${key}'); import os; ('`)).toBeNull();
    expect(liveKey("x'); __import__('os').system('id'); ('")).toBeNull();
    expect(liveKey(undefined)).toBeNull();
    expect(liveKey(12)).toBeNull();
    expect(openLiveExpression(key)).toBe(
      "(lambda m: 'gone' if m is None else m.open_live('0123456789abcdef0123456789abcdef'))" +
        "(__import__('sys').modules.get('jupyter_vram._app.first_view'))"
    );
  });

  it('reads the kernel\u2019s answer', () => {
    const app = {
      'application/vnd.jupyter.widget-view+json': { model_id: 'abc', version_major: 2 },
      'text/plain': '<ProfileApp: ...>'
    };
    expect(openOutcome(app)).toBe('opened');
    expect(openOutcome({ 'text/plain': "'gone'" })).toBe('gone');
    expect(openOutcome({ 'text/plain': 'None' })).toBe('unknown');
    expect(openOutcome({ 'application/vnd.jupyter.widget-view+json': 'x' })).toBe('unknown');
    expect(openOutcome(undefined)).toBe('unknown');
    expect(openOutcome("'gone'")).toBe('unknown');
  });

  it('asks the kernel through sys.modules only', () => {
    expect(FRONTEND_EXPRESSION).toContain("__import__('sys').modules.get('jupyter_vram._session')");
    expect(FRONTEND_EXPRESSION).not.toMatch(/import jupyter_vram|__import__\('jupyter_vram/);
  });
});
