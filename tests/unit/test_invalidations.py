"""How waiting CDN paths become one CreateInvalidation call (SPEC 19): CloudFront's limit of 15
wildcard paths in progress per distribution, an album's photos as the album's one path."""

from __future__ import annotations

from uuid import UUID, uuid4

from photo_publish.jobs.invalidations import album_path, photo_path, plan


def paths(album: UUID, count: int) -> list[str]:
    return [photo_path("dev", album, uuid4()) for _ in range(count)]


def test_a_photos_path_is_its_variants_prefix_as_a_url_path_with_one_wildcard() -> None:
    album, photo = UUID(int=1), UUID(int=2)
    assert photo_path("dev", album, photo) == f"/dev/albums/{album}/variants/{photo}/*"
    assert album_path(photo_path("dev", album, photo)) == f"/dev/albums/{album}/variants/*"
    assert album_path("/dev/albums/x/variants/*") is None  # an album's path has no album above it


def test_up_to_15_waiting_paths_go_as_they_are() -> None:
    # GIVEN 15 photos of one album waiting
    waiting = paths(uuid4(), 15)
    # WHEN a call is planned, THEN it carries each photo's own path and covers them all
    assert plan(waiting) == (waiting, waiting)


def test_beyond_15_an_albums_photos_go_as_the_albums_one_path() -> None:
    # GIVEN an album erasure of 500 photos, and one photo of another album, waiting
    erased, other = uuid4(), uuid4()
    waiting = paths(erased, 500) + paths(other, 1)

    # WHEN a call is planned
    call, covered = plan(waiting)

    # THEN it is two paths, the album's and the other photo's, covering every row
    assert call == [f"/dev/albums/{erased}/variants/*", waiting[-1]]
    assert covered == waiting


def test_a_call_never_carries_more_than_15_wildcards_the_rest_waits() -> None:
    # GIVEN 20 photos of 20 albums, oldest first
    waiting = [path for _ in range(20) for path in paths(uuid4(), 1)]

    # WHEN a call is planned, THEN it takes the 15 oldest; the 5 others wait for a later one
    call, covered = plan(waiting)
    assert call == covered == waiting[:15]
