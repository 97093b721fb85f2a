import { defineConfig } from 'vitest/config';

// Unit tests of the pure modules (layout, formatting, decisions); no browser, no JupyterLab.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    environment: 'node'
  }
});
