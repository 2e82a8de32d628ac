// The gallery (SPEC 17): register each chosen photo with the upload API, POST it straight to S3
// with the fields that came back, then poll its status until it is published or has failed.
import { thumbHashToDataURL } from "/vendor/thumbhash.js";

const POLL_MS = 1000;
// One album a visit: albums are the app's business, and this page is its own small app.
const album = crypto.randomUUID();
const tiles = document.querySelector("#tiles");
const input = document.querySelector("#files");

// Browsers name no type for some formats the pipeline reads; the API needs the type declared.
const BY_SUFFIX = { heic: "image/heic", heif: "image/heif", avif: "image/avif" };
const contentType = (file) =>
  file.type || BY_SUFFIX[file.name.split(".").pop().toLowerCase()] || "application/octet-stream";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const bytes = (base64) => Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));

input.addEventListener("change", () => {
  for (const file of input.files) add(file);
  input.value = "";
});

function tile(file) {
  const root = document.createElement("li");
  root.className = "tile";
  root.innerHTML = `<div class="frame"><img class="placeholder" alt=""><img class="browse" alt=""></div>
    <p class="name"></p><p class="state"></p><button class="delete" type="button" hidden>Delete</button>`;
  const view = {
    root,
    frame: root.querySelector(".frame"),
    placeholder: root.querySelector(".placeholder"),
    browse: root.querySelector(".browse"),
    state: root.querySelector(".state"),
    remove: root.querySelector(".delete"),
  };
  root.querySelector(".name").textContent = file.name;
  view.browse.alt = file.name;
  tiles.append(root);
  return view;
}

function show(view, state, words) {
  view.root.dataset.state = state;
  view.state.textContent = words;
}

// What the tile has shown so far, in order: "color thumbhash browse" once published.
function reached(view, stage) {
  view.root.dataset.stages = `${view.root.dataset.stages ?? ""} ${stage}`.trim();
}

function failed(view, words, code) {
  show(view, "failed", code ? `${words} (${code})` : words);
}

async function add(file) {
  const view = tile(file);
  show(view, "registering", "Registering…");
  try {
    const registered = await fetch(`/albums/${album}/photos`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ fileName: file.name, contentType: contentType(file), size: file.size }),
    });
    const answer = await registered.json();
    if (registered.status !== 201) return failed(view, answer.message, answer.reason);
    view.root.dataset.photoId = answer.photoId;
    view.remove.hidden = false;
    view.remove.addEventListener("click", () => remove(view, answer.photoId));

    show(view, "uploading", "Uploading…");
    const form = new FormData();
    for (const [name, value] of Object.entries(answer.upload.fields)) form.append(name, value);
    form.append("file", file); // S3 reads the policy's fields first: the file goes last
    const stored = await fetch(answer.upload.url, { method: "POST", body: form });
    if (!stored.ok) return failed(view, `Storage refused the upload (HTTP ${stored.status}).`);

    show(view, "processing", "Processing…");
    await watch(view, answer.photoId);
  } catch (error) {
    failed(view, `The upload could not be sent: ${error.message}`);
  }
}

async function watch(view, photoId) {
  while (view.root.isConnected) {
    const answer = await fetch(`/photos/${photoId}`);
    if (answer.status === 404) return view.root.remove();
    const photo = await answer.json();
    if (photo.state === "published") return publish(view, photo);
    if (photo.state === "failed") return failed(view, photo.error, photo.errorCode);
    await sleep(POLL_MS);
  }
}

// First what costs nothing (the colour), then the ThumbHash decoded here, then the browse image.
async function publish(view, photo) {
  const { frame, placeholder, browse } = view;
  show(view, "published", "Published");
  if (photo.placeholder) {
    frame.style.backgroundColor = photo.placeholder.averageColor;
    reached(view, "color");
    if (await loaded(placeholder, thumbHashToDataURL(bytes(photo.placeholder.thumbhash)))) {
      placeholder.classList.add("shown");
      reached(view, "thumbhash");
    }
  }
  if (await loaded(browse, photo.variants.browse.url)) {
    browse.classList.add("shown");
    reached(view, "browse");
  } else {
    show(view, "published", "Published, but its browse image could not be loaded.");
  }
}

function loaded(image, src) {
  return new Promise((resolve) => {
    image.addEventListener("load", () => resolve(true), { once: true });
    image.addEventListener("error", () => resolve(false), { once: true });
    image.src = src;
  });
}

async function remove(view, photoId) {
  view.remove.disabled = true;
  const answer = await fetch(`/photos/${photoId}`, { method: "DELETE" });
  if (answer.status === 204 || answer.status === 404) return view.root.remove();
  view.remove.disabled = false;
  view.state.textContent = `Could not delete it (HTTP ${answer.status}).`;
}
