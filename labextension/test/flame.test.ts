import { describe, expect, it } from 'vitest';

import { childrenOf, layoutDepth, layoutFlame, nodeLabel, pathOf } from '../src/flame';
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
