"""A GGUF repo's variants against this fleet: each variant's size and what each engine would
reserve for it, and the default choice — the largest variant that fits the largest free
device (an accelerator when the fleet has one; the CPU pool is the fallback tier). Used by
the variants route and by downloads asked without a variant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cohabit.hardware.model import HardwareClass
from cohabit.hub.client import HubRepo
from cohabit.hub.headers import variant_estimates
from cohabit.hub.variants import Choice, Variant, choose, variants_of
from cohabit.service.errors import InvalidInput, from_hub
from cohabit.store import ledger
from cohabit.store.database import Database

CHOICE_ENGINE = "llamacpp"  # what a GGUF model's default config runs


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantRow:
    variant: Variant
    needed_bytes: dict[str, int]  # engine → bytes per device


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantTable:
    repo_id: str
    revision: str | None
    rows: tuple[VariantRow, ...]
    choice: Choice


def largest_free(db: Database) -> tuple[int, str]:
    """The largest free budget of the fleet now, and where it is."""
    state = ledger.current_state(db)
    free = state.free_bytes()
    slots = [s for s in state.slots if s.schedulable]
    accelerators = [s for s in slots if s.hardware_class is not HardwareClass.CPU]
    pool = accelerators or slots
    if not pool:
        return 0, "the fleet (no device)"
    best = max(pool, key=lambda s: (free[s.position], -s.position))
    return free[best.position], best.location


def table(db: Database, listing: HubRepo, *, server: bool) -> VariantTable:
    """Every GGUF variant of the listing with each engine's estimate, and the default choice.
    `server`: whether the headers may be read with the server's Hub credentials."""
    variants = variants_of({f.name: f.size_bytes for f in listing.files})
    if not variants:
        raise InvalidInput(f"{listing.repo_id} has no GGUF variants")
    rows = _rows(listing, variants, server=server)
    return VariantTable(
        repo_id=listing.repo_id,
        revision=listing.commit,
        rows=tuple(rows),
        choice=_choose(db, rows),
    )


def pick_variant(db: Database, listing: HubRepo, variants: Sequence[Variant]) -> Choice:
    """The variant a download takes (an admin's request: the server's credentials)."""
    return _choose(db, _rows(listing, variants, server=True))


def _rows(listing: HubRepo, variants: Sequence[Variant], *, server: bool) -> list[VariantRow]:
    files = {f.name: f for f in listing.files}
    revision = listing.commit or "main"

    def needed(variant: Variant) -> dict[str, int]:
        return from_hub(
            lambda: variant_estimates(
                listing.repo_id, variant, files, revision=revision, server=server
            )
        )

    return [VariantRow(variant=v, needed_bytes=needed(v)) for v in variants]


def _choose(db: Database, rows: Sequence[VariantRow]) -> Choice:
    free_bytes, where = largest_free(db)
    needed = {r.variant.name: r.needed_bytes.get(CHOICE_ENGINE, r.variant.size_bytes) for r in rows}
    return choose([r.variant for r in rows], needed, largest_free_bytes=free_bytes, where=where)
