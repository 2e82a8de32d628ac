// The reference ThumbHash (the npm package `thumbhash`), for tests/unit/test_thumbhash.py.
//
//   node tests/thumbhash_reference.mjs PACKAGE_DIR < request.json > answer.json
//
// request: {"encode": [{"width", "height", "rgba": base64}], "decode": [base64 hash],
//           "cosines": [[size, order]]}  (order "encoder": PI / size * c * (i + 0.5), "decoder":
//           PI / size * (i + 0.5) * c; c < 7, i < size, as the package multiplies them)
// answer:  {"encode": [base64 hash], "decode": [{"width", "height", "rgba": base64, "average":
//           {r, g, b, a}, "ratio"}], "cosines": [base64 of float64 little-endian], "node", "v8"}
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const packageDir = process.argv[2]
const ThumbHash = await import(pathToFileURL(join(packageDir, 'thumbhash.js')).href)
const request = JSON.parse(readFileSync(0, 'utf8'))
const base64 = (bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64')
const bytes = (text) => new Uint8Array(Buffer.from(text, 'base64'))

const answer = {
  node: process.versions.node,
  v8: process.versions.v8,
  encode: (request.encode ?? []).map(({ width, height, rgba }) =>
    base64(ThumbHash.rgbaToThumbHash(width, height, bytes(rgba)))),
  decode: (request.decode ?? []).map((text) => {
    const hash = bytes(text)
    const { w, h, rgba } = ThumbHash.thumbHashToRGBA(hash)
    return {
      width: w,
      height: h,
      rgba: base64(rgba),
      average: ThumbHash.thumbHashToAverageRGBA(hash),
      ratio: ThumbHash.thumbHashToApproximateAspectRatio(hash),
    }
  }),
  cosines: (request.cosines ?? []).map(([size, order]) => {
    const values = []
    for (let c = 0; c < 7; c++)
      for (let i = 0; i < size; i++)
        values.push(Math.cos(order === 'encoder' ? Math.PI / size * c * (i + 0.5) : Math.PI / size * (i + 0.5) * c))
    return base64(new Float64Array(values))
  }),
}
process.stdout.write(JSON.stringify(answer))
