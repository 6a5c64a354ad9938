"""The committed catalog of candidate data sources (catalog.yaml): load, validate, rank, and find local copies."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from eagle3lab.io import InputError
from eagle3lab.paths import DATA

CATALOG_PATH = Path(__file__).with_name("catalog.yaml")
# The seeds' categories, plus the issue's four for the local training sources (chat, code, math, qa): the mixture's
# quotas are by these.
CATEGORIES = (
    "target-native",
    "distill-reasoning",
    "code-instruction",
    "agentic",
    "chat",
    "code",
    "math",
    "qa",
    "evaluation",
)
FIELDS = ("id", "location", "category", "size", "format", "generator", "license", "why", "rank", "loader")
# A hub source counts as available locally when a copy in hub layout sits here (e.g. data/hub/ORG/NAME/data/*.parquet).
HUB_MIRROR = DATA / "hub"


@dataclass(frozen=True)
class Source:
    id: str
    location: str
    category: str
    size: int | str  # approximate number of records, or "unknown"
    format: str
    generator: str
    license: str
    why: str
    rank: int | None  # None for evaluation sets
    loader: str  # "packaged:NAME" (eagle3lab.data.sources), "auto", or a format name of eagle3lab.data.formats
    notes: str = ""

    @property
    def is_evaluation(self) -> bool:
        return self.category == "evaluation"

    @property
    def hub_id(self) -> str | None:
        loc = self.location
        if loc.startswith("package:") or loc == "unknown" or loc.count("/") != 1:
            return None
        return loc

    def to_row(self) -> dict:
        return asdict(self)


TEXT_FIELDS = ("id", "location", "format", "generator", "license", "why", "loader", "notes")


def load_catalog(path: str | Path = CATALOG_PATH) -> list[Source]:
    """Parse and validate the catalog; every problem is reported with the entry and field it concerns."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
        raise InputError(f"{path}: expected a mapping with a list under 'sources'")
    sources, seen_ids, seen_ranks = [], set(), {}
    for i, entry in enumerate(doc["sources"]):
        named = isinstance(entry, dict) and entry.get("id")
        where = f"{path}: entry {i}" + (f" ({entry['id']!r})" if named else "")
        _check_entry(entry, where)
        rank = entry["rank"]
        if rank is not None and rank in seen_ranks:
            raise InputError(f"{where}: field 'rank' {rank} is already used by {seen_ranks[rank]!r}")
        if entry["id"] in seen_ids:
            raise InputError(f"{where}: duplicate id {entry['id']!r}")
        seen_ids.add(entry["id"])
        if rank is not None:
            seen_ranks[rank] = entry["id"]
        sources.append(Source(**{k: str(v) if k in TEXT_FIELDS else v for k, v in entry.items()}))
    return sources


def _check_entry(entry, where: str) -> None:
    """One catalog entry's fields, on their own (uniqueness across entries is load_catalog's)."""
    from eagle3lab.data.formats import FORMATS  # the loader names a catalog entry may use

    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping")
    for name in FIELDS:
        if name not in entry:
            raise InputError(f"{where}: missing field '{name}'")
        if name != "rank" and (entry[name] is None or str(entry[name]).strip() == ""):
            raise InputError(f"{where}: field '{name}' is empty (write \"unknown\" when the fact is not known)")
    unknown = set(entry) - set(FIELDS) - {"notes"}
    if unknown:
        raise InputError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {list(FIELDS) + ['notes']}")
    if entry["category"] not in CATEGORIES:
        raise InputError(f"{where}: field 'category' is {entry['category']!r}; use one of {list(CATEGORIES)}")
    size = entry["size"]
    if not (size == "unknown" or (isinstance(size, int) and not isinstance(size, bool) and size > 0)):
        raise InputError(f"{where}: field 'size' should be a positive integer or \"unknown\", got {size!r}")
    rank = entry["rank"]
    if entry["category"] == "evaluation":
        if rank is not None:
            raise InputError(f"{where}: field 'rank' must be null for an evaluation set (never mixed in)")
    elif not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
        raise InputError(f"{where}: field 'rank' should be a positive integer, got {rank!r}")
    loader = str(entry["loader"])
    packaged = loader.startswith("packaged:") and loader.split(":", 1)[1] in _packaged_loaders()
    if not (loader == "auto" or loader in FORMATS or packaged):
        raise InputError(
            f"{where}: field 'loader' is {loader!r}; use 'auto', one of {sorted(FORMATS)}, "
            f"or packaged:NAME with NAME in {sorted(_packaged_loaders())}"
        )


def ranked(sources: list[Source]) -> list[Source]:
    """Training candidates by rank, then evaluation sets (unranked) by id."""
    return sorted(sources, key=lambda s: (s.rank is None, s.rank or 0, s.id))


def _packaged_loaders() -> dict:
    from eagle3lab.data.packaged import TRAINING_SOURCES
    from eagle3lab.data.sources import EVALUATION_SETS

    return {**TRAINING_SOURCES, **EVALUATION_SETS}


def local_path(source: Source, mirror: Path = HUB_MIRROR) -> Path | None:
    """Where a local copy of `source` lives, or None when it is not available offline."""
    if source.loader.startswith("packaged:"):
        from eagle3lab.data.packaged import TRAINING_SOURCES

        name = source.loader.split(":", 1)[1]
        if name in TRAINING_SOURCES:
            candidate = TRAINING_SOURCES[name].path
        else:  # an evaluation set: its one file, extracted under data/<loader name>/ by `eagle3lab data fetch`
            candidate = DATA / name / Path(source.location.split("/", 1)[-1]).name
        return candidate if candidate.exists() else None
    if source.hub_id:
        candidate = mirror / source.hub_id
        return candidate if candidate.is_dir() else None
    return None


def load_source(
    source: Source,
    *,
    set_cap: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    tokenizer=None,
    mirror: Path = HUB_MIRROR,
):
    """A catalog source's records from its local copy (packaged loader, or a hub-layout mirror folder), as a
    `packaged.Loaded`; `set_cap` caps each set of a many-set source (a seeded sample)."""
    from eagle3lab.data.formats import load_records
    from eagle3lab.data.packaged import Loaded, Packaged

    if source.loader.startswith("packaged:"):
        loader = _packaged_loaders()[source.loader.split(":", 1)[1]]
        loaded = loader.load(set_cap=set_cap, seed=seed) if isinstance(loader, Packaged) else Loaded(loader())
        loaded.records = loaded.records[:limit] if limit else loaded.records
        return loaded
    path = local_path(source, mirror)
    if path is None:
        raise InputError(
            f"catalog source {source.id!r}: no local copy under {mirror}; download it (online) with "
            f"eagle3lab.data.formats.load_records({source.hub_id or source.location!r}) or place a hub-layout "
            f"copy at {mirror / (source.hub_id or source.id)}"
        )
    fmt = None if source.loader == "auto" else source.loader
    records = load_records(
        path, format=fmt, source=source.id, category=source.category, limit=limit, tokenizer=tokenizer
    )
    return Loaded(records)
