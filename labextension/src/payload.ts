/**
 * The saved profile (`application/vnd.jupyter-vram.profile+json`, version 1): what the Python
 * side (`jupyter_vram/_render/mime.py`) stores in every `%%vram` / `%vram_estimate` output. The
 * schema lives in that module's docstring; readers ignore keys they do not know.
 */

export const PROFILE_MIME = 'application/vnd.jupyter-vram.profile+json';
export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/** The newest payload version this extension draws. */
export const SUPPORTED_VERSION = 1;

export interface IFlameColumns {
  hierarchy: string;
  min_bytes: number;
  dropped: number;
  name: string[];
  parent: number[];
  bytes: number[];
  count: number[];
  category: number[];
  mix: [number, number][][];
  /** A module node's class name ("Linear"), else "" (added within version 1; may be absent). */
  type?: string[];
  /**
   * The layout (Python's `icicle_layout`, added within version 1; may be absent): left edge and
   * width in millionths of the root's bytes, and the row below the root, per node.
   */
  x?: number[];
  width?: number[];
  depth?: number[];
}

export interface ITimeline {
  axis: 'time' | 'event';
  x: number[];
  total: number[];
  by_category: Record<string, number[]>;
  reserved?: number[];
}

export interface ITopModule {
  name: string;
  bytes: number;
  count: number;
  category: string;
}

export interface ITopSite {
  site: string;
  op: string;
  live_at_peak_bytes: number;
  allocated_bytes: number;
  allocations: number;
  largest_bytes: number;
  category: string;
  stack: string;
}

export interface IProfilePayload {
  version: number;
  kind: 'profile' | 'estimate';
  title: string;
  device: string;
  source: string;
  source_label: string;
  peak_bytes: number;
  baseline_bytes: number;
  reserved_bytes: number | null;
  device_total_bytes: number | null;
  device_used_bytes: number | null;
  duration_s: number;
  events: number;
  peak_phase: string;
  peak_x: number | null;
  error: string | null;
  facts: [string, string][];
  categories: string[];
  colors: string[];
  breakdown: number[];
  flame: IFlameColumns;
  timeline: ITimeline;
  top_modules: ITopModule[];
  top_sites: ITopSite[];
  estimate: { summary: string; model: string; input: string } | null;
  /** What the recorder left out or degraded (absent in older outputs). */
  warnings?: string[];
  /** The key the kernel opens this output's live app by (absent: built at once, or saved). */
  live?: string;
}

/** What `checkPayload` says about a saved output. */
export type PayloadCheck =
  | { ok: true; payload: IProfilePayload }
  | { ok: false; reason: string };

function isNumberArray(v: unknown, length?: number): v is number[] {
  return (
    Array.isArray(v) &&
    (length === undefined || v.length === length) &&
    v.every(x => typeof x === 'number' && Number.isFinite(x))
  );
}

/**
 * Whether `data` is a payload this extension can draw, and if not, why (shown to the user in
 * place of the profile). Checks what drawing relies on: the columns line up, every parent index
 * comes before its child, category indices are in range.
 */
export function checkPayload(data: unknown): PayloadCheck {
  if (typeof data !== 'object' || data === null) {
    return { ok: false, reason: 'the saved profile is not a JSON object' };
  }
  const p = data as Partial<IProfilePayload>;
  if (typeof p.version !== 'number') {
    return { ok: false, reason: 'the saved profile has no version' };
  }
  if (p.version > SUPPORTED_VERSION) {
    return {
      ok: false,
      reason:
        `the saved profile has version ${p.version}; this jupyter_vram lab extension draws ` +
        `version ${SUPPORTED_VERSION} (upgrade jupyter_vram where JupyterLab runs)`
    };
  }
  const categories = p.categories;
  if (!Array.isArray(categories) || !isNumberArray(p.breakdown, categories.length)) {
    return { ok: false, reason: 'the saved profile has no category breakdown' };
  }
  if (!Array.isArray(p.colors) || p.colors.length !== categories.length) {
    return { ok: false, reason: 'the saved profile has no category colours' };
  }
  if (typeof p.peak_bytes !== 'number') {
    return { ok: false, reason: 'the saved profile has no peak' };
  }
  const f = p.flame;
  if (
    !f ||
    !Array.isArray(f.name) ||
    !isNumberArray(f.parent, f.name.length) ||
    !isNumberArray(f.bytes, f.name.length) ||
    !isNumberArray(f.category, f.name.length)
  ) {
    return { ok: false, reason: 'the saved flame graph is malformed' };
  }
  for (let i = 0; i < f.name.length; i++) {
    const parent = f.parent[i];
    if ((i === 0 && parent !== -1) || (i > 0 && (parent < 0 || parent >= i))) {
      return { ok: false, reason: `flame node ${i} has parent ${parent}` };
    }
    if (f.category[i] < 0 || f.category[i] >= categories.length) {
      return { ok: false, reason: `flame node ${i} has category ${f.category[i]}` };
    }
  }
  const t = p.timeline;
  if (!t || !isNumberArray(t.x) || !isNumberArray(t.total, t.x.length)) {
    return { ok: false, reason: 'the saved timeline is malformed' };
  }
  return { ok: true, payload: p as IProfilePayload };
}
