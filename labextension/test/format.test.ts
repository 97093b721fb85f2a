import { describe, expect, it } from 'vitest';

import { formatBytes, formatShare, formatX } from '../src/format';

describe('formatBytes', () => {
  it('keeps bytes whole and uses one decimal above', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1023)).toBe('1023 B');
    expect(formatBytes(1024)).toBe('1.0 KiB');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(3 * 1024 ** 3)).toBe('3.0 GiB');
    expect(formatBytes(5 * 1024 ** 5)).toBe('5120.0 TiB');
    expect(formatBytes(-2 * 1024 ** 2)).toBe('-2.0 MiB');
  });
});

describe('formatShare / formatX', () => {
  it('formats shares and axis positions', () => {
    expect(formatShare(1, 8)).toBe('12.5 %');
    expect(formatShare(1, 0)).toBe('-');
    expect(formatX(12.25, 'time')).toBe('12.3 ms');
    expect(formatX(3200, 'time')).toBe('3.20 s');
    expect(formatX(41.6, 'event')).toBe('event 42');
  });
});
