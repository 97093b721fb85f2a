/**
 * Number formatting shared by the saved-profile view and the status bar. Same rules as the
 * Python side's `format_bytes`, so a saved profile reads the same in the browser as in the
 * kernel's text report.
 */

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Human-readable binary size: 1536 -> "1.5 KiB", 512 -> "512 B". */
export function formatBytes(n: number): string {
  const sign = n < 0 ? '-' : '';
  let v = Math.abs(n);
  for (const unit of UNITS) {
    if (v < 1024 || unit === 'TiB') {
      return unit === 'B' ? `${sign}${Math.round(v)} ${unit}` : `${sign}${v.toFixed(1)} ${unit}`;
    }
    v /= 1024;
  }
  throw new Error('unreachable');
}

/** Share of a whole as "12.3 %" ("-" when the whole is 0). */
export function formatShare(part: number, whole: number): string {
  return whole > 0 ? `${((100 * part) / whole).toFixed(1)} %` : '-';
}

/** A timeline position: milliseconds ("12.5 ms", "3.20 s") or an event number ("event 42"). */
export function formatX(x: number, axis: 'time' | 'event'): string {
  if (axis === 'event') {
    return `event ${Math.round(x)}`;
  }
  return x < 1000 ? `${x.toFixed(1)} ms` : `${(x / 1000).toFixed(2)} s`;
}
