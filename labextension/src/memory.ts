/**
 * The status bar's reading of the kernel's CUDA memory: the expression the kernel evaluates
 * and the parsing of its answer (pure, unit tested; status.ts does the asking).
 */
import { formatBytes } from './format';

/**
 * Python expression evaluated in the kernel: JSON of the current CUDA device's numbers, or
 * None. `torch.cuda.mem_get_info` is asked only for the current device, which exists once
 * CUDA is initialised.
 */
export const MEMORY_EXPRESSION =
  "(lambda t: None if t is None or not hasattr(t, 'cuda') else " +
  "__import__('json').dumps({'cuda': False}) if not t.cuda.is_initialized() else " +
  "(lambda d: __import__('json').dumps({'cuda': True, 'device': d, " +
  "'name': t.cuda.get_device_name(d), 'allocated': t.cuda.memory_allocated(d), " +
  "'reserved': t.cuda.memory_reserved(d), 'free_total': list(t.cuda.mem_get_info(d))}))" +
  "(t.cuda.current_device()))(__import__('sys').modules.get('torch'))";

export interface IMemoryReading {
  device: number;
  name: string;
  allocated: number;
  reserved: number;
  used: number;
  total: number;
}

/** What the kernel said: no torch, torch without CUDA in use, or a reading. */
export type MemoryState =
  | { kind: 'no-torch' }
  | { kind: 'no-cuda' }
  | { kind: 'reading'; reading: IMemoryReading };

/**
 * Parse the expression's `text/plain` result (the repr of a JSON string, or `None`). Anything
 * unexpected counts as "no torch" (the item hides rather than showing garbage).
 */
export function parseMemory(textPlain: string | undefined): MemoryState {
  if (textPlain === undefined || textPlain === 'None') {
    return { kind: 'no-torch' };
  }
  const m = /^'(.*)'$/s.exec(textPlain.trim());
  if (!m) {
    return { kind: 'no-torch' };
  }
  try {
    const data = JSON.parse(m[1]) as Record<string, unknown>;
    if (data.cuda !== true) {
      return { kind: 'no-cuda' };
    }
    const [free, total] = data.free_total as [number, number];
    const reading: IMemoryReading = {
      device: Number(data.device),
      name: String(data.name ?? ''),
      allocated: Number(data.allocated),
      reserved: Number(data.reserved),
      used: total - free,
      total
    };
    const numbers = [reading.allocated, reading.reserved, reading.used, reading.total];
    return numbers.every(Number.isFinite) ? { kind: 'reading', reading } : { kind: 'no-torch' };
  } catch {
    return { kind: 'no-torch' };
  }
}

/** The item's text: "GPU 0: 3.0 GiB alloc · 4.0 GiB reserved · 70.0 / 80.0 GiB used". */
export function formatMemory(r: IMemoryReading): string {
  return (
    `GPU ${r.device}: ${formatBytes(r.allocated)} alloc \u00b7 ` +
    `${formatBytes(r.reserved)} reserved \u00b7 ` +
    `${formatBytes(r.used)} / ${formatBytes(r.total)} used`
  );
}

/** One device of the server's `jupyter-vram/kernels/<id>/gpu` answer (NVML, from outside). */
export interface ILiveDevice {
  index: number;
  name: string;
  used: number;
  total: number;
  kernel_used: number;
}

/** The device where the kernel's processes hold the most, or null. */
export function pickLiveDevice(devices: readonly ILiveDevice[] | undefined): ILiveDevice | null {
  let best: ILiveDevice | null = null;
  for (const d of devices ?? []) {
    if (best === null || d.kernel_used > best.kernel_used) {
      best = d;
    }
  }
  return best;
}

/**
 * The item's text. `reading`: the kernel's own numbers from its last idle moment; `live`:
 * NVML's numbers while the kernel is busy (it cannot answer then), shown after them.
 */
export function statusText(
  reading: IMemoryReading | null,
  busy: boolean,
  live: ILiveDevice | null
): string {
  const parts: string[] = [];
  if (reading !== null) {
    parts.push(formatMemory(reading));
  }
  if (busy && live !== null) {
    parts.push(
      `now: kernel ${formatBytes(live.kernel_used)} \u00b7 ` +
        `${formatBytes(live.used)} / ${formatBytes(live.total)} used on ${live.name}`
    );
  }
  if (parts.length === 0) {
    return '';
  }
  return parts.join(' \u2014 ') + (busy ? ' (busy)' : '');
}
