"""`make gallery` in headless Chromium (Debian's): the real page against its own local stack, photos
chosen through the page's own file input, tiles checked by what the page shows."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from devkit import samples, stack
from photo_publish.keys import photo_prefixes

# Debian's packages (`make test` installs them where missing): never a downloaded browser.
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
GOOD = ("Garden.jpg", "LadyBird.jpg", "Aqua.jpg")
SCREENSHOT_COPY = Path("/tmp/gallery.png")

# What each tile shows, read from the page itself.
TILES_JS = """
return [...document.querySelectorAll('#tiles .tile')].map((tile) => {
  const browse = tile.querySelector('img.browse'), placeholder = tile.querySelector('img.placeholder');
  return {
    name: tile.querySelector('.name').textContent,
    state: tile.dataset.state,
    stages: tile.dataset.stages || '',
    photoId: tile.dataset.photoId || null,
    words: tile.querySelector('.state').textContent,
    browseSrc: browse.getAttribute('src'),
    browseWidth: browse.naturalWidth,
    browseOpacity: getComputedStyle(browse).opacity,
    placeholderSrc: placeholder.getAttribute('src') || '',
    placeholderWidth: placeholder.naturalWidth,
    background: getComputedStyle(tile.querySelector('.frame')).backgroundColor,
  };
});
"""


@dataclass(frozen=True)
class Gallery:
    url: str
    s3_endpoint: str
    bucket: str
    stage: str


@pytest.fixture
def gallery() -> Iterator[Gallery]:
    """`python -m devkit.gallery` in its own process with its own stack, as `make gallery` runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL", "POWERTOOLS_"))}
    env |= {"PYTHONPATH": "functions/process:shared:.", "MALLOC_ARENA_MAX": "2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "devkit.gallery", "--port", "0"],
        cwd=stack.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    said = ""
    try:
        while "S3: " not in said:
            try:
                said += lines.get(timeout=240)
            except queue.Empty:
                pytest.fail(f"the gallery did not start: {said!r}")
        page = re.search(r"gallery: (http://127\.0\.0\.1:\d+)/", said)
        s3 = re.search(r"S3: (http://\S+) bucket (\S+) \(stage (\S+)\)", said)
        assert page and s3, said
        yield Gallery(page.group(1), s3.group(1), s3.group(2), s3.group(3))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMIUM, CHROMEDRIVER):
        # Not a skip: `make test` installs Debian's chromium and chromium-driver where missing.
        assert path.exists(), f"{path} is missing: apt-get install chromium chromium-driver (make test does)"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def photo_files(folder: Path) -> list[Path]:
    """Three photographs, and two hostile files a person might pick: half a JPEG, and text named
    .jpg (which the browser, by its name, declares image/jpeg)."""
    files = [samples.IMAGES / name for name in GOOD]
    broken = folder / "Broken upload.jpg"
    broken.write_bytes(samples.truncated((samples.IMAGES / "Wood.jpg").read_bytes()))
    notes = folder / "notes.jpg"
    notes.write_text("Not a photo: a shopping list. Eggs, flour, milk.\n" * 20)
    return [*files, broken, notes]


def tiles(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = driver.execute_script(TILES_JS)
    return found


def settled(tile: dict[str, Any]) -> bool:
    """Failed, or published down to its browse image, faded in all the way."""
    return tile["state"] == "failed" or (tile["stages"].endswith("browse") and tile["browseOpacity"] == "1")


def status(gallery: Gallery, photo_id: str) -> requests.Response:
    return requests.get(f"{gallery.url}/photos/{photo_id}", timeout=30)


def rgb(colour: str) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.mark.slow
def test_the_gallery_uploads_publishes_fails_and_deletes_through_the_page(
    gallery: Gallery, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    # GIVEN the bucket's CORS rule: the page's origin may POST, another origin may not
    def allowed(origin: str) -> str | None:
        answer = requests.options(
            f"{gallery.s3_endpoint}/{gallery.bucket}",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
            timeout=10,
        )
        return answer.headers.get("Access-Control-Allow-Origin") if answer.ok else None

    assert allowed(gallery.url) == gallery.url
    assert allowed("http://elsewhere.invalid") is None

    # WHEN a person opens the page and picks five files through its own input
    files = photo_files(tmp_path)
    browser.get(f"{gallery.url}/")
    browser.find_element(By.ID, "files").send_keys("\n".join(str(f) for f in files))

    # THEN every tile settles: published down to its browse image, or failed
    try:
        WebDriverWait(browser, 240, poll_frequency=0.5).until(
            lambda driver: len(shown := tiles(driver)) == len(files) and all(map(settled, shown))
        )
    except Exception:
        pytest.fail(f"tiles: {tiles(browser)}\nconsole: {browser.get_log('browser')}")
    shown = {tile["name"]: tile for tile in tiles(browser)}
    assert list(shown) == [f.name for f in files]
    browser.save_screenshot(str(tmp_path / "gallery.png"))
    shutil.copyfile(tmp_path / "gallery.png", SCREENSHOT_COPY)

    # AND each photograph went from its average colour to its ThumbHash to its browse variant
    for name in GOOD:
        tile = shown[name]
        answer = status(gallery, tile["photoId"]).json()
        assert tile["state"] == "published" and tile["words"] == "Published", tile
        assert tile["stages"] == "color thumbhash browse", tile
        assert tile["background"] == rgb(answer["placeholder"]["averageColor"])
        assert tile["placeholderSrc"].startswith("data:image/png;base64,") and tile["placeholderWidth"] > 0
        assert tile["browseSrc"] == answer["variants"]["browse"]["url"]
        assert tile["browseSrc"] == f"{gallery.url}/cdn/{answer['variants']['browse']['key']}"
        assert tile["browseWidth"] == answer["variants"]["browse"]["width"] > 0

    # AND each hostile file is a failed tile that says why, in words and by its code
    for name, code in (("Broken upload.jpg", "DECODE_FAILED"), ("notes.jpg", "UNSUPPORTED_FORMAT")):
        tile = shown[name]
        answer = status(gallery, tile["photoId"]).json()
        assert (tile["state"], answer["state"], answer["errorCode"]) == ("failed", "failed", code)
        assert tile["words"] == f"{answer['error']} ({code})", tile
        assert tile["browseSrc"] is None

    # WHEN the person deletes a published photo's tile
    doomed = shown["LadyBird.jpg"]
    album_id = status(gallery, doomed["photoId"]).json()["albumId"]
    selector = f'.tile[data-photo-id="{doomed["photoId"]}"]'
    browser.find_element(By.CSS_SELECTOR, f"{selector} button.delete").click()
    WebDriverWait(browser, 30).until(lambda driver: not driver.find_elements(By.CSS_SELECTOR, selector))

    # THEN the photo is gone: the API does not know it, S3 holds nothing under its prefixes
    assert status(gallery, doomed["photoId"]).status_code == 404
    s3 = boto3.client(
        "s3",
        endpoint_url=gallery.s3_endpoint,
        region_name=stack.REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    for prefix in photo_prefixes(gallery.stage, uuid.UUID(album_id), uuid.UUID(doomed["photoId"])):
        assert s3.list_objects_v2(Bucket=gallery.bucket, Prefix=prefix)["KeyCount"] == 0, prefix
    # AND the other tiles stay as they were
    assert [t["name"] for t in tiles(browser)] == [f.name for f in files if f.name != "LadyBird.jpg"]
