import { describe, expect, it } from 'vitest';

import {
  childrenOf,
  layoutDepth,
  layoutFlame,
  nodeLabel,
  pathOf,
  rootLayout
} from '../src/flame';
import type { IFlameColumns } from '../src/payload';

// all (100) -> encoder (60) -> [attn (40) -> addmm (40)], [mlp (20)]; head (30); tiny (0.05)
function tree(): IFlameColumns {
  return {
    hierarchy: 'module',
    min_bytes: 1,
    dropped: 0,
    name: ['all', 'encoder', 'attn', 'addmm', 'mlp', 'head', 'tiny'],
    parent: [-1, 0, 1, 2, 1, 0, 0],
    bytes: [100000, 60000, 40000, 40000, 20000, 30000, 5],
    count: [9, 5, 3, 3, 2, 3, 1],
    category: [0, 0, 1, 1, 2, 3, 0],
    mix: [[], [], [], [], [], [], []]
  };
}

// The same tree with its layout saved (millionths of the root): all 0..1; encoder 0..0.6 with
// attn 0..0.4 (addmm below it) and mlp 0.4..0.6; head 0.6..0.9; tiny 0.9..0.90005
function savedTree(): IFlameColumns {
  return {
    ...tree(),
    x: [0, 0, 0, 0, 400000, 600000, 900000],
    width: [1000000, 600000, 400000, 400000, 200000, 300000, 50],
    depth: [0, 1, 2, 3, 2, 1, 1]
  };
}

describe('flame layout', () => {
  it('lays children left to right inside their parent, widths by bytes', () => {
    const rects = layoutFlame(tree());
    const byName = Object.fromEntries(rects.map(r => [tree().name[r.index], r]));
    expect(byName.all).toEqual({ index: 0, x: 0, width: 1, depth: 0 });
    expect(byName.encoder).toEqual({ index: 1, x: 0, width: 0.6, depth: 1 });
    expect(byName.head.x).toBeCloseTo(0.6, 12);
    expect(byName.head.width).toBeCloseTo(0.3, 12);
    expect(byName.attn).toEqual({ index: 2, x: 0, width: 0.4, depth: 2 });
    expect(byName.mlp.x).toBeCloseTo(0.4, 12);
    expect(byName.addmm.depth).toBe(3);
    // 5 bytes of 100000 is narrower than the 0.1 % cut-off: not drawn
    expect(byName.tiny).toBeUndefined();
    expect(layoutDepth(rects)).toBe(4);
  });

  it('zooms: the chosen node spans the view and its ancestors are gone', () => {
    const rects = layoutFlame(tree(), 1);
    const names = rects.map(r => tree().name[r.index]);
    expect(names).toEqual(['encoder', 'attn', 'mlp', 'addmm']);
    const mlp = rects.find(r => r.index === 4)!;
    expect(mlp.x).toBeCloseTo(40000 / 60000, 12);
    expect(mlp.width).toBeCloseTo(20000 / 60000, 12);
    expect(mlp.depth).toBe(1);
  });

  it('names paths and children', () => {
    expect(pathOf(tree(), 3)).toEqual(['encoder', 'attn', 'addmm']);
    expect(pathOf(tree(), 0)).toEqual([]);
    expect(childrenOf(tree())[0]).toEqual([1, 5, 6]);
  });

  it('draws nothing for an empty peak', () => {
    const t = tree();
    t.bytes = t.bytes.map(() => 0);
    expect(layoutFlame(t)).toEqual([]);
  });
});

describe('saved flame layout', () => {
  it('draws the saved rectangles', () => {
    const t = savedTree();
    // a layout that is not the bytes' (head moved right, attn on a row of its own): drawn as saved
    t.x[5] = 650000;
    t.depth[2] = 4;
    const byName = Object.fromEntries(layoutFlame(t).map(r => [t.name[r.index], r]));
    expect(byName.head.x).toBeCloseTo(0.65, 12);
    expect(byName.attn.depth).toBe(4);
    expect(byName.tiny).toBeUndefined(); // 50 millionths: under the 0.1 % cut-off
  });

  it('zooms by rescaling the saved subtree', () => {
    const rects = layoutFlame(savedTree(), 1);
    expect(rects.map(r => tree().name[r.index])).toEqual(['encoder', 'attn', 'mlp', 'addmm']);
    const mlp = rects.find(r => r.index === 4)!;
    expect(mlp.x).toBeCloseTo(0.4 / 0.6, 12);
    expect(mlp.width).toBeCloseTo(0.2 / 0.6, 12);
    expect(mlp.depth).toBe(1);
    const head = layoutFlame(savedTree(), 5);
    expect(head).toEqual([{ index: 5, x: 0, width: 1, depth: 0 }]);
  });

  it('lays out a profile saved without the layout as the Python side does', () => {
    const saved = rootLayout(savedTree());
    const computed = rootLayout(tree());
    expect(computed.map(r => r.depth)).toEqual(savedTree().depth);
    computed.forEach((r, i) => {
      expect(r.x).toBeCloseTo(saved[i].x, 12);
      expect(r.width).toBeCloseTo(saved[i].width, 12);
    });
    const broken = { ...savedTree(), x: [0, 0] }; // not one per node: not used
    expect(rootLayout(broken)[5].x).toBeCloseTo(0.6, 12);
  });

  it('zooms into a node saved as 0 wide from the bytes', () => {
    const t = savedTree();
    t.width[4] = 0; // mlp, rounded away in some hand-made payload
    const rects = layoutFlame(t, 4);
    expect(rects).toEqual([{ index: 4, x: 0, width: 1, depth: 0 }]);
  });
});

describe('block labels', () => {
  it('adds a module class when the payload has one', () => {
    const t = tree();
    expect(nodeLabel(t, 1)).toBe('encoder'); // no type column (older payloads)
    t.type = ['', 'Encoder', 'Attention', '', 'Mlp', 'head', ''];
    expect(nodeLabel(t, 0)).toBe('all');
    expect(nodeLabel(t, 1)).toBe('encoder: Encoder');
    expect(nodeLabel(t, 3)).toBe('addmm');
    expect(nodeLabel(t, 5)).toBe('head'); // same as the name: not repeated
  });
});
