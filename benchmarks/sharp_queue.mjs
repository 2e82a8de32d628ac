// The original worker's core alone, for benchmarks/delivery.py: sharp rendering a batch of photos
// with two pipelines each (as benchmarks/sharp_render.mjs two-pipelines), two jobs at a time
// (BullMQ's concurrency 2), in one warm Node.js process.
//
//   node sharp_queue.mjs <concurrency> <photo>...
//
// The photos are read into memory first (the worker's S3 download is not counted), then the batch
// is rendered once to warm up and once timed. sharp is resolved from SHARP_PATH, its cache off,
// libvips' threads as sharp sets them (one per core). Prints one JSON line: seconds (the timed
// batch, wall) and bytes (every variant).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const sharp = require(process.env.SHARP_PATH);
sharp.cache(false);

const [concurrency, ...photos] = process.argv.slice(2);
const inputs = photos.map((photo) => readFileSync(photo));
const fit = (size) => ({ width: size, height: size, fit: "inside", withoutEnlargement: true });
const webp = { quality: 80, effort: 4 };

async function twoPipelines(input) {
  const thumb = await sharp(input).rotate().resize(fit(400)).webp(webp).toBuffer();
  const browse = await sharp(input).rotate().resize(fit(2048)).webp(webp).toBuffer();
  return thumb.length + browse.length;
}

async function batch() {
  const queue = [...inputs];
  let bytes = 0;
  const worker = async () => {
    for (let input = queue.shift(); input; input = queue.shift()) {
      bytes += await twoPipelines(input);
    }
  };
  await Promise.all(Array.from({ length: Number(concurrency) }, worker));
  return bytes;
}

await batch();
const started = process.hrtime.bigint();
const bytes = await batch();
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.log(JSON.stringify({ seconds, bytes }));
