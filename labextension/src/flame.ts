/**
 * The flame graph's geometry, from the saved profile: pure, no DOM, so it is unit tested. The
 * Python side lays the tree out once (`icicle_layout`) and saves every node's rectangle; a view
 * zoomed into a node rescales the saved rectangles of that node's subtree. x and width are
 * fractions of the view (0..1); depth counts from the zoomed node (0), which spans the width.
 */
import type { IFlameColumns } from './payload';

/** The saved layout's x and width are in millionths of the root's width. */
export const LAYOUT_UNITS = 1_000_000;

export interface IFlameRect {
  /** Index of the node in the payload's columns. */
  index: number;
  /** Left edge as a fraction of the view (0..1). */
  x: number;
  /** Width as a fraction of the view. */
  width: number;
  /** Row below the zoomed node (0 = the zoomed node itself). */
  depth: number;
}

/** Children of each node, in payload order (largest first, as the Python side writes them). */
export function childrenOf(flame: IFlameColumns): number[][] {
  const children: number[][] = flame.name.map(() => []);
  for (let i = 1; i < flame.parent.length; i++) {
    children[flame.parent[i]].push(i);
  }
  return children;
}

/** Names from the root's child down to `index` (the root "all" is left out). */
export function pathOf(flame: IFlameColumns, index: number): string[] {
  const names: string[] = [];
  for (let i = index; i > 0; i = flame.parent[i]) {
    names.push(flame.name[i]);
  }
  return names.reverse();
}

function hasColumn(column: unknown, length: number): column is number[] {
  return (
    Array.isArray(column) &&
    column.length === length &&
    column.every(v => typeof v === 'number' && Number.isFinite(v))
  );
}

/**
 * Every node's rectangle with the root spanning the view: the saved layout, or, for a profile
 * saved before the layout was, the same layout made here from the parent and bytes columns
 * (children side by side inside their parent, in payload order, as wide as their bytes).
 */
export function rootLayout(flame: IFlameColumns, useSaved = true): IFlameRect[] {
  const n = flame.name.length;
  if (useSaved && hasColumn(flame.x, n) && hasColumn(flame.width, n) && hasColumn(flame.depth, n)) {
    const { x, width, depth } = flame;
    return flame.name.map((_, index) => ({
      index,
      x: x[index] / LAYOUT_UNITS,
      width: width[index] / LAYOUT_UNITS,
      depth: depth[index]
    }));
  }
  const total = n > 0 && flame.bytes[0] > 0 ? flame.bytes[0] : 1;
  const rects: IFlameRect[] = [];
  const nextLeft: number[] = [];
  for (let index = 0; index < n; index++) {
    const parent = flame.parent[index];
    const rect =
      index === 0
        ? { index, x: 0, width: 1, depth: 0 }
        : {
            index,
            x: nextLeft[parent],
            width: flame.bytes[index] / total,
            depth: rects[parent].depth + 1
          };
    if (index > 0) {
      nextLeft[parent] += rect.width;
    }
    nextLeft.push(rect.x);
    rects.push(rect);
  }
  return rects;
}

/**
 * Rectangles of `root` and everything below it, `root` spanning the view: the saved layout of
 * its subtree, rescaled. Nodes narrower than `minWidth` of the view are left out (with their
 * subtrees, which are narrower still): they would be under a pixel wide.
 */
export function layoutFlame(flame: IFlameColumns, root = 0, minWidth = 0.001): IFlameRect[] {
  if (!(flame.bytes[root] > 0)) {
    return [];
  }
  let saved = rootLayout(flame);
  if (!(saved[root].width > 0)) {
    saved = rootLayout(flame, false); // saved as 0 millionths wide: too narrow to rescale
  }
  const { x: left, width: scale, depth: top } = saved[root];
  // a parent comes before its children: one pass marks the subtree
  const inside = flame.name.map((_, i) => i === root);
  const rects: IFlameRect[] = [];
  for (let i = root; i < saved.length; i++) {
    inside[i] = i === root || (i > root && inside[flame.parent[i]]);
    const width = saved[i].width / scale;
    if (inside[i] && (i === root || width >= minWidth)) {
      rects.push({
        index: i,
        x: (saved[i].x - left) / scale,
        width: i === root ? 1 : width,
        depth: saved[i].depth - top
      });
    }
  }
  return rects.sort((a, b) => a.depth - b.depth || a.x - b.x);
}

/** Deepest row of a layout, plus one: how many rows it needs. */
export function layoutDepth(rects: readonly IFlameRect[]): number {
  return rects.reduce((d, r) => Math.max(d, r.depth + 1), 0);
}

/** What a block shows: the name, with a module's class after it ("0: Linear"). */
export function nodeLabel(flame: IFlameColumns, index: number): string {
  const name = index === 0 ? 'all' : flame.name[index];
  const kind = flame.type?.[index];
  return kind && kind !== name ? `${name}: ${kind}` : name;
}
