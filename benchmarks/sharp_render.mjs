// One render of one photo with sharp, for benchmarks/compare.py (a fresh Node.js process each time).
//
//   node sharp_render.mjs <two-pipelines|decode-once> <photo> <browse.webp to write>
//
// two-pipelines: what the original worker did, one sharp pipeline per variant, each from the
//   original (decode, rotate, resize, WebP), run one after the other.
// decode-once: the best sharp does, decode once, shrinking on load to the browse size into raw
//   pixels, then encode the browse and make the thumb from those pixels.
// Both: thumb fits 400x400, browse long edge 2048, never upscale, WebP quality 80, no metadata,
// sRGB output (sharp's default), sharp's cache off. sharp is resolved from SHARP_PATH.
// Prints one JSON line: seconds (the render only, not Node.js start or sharp's import),
// peak_mb (VmHWM of this process), bytes (both variants), browse_bytes.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const sharp = require(process.env.SHARP_PATH);
sharp.cache(false);

const [mode, photo, browsePath] = process.argv.slice(2);
const input = readFileSync(photo);
const fit = (size) => ({ width: size, height: size, fit: "inside", withoutEnlargement: true });
const webp = { quality: 80, effort: 4 };

async function twoPipelines() {
  const thumb = await sharp(input).rotate().resize(fit(400)).webp(webp).toBuffer();
  const browse = await sharp(input).rotate().resize(fit(2048)).webp(webp).toBuffer();
  return [thumb, browse];
}

async function decodeOnce() {
  const { data, info } = await sharp(input)
    .rotate()
    .resize(fit(2048))
    .raw()
    .toBuffer({ resolveWithObject: true });
  const raw = { raw: { width: info.width, height: info.height, channels: info.channels } };
  const browse = await sharp(data, raw).webp(webp).toBuffer();
  const thumb = await sharp(data, raw).resize(fit(400)).webp(webp).toBuffer();
  return [thumb, browse];
}

const run = { "two-pipelines": twoPipelines, "decode-once": decodeOnce }[mode];
if (!run) {
  throw new Error(`unknown mode ${mode}`);
}
const started = process.hrtime.bigint();
const [thumb, browse] = await run();
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
writeFileSync(browsePath, browse);
const status = readFileSync("/proc/self/status", "utf8");
const peakKb = Number(/VmHWM:\s+(\d+)/.exec(status)[1]);
console.log(
  JSON.stringify({
    seconds,
    peak_mb: peakKb / 1024,
    bytes: thumb.length + browse.length,
    browse_bytes: browse.length,
  }),
);
