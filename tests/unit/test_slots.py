"""What a render may hold, from the function's memory and what runs at once (image/slots.py)."""

from __future__ import annotations

import dataclasses

import pytest

from photo_publish.image import slots
from photo_publish.image.pipeline import RenderOptions
from photo_publish.image.slots import AVIF_WORK, HEAP_GROWTH, MIB, RECORD_RESERVE, RENDER_WORK, DecodeBudget
from photo_publish.settings import InvalidSettings, Settings

REQUIRED = {"DATABASE_URL": "postgresql://u@h/db", "PHOTO_BUCKET": "bucket", "STAGE": "dev"}
RESIDENT = 100 * MIB


def test_at_the_templates_memory_a_slot_and_the_whole_are_the_memory_shared_out() -> None:
    # GIVEN the template's function (1769 MB), 4 records in flight of which 2 render, 100 MB resident
    budget = DecodeBudget.of(memory_mb=1769, records=4, renders=2, resident=RESIDENT)

    # THEN a slot is half of what the resident set, the heap's growth and the two other records leave,
    # less a render's work; the whole is all of it but the three other records, less the work
    assert budget.slot == (1769 * MIB - RESIDENT - HEAP_GROWTH - 2 * RECORD_RESERVE) // 2 - RENDER_WORK
    assert budget.whole == 1769 * MIB - RESIDENT - HEAP_GROWTH - 3 * RECORD_RESERVE - RENDER_WORK
    assert (budget.slot // MIB, budget.whole // MIB) == (690, 1461)
    # AND two renders in their slots, with their work, the records and the process fill the memory
    shared = 2 * (budget.slot + RENDER_WORK) + 2 * RECORD_RESERVE + RESIDENT + HEAP_GROWTH
    assert 1769 * MIB - 1 <= shared <= 1769 * MIB
    # AND so does one render alone beside the three other records
    assert budget.whole + RENDER_WORK + 3 * RECORD_RESERVE + RESIDENT + HEAP_GROWTH == 1769 * MIB


def test_the_budget_follows_the_functions_memory_and_what_the_process_holds() -> None:
    # GIVEN the same concurrency at 1769 MB and at 3008 MB, and at 1769 MB with 200 MB more resident
    base = DecodeBudget.of(memory_mb=1769, records=4, renders=2, resident=RESIDENT)
    bigger = DecodeBudget.of(memory_mb=3008, records=4, renders=2, resident=RESIDENT)
    heavier = DecodeBudget.of(memory_mb=1769, records=4, renders=2, resident=RESIDENT + 200 * MIB)

    # THEN each MB of memory goes half to each slot and whole to the render alone; each MB the
    # process holds is taken the same way
    assert bigger.whole - base.whole == (3008 - 1769) * MIB
    assert bigger.slot - base.slot == (3008 - 1769) * MIB // 2
    assert base.whole - heavier.whole == 200 * MIB
    assert base.slot - heavier.slot == 100 * MIB


def test_one_render_at_a_time_has_a_slot_as_large_as_the_whole() -> None:
    budget = DecodeBudget.of(memory_mb=1769, records=4, renders=1, resident=RESIDENT)
    assert budget.slot == budget.whole


def test_no_more_renders_share_the_memory_than_records_are_in_flight() -> None:
    # GIVEN more renders at once than records (RENDER_CONCURRENCY 4, RECORD_CONCURRENCY 2)
    budget = DecodeBudget.of(memory_mb=1769, records=2, renders=4, resident=RESIDENT)

    # THEN the memory is shared among the two that can render at once
    assert budget.renders == 2
    assert budget.slot == DecodeBudget.of(memory_mb=1769, records=2, renders=2, resident=RESIDENT).slot


def test_a_memory_too_small_for_one_render_is_a_configuration_error() -> None:
    # GIVEN 512 MB (the template's least), ten records in flight and the ladder in AVIF too: not even
    # one render's work fits beside the other records' reserves
    settings = Settings.from_env(
        REQUIRED
        | {
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
            "RECORD_CONCURRENCY": "10",
            "RENDER_CONCURRENCY": "10",
            "VARIANT_FORMATS": "webp,avif",
        }
    )

    # WHEN the process function asks what a render may hold
    with pytest.raises(InvalidSettings) as raised:
        slots.decode_budget(settings)

    # THEN it is refused, naming the variables and what they would need
    message = str(raised.value)
    assert "AWS_LAMBDA_FUNCTION_MEMORY_SIZE (512)" in message
    assert "RENDER_CONCURRENCY (10)" in message
    assert "one render beside 9 records needs at least 528 MB" in message
    # AND the template's least memory holds the default concurrency
    assert (
        slots.decode_budget(Settings.from_env(REQUIRED | {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512"})).slot > 0
    )


def test_a_memory_too_small_for_the_renders_asked_renders_fewer_at_once() -> None:
    # GIVEN 512 MB, the default concurrency (2 renders of 4 records) and the ladder in AVIF too,
    # whose encoder holds more: two renders' work does not fit beside the process
    settings = Settings.from_env(
        REQUIRED | {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512", "VARIANT_FORMATS": "webp,avif"}
    )

    # WHEN the process function asks what a render may hold
    budget = slots.decode_budget(settings, RESIDENT)

    # THEN one renders at a time, in what is left, and the cold start's log line says so
    assert (budget.renders, budget.asked, budget.work) == (1, 2, RENDER_WORK + AVIF_WORK)
    assert budget.slot == 512 * MIB - RESIDENT - HEAP_GROWTH - 3 * RECORD_RESERVE - budget.work
    assert budget.slot > 0
    assert "1 rendering of 2 asked, as many as the memory holds" in budget.describe()
    # AND with WebP alone, the two asked for fit
    assert (
        slots.decode_budget(Settings.from_env(REQUIRED | {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512"})).renders
        == 2
    )


def test_the_functions_memory_is_read_from_what_lambda_sets() -> None:
    # GIVEN the environment Lambda gives a function of 3008 MB
    settings = Settings.from_env(REQUIRED | {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3008"})

    # WHEN the budget is derived, with this process's resident set
    budget = slots.decode_budget(settings, 200 * MIB)

    # THEN it is the budget of that memory
    assert budget == DecodeBudget.of(memory_mb=3008, records=4, renders=2, resident=200 * MIB)
    assert budget.describe().startswith("3008 MB of function memory, less 200 MB resident")


def test_a_render_outside_the_function_has_the_budget_of_the_default_settings() -> None:
    # GIVEN the settings' defaults (the template's memory, the default concurrency)
    settings = Settings(database_url="postgresql://u@h/db", photo_bucket="bucket", stage="dev")

    # THEN the pipeline's own defaults are that budget, alone (no gate outside the function)
    assert slots.decode_budget(settings) == slots.DEFAULT
    options = RenderOptions()
    assert options.max_decode_buffer_bytes == slots.DEFAULT.whole
    assert options.shared_decode_buffer_bytes is None
    # AND the service's options share it: a slot, the whole alone
    shared = options.sharing(slots.DEFAULT)
    assert (shared.shared_decode_buffer_bytes, shared.max_decode_buffer_bytes) == (
        slots.DEFAULT.slot,
        slots.DEFAULT.whole,
    )
    assert dataclasses.replace(shared, shared_decode_buffer_bytes=None) == shared.alone()


def test_the_resident_set_is_measured_from_the_kernel() -> None:
    # GIVEN this process, which holds at least its interpreter and pyvips
    resident = slots.resident_bytes()

    # THEN it is measured, and plausible
    assert resident is not None
    assert 10 * MIB < resident < 8 << 30
