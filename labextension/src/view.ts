/**
 * The saved profile drawn in the browser from its JSON payload alone: header, category
 * breakdown, flame graph (hover for details, click to zoom), timeline (hover for the level) and
 * the top modules. Plain DOM and SVG: no BokehJS, no kernel, safe in untrusted notebooks (all
 * text goes in through textContent / attributes, never as HTML).
 */
import { layoutDepth, layoutFlame, nodeLabel, pathOf } from './flame';
import { formatBytes, formatShare, formatX } from './format';
import type { IProfilePayload, ITopSite } from './payload';

const SVG_NS = 'http://www.w3.org/2000/svg';
const ROW_PX = 18;
const SEP = ' \u203a ';
const TIMELINE_W = 1000;
const TIMELINE_H = 160;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (className) {
    e.className = className;
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  return e;
}

/** Build the whole view; `note` (e.g. why the widget is not shown) goes under the header. */
export function renderProfile(p: IProfilePayload, note: string | null): HTMLElement {
  const root = el('div', 'jp-VramProfile');
  const header = el('div', 'jp-VramProfile-header');
  header.appendChild(el('div', 'jp-VramProfile-title', p.title));
  const facts = el('div', 'jp-VramProfile-facts');
  for (const [label, value] of p.facts ?? []) {
    const fact = el('span', 'jp-VramProfile-fact');
    fact.appendChild(el('span', 'jp-VramProfile-factLabel', `${label} `));
    fact.appendChild(el('b', '', value));
    facts.appendChild(fact);
  }
  header.appendChild(facts);
  if (p.error) {
    header.appendChild(el('div', 'jp-VramProfile-error', `the cell raised ${p.error}`));
  }
  if (p.estimate?.summary) {
    header.appendChild(el('pre', 'jp-VramProfile-estimate', p.estimate.summary));
  }
  for (const warning of stringsOf(p.warnings)) {
    header.appendChild(el('div', 'jp-VramProfile-warning', warning));
  }
  root.appendChild(header);
  if (note) {
    root.appendChild(el('div', 'jp-VramProfile-note', note));
  }
  root.appendChild(section('At the peak, by category', breakdown(p)));
  root.appendChild(section('Flame graph: live at the peak, module \u203a op', flameGraph(p)));
  root.appendChild(section('Timeline: live bytes by category', timeline(p)));
  if (p.top_modules?.length) {
    root.appendChild(section('Top modules (own bytes at the peak)', topModules(p)));
  }
  const sites = (Array.isArray(p.top_sites) ? p.top_sites : [])
    .filter(s => typeof s?.live_at_peak_bytes === 'number' && s.live_at_peak_bytes > 0)
    .slice(0, TOP_SITES);
  if (sites.length) {
    root.appendChild(section('Top allocation sites (live at the peak)', topSites(p, sites)));
  }
  return root;
}

function section(title: string, body: HTMLElement): HTMLElement {
  const s = el('div', 'jp-VramProfile-section');
  s.appendChild(el('div', 'jp-VramProfile-sectionTitle', title));
  s.appendChild(body);
  return s;
}

function breakdown(p: IProfilePayload): HTMLElement {
  const box = el('div', 'jp-VramProfile-breakdown');
  const bar = el('div', 'jp-VramProfile-bar');
  const legend = el('div', 'jp-VramProfile-legend');
  const total = p.breakdown.reduce((a, b) => a + b, 0);
  p.categories.forEach((cat, i) => {
    const bytes = p.breakdown[i];
    if (bytes <= 0) {
      return;
    }
    const part = el('div', 'jp-VramProfile-barPart');
    part.style.width = `${(100 * bytes) / total}%`;
    part.style.background = p.colors[i];
    part.title = `${cat}: ${formatBytes(bytes)} (${formatShare(bytes, total)})`;
    part.dataset.category = cat;
    bar.appendChild(part);
    const item = el('span', 'jp-VramProfile-legendItem');
    const swatch = el('span', 'jp-VramProfile-swatch');
    swatch.style.background = p.colors[i];
    item.appendChild(swatch);
    item.appendChild(
      document.createTextNode(`${cat} ${formatBytes(bytes)} (${formatShare(bytes, total)})`)
    );
    legend.appendChild(item);
  });
  box.appendChild(bar);
  box.appendChild(legend);
  return box;
}

function flameGraph(p: IProfilePayload): HTMLElement {
  const f = p.flame;
  const box = el('div', 'jp-VramProfile-flame');
  const crumbs = el('div', 'jp-VramProfile-crumbs');
  const canvas = el('div', 'jp-VramProfile-flameCanvas');
  const tip = el('div', 'jp-VramProfile-tooltip');
  tip.hidden = true;
  box.append(crumbs, canvas, tip);
  if (f.dropped > 0) {
    box.appendChild(
      el(
        'div',
        'jp-VramProfile-small',
        `${f.dropped} nodes under ${formatBytes(f.min_bytes)} are not saved (their bytes stay in their parents)`
      )
    );
  }
  const peak = f.bytes[0] ?? 0;

  const draw = (root: number): void => {
    canvas.replaceChildren();
    crumbs.replaceChildren();
    box.dataset.zoom = root === 0 ? '' : pathOf(f, root).join(SEP);
    const trail = [0, ...ancestors(root)];
    trail.forEach((node, i) => {
      const c = el('button', 'jp-VramProfile-crumb', nodeLabel(f, node));
      c.disabled = i === trail.length - 1;
      c.onclick = () => draw(node);
      crumbs.appendChild(c);
      if (i < trail.length - 1) {
        crumbs.appendChild(document.createTextNode(SEP));
      }
    });
    const rects = layoutFlame(f, root);
    canvas.style.height = `${Math.max(1, layoutDepth(rects)) * ROW_PX}px`;
    for (const r of rects) {
      const block = el('div', 'jp-VramProfile-block', nodeLabel(f, r.index));
      block.style.left = `${100 * r.x}%`;
      block.style.width = `${100 * r.width}%`;
      block.style.top = `${r.depth * ROW_PX}px`;
      block.style.background = p.colors[f.category[r.index]];
      block.dataset.path = r.index === 0 ? 'all' : pathOf(f, r.index).join(SEP);
      block.onmouseenter = ev => {
        tip.replaceChildren(...tooltipRows(p, r.index, peak));
        tip.hidden = false;
        place(tip, box, ev);
      };
      block.onmousemove = ev => place(tip, box, ev);
      block.onmouseleave = () => {
        tip.hidden = true;
      };
      block.onclick = () => draw(r.index === root ? f.parent[root] : r.index);
      canvas.appendChild(block);
    }
  };
  const ancestors = (i: number): number[] => {
    const out: number[] = [];
    for (let n = i; n > 0; n = f.parent[n]) {
      out.push(n);
    }
    return out.reverse();
  };
  if (f.name.length === 0 || !(peak > 0)) {
    canvas.appendChild(el('div', 'jp-VramProfile-small', 'nothing was live at the peak'));
  } else {
    draw(0);
  }
  return box;
}

function tooltipRows(p: IProfilePayload, i: number, peak: number): HTMLElement[] {
  const f = p.flame;
  const rows = [
    el('div', 'jp-VramProfile-tipPath', i === 0 ? 'all' : pathOf(f, i).join(SEP)),
    ...(f.type?.[i] ? [el('div', 'jp-VramProfile-tipType', f.type[i])] : []),
    el('div', 'jp-VramProfile-tipBytes', `${formatBytes(f.bytes[i])} (${formatShare(f.bytes[i], peak)} of the peak)`)
  ];
  if (f.count?.[i] !== undefined) {
    rows.push(el('div', '', `${f.count[i]} allocations`));
  }
  for (const [cat, bytes] of f.mix?.[i] ?? []) {
    rows.push(el('div', 'jp-VramProfile-tipCat', `${p.categories[cat]}: ${formatBytes(bytes)}`));
  }
  rows.push(el('div', 'jp-VramProfile-small', 'click: zoom in (click the top block to zoom out)'));
  return rows;
}

function place(tip: HTMLElement, box: HTMLElement, ev: MouseEvent): void {
  const b = box.getBoundingClientRect();
  tip.style.left = `${Math.min(ev.clientX - b.left + 12, Math.max(0, b.width - 260))}px`;
  tip.style.top = `${ev.clientY - b.top + 14}px`;
}

/** Stacked step areas per category over the saved buckets, with a hover read-out. */
function timeline(p: IProfilePayload): HTMLElement {
  const t = p.timeline;
  const box = el('div', 'jp-VramProfile-timeline');
  const n = t.x.length;
  if (n === 0) {
    box.appendChild(el('div', 'jp-VramProfile-small', 'no events'));
    return box;
  }
  const x0 = t.x[0];
  const span = Math.max(t.x[n - 1] - x0, 1e-9);
  const top = Math.max(...t.total, ...(t.reserved ?? []), 1);
  const X = (v: number): number => ((v - x0) / span) * TIMELINE_W;
  const Y = (v: number): number => TIMELINE_H - (v / top) * TIMELINE_H;
  const chart = svg('svg', {
    viewBox: `0 0 ${TIMELINE_W} ${TIMELINE_H}`,
    preserveAspectRatio: 'none',
    class: 'jp-VramProfile-timelineChart'
  });
  const cum = new Array<number>(n).fill(0);
  p.categories.forEach((cat, ci) => {
    const values = t.by_category?.[cat];
    if (!values || values.length !== n) {
      return;
    }
    const lower = cum.slice();
    for (let i = 0; i < n; i++) {
      cum[i] += values[i];
    }
    chart.appendChild(
      svg('path', { d: stepArea(t.x, lower, cum, X, Y), fill: p.colors[ci], 'data-category': cat })
    );
  });
  if (t.reserved && t.reserved.length === n) {
    chart.appendChild(
      svg('path', {
        d: stepLine(t.x, t.reserved, X, Y),
        fill: 'none',
        class: 'jp-VramProfile-reserved',
        'vector-effect': 'non-scaling-stroke'
      })
    );
  }
  const cursor = svg('line', {
    x1: 0, x2: 0, y1: 0, y2: TIMELINE_H, class: 'jp-VramProfile-cursor',
    'vector-effect': 'non-scaling-stroke', visibility: 'hidden'
  });
  chart.appendChild(cursor);
  const readout = el('div', 'jp-VramProfile-readout', `peak ${formatBytes(p.peak_bytes)}`);
  chart.addEventListener('mousemove', ev => {
    const r = chart.getBoundingClientRect();
    const xv = x0 + ((ev.clientX - r.left) / Math.max(r.width, 1)) * span;
    const i = Math.max(0, upperBound(t.x, xv) - 1);
    cursor.setAttribute('x1', String(X(t.x[i])));
    cursor.setAttribute('x2', String(X(t.x[i])));
    cursor.setAttribute('visibility', 'visible');
    const parts = p.categories
      .filter(c => (t.by_category?.[c]?.[i] ?? 0) > 0)
      .map(c => `${c} ${formatBytes(t.by_category[c][i])}`);
    readout.textContent =
      `${formatX(t.x[i], t.axis)}: ${formatBytes(t.total[i])} live` +
      (t.reserved ? `, ${formatBytes(t.reserved[i])} reserved` : '') +
      (parts.length ? ` (${parts.join(', ')})` : '');
  });
  chart.addEventListener('mouseleave', () => {
    cursor.setAttribute('visibility', 'hidden');
    readout.textContent = `peak ${formatBytes(p.peak_bytes)}`;
  });
  const axis = el('div', 'jp-VramProfile-axis');
  axis.append(el('span', '', formatX(x0, t.axis)), el('span', '', formatX(t.x[n - 1], t.axis)));
  box.append(chart, axis, timelineLegend(p, top), readout);
  return box;
}

/** The categories the timeline draws (any ever live, not only those at the peak), and its
 * scale: what the chart's top edge stands for. */
function timelineLegend(p: IProfilePayload, top: number): HTMLElement {
  const legend = el('div', 'jp-VramProfile-legend jp-VramProfile-timelineLegend');
  p.categories.forEach((cat, i) => {
    const values = p.timeline.by_category?.[cat];
    if (!Array.isArray(values) || !values.some(v => v > 0)) {
      return;
    }
    const item = el('span', 'jp-VramProfile-legendItem');
    const swatch = el('span', 'jp-VramProfile-swatch');
    swatch.style.background = p.colors[i];
    item.append(swatch, document.createTextNode(cat));
    legend.appendChild(item);
  });
  legend.appendChild(el('span', 'jp-VramProfile-small', `top of the chart: ${formatBytes(top)}`));
  return legend;
}

/** Index of the first x greater than v (x sorted ascending). */
function upperBound(xs: readonly number[], v: number): number {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

function stepLine(
  xs: readonly number[], ys: readonly number[],
  X: (v: number) => number, Y: (v: number) => number
): string {
  const d: string[] = [];
  xs.forEach((x, i) => {
    const next = i + 1 < xs.length ? xs[i + 1] : x;
    d.push(`${i === 0 ? 'M' : 'L'}${X(x)},${Y(ys[i])}`, `L${X(next)},${Y(ys[i])}`);
  });
  return d.join('');
}

function stepArea(
  xs: readonly number[], lower: readonly number[], upper: readonly number[],
  X: (v: number) => number, Y: (v: number) => number
): string {
  const top = stepLine(xs, upper, X, Y);
  const back: string[] = [];
  for (let i = xs.length - 1; i >= 0; i--) {
    const next = i + 1 < xs.length ? xs[i + 1] : xs[i];
    back.push(`L${X(next)},${Y(lower[i])}`, `L${X(xs[i])},${Y(lower[i])}`);
  }
  return `${top}${back.join('')}Z`;
}

function topModules(p: IProfilePayload): HTMLElement {
  const table = el('table', 'jp-VramProfile-table');
  const head = el('tr', '');
  for (const h of ['module', 'bytes', 'share of peak', 'allocations', 'category']) {
    head.appendChild(el('th', '', h));
  }
  table.appendChild(head);
  for (const m of p.top_modules) {
    const row = el('tr', '');
    row.append(
      el('td', '', m.name),
      el('td', 'jp-VramProfile-num', formatBytes(m.bytes)),
      el('td', 'jp-VramProfile-num', formatShare(m.bytes, p.peak_bytes)),
      el('td', 'jp-VramProfile-num', String(m.count)),
      el('td', '', m.category)
    );
    table.appendChild(row);
  }
  return table;
}

/** Sites listed in the saved view (the live app sorts and exports all of them). */
const TOP_SITES = 10;

function topSites(p: IProfilePayload, sites: ITopSite[]): HTMLElement {
  const table = el('table', 'jp-VramProfile-table jp-VramProfile-sites');
  const head = el('tr', '');
  for (const h of ['bytes', 'share of peak', 'op', 'site', 'category']) {
    head.appendChild(el('th', '', h));
  }
  table.appendChild(head);
  for (const s of sites) {
    const row = el('tr', '');
    const site = el('td', '', s.site);
    site.title = s.stack;
    row.append(
      el('td', 'jp-VramProfile-num', formatBytes(s.live_at_peak_bytes)),
      el('td', 'jp-VramProfile-num', formatShare(s.live_at_peak_bytes, p.peak_bytes)),
      el('td', '', s.op),
      site,
      el('td', '', s.category)
    );
    table.appendChild(row);
  }
  return table;
}

function stringsOf(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];
}
