/**
 * Flame-graph layout of the saved module -> op tree: pure geometry, no DOM, so it is unit
 * tested. x and width are fractions of the zoomed node's bytes (0..1); depth counts from the
 * zoomed node (0), which spans the whole width.
 */
import type { IFlameColumns } from './payload';

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

/**
 * Rectangles of `root` and everything below it, children laid left to right inside their
 * parent. Nodes narrower than `minWidth` of the view are left out (with their subtrees): they
 * would be under a pixel wide.
 */
export function layoutFlame(
  flame: IFlameColumns,
  root = 0,
  minWidth = 0.001
): IFlameRect[] {
  const children = childrenOf(flame);
  const total = flame.bytes[root];
  const rects: IFlameRect[] = [];
  if (!(total > 0)) {
    return rects;
  }
  const stack: IFlameRect[] = [{ index: root, x: 0, width: 1, depth: 0 }];
  while (stack.length > 0) {
    const rect = stack.pop()!;
    rects.push(rect);
    let x = rect.x;
    for (const child of children[rect.index]) {
      const width = flame.bytes[child] / total;
      if (width >= minWidth) {
        stack.push({ index: child, x, width, depth: rect.depth + 1 });
      }
      x += width;
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
