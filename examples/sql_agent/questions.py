"""The data: natural-language questions with gold SQL over Chinook, generated from the database.

Every question comes from a template filled with entities read from the database
(countries, cities, artists, albums, tracks, genres, customers). Each kind of entity
is shuffled with a fixed seed and split 60/20/20 into train, validation and test
pools, so no test question names an entity that any training question names: the
test split measures whether the agent learned to write SQL, not the answers.

Tiers:

- ``easy``: one table, a filter or a count;
- ``medium``: one table with ordering and limits, aggregates or ``GROUP BY``;
- ``hard``: joins over two or three tables, some with ``GROUP BY``.

A question is kept only when its gold query returns rows (and, for ordered ones with
a ``LIMIT``, no tie at the cut). ``python -m examples.sql_agent.questions --out DIR`` (from the
repository root) writes ``train.jsonl``, ``val.jsonl`` and ``test.jsonl``, and
``train-easy.jsonl``: the easy tier of train, which training uses by default.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .database import connect

SPLITS = ("train", "val", "test")
TIERS = ("easy", "medium", "hard")
SIZES = {"train": 120, "val": 30, "test": 30}
"""Questions per tier in each split."""
SEED = 11


def q(value: str) -> str:
    """``value`` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class Template:
    """A question pattern: its tier, the entity kind it takes, its phrasings and its gold SQL."""

    name: str
    tier: str
    entity: str
    phrasings: tuple[str, ...]
    sql: Callable[[dict], str]
    ordered: bool = False
    tie_key: str | None = None
    """For ``LIMIT {k}`` questions: the column ordered by, checked for a tie at the cut."""


def _one(name, tier, entity, phrasings, sql, ordered=False, tie_key=None) -> Template:
    return Template(name, tier, entity, tuple(phrasings), sql, ordered, tie_key)


TEMPLATES: tuple[Template, ...] = (
    # -- easy: one table, a filter or a count
    _one(
        "customers_in_country",
        "easy",
        "country",
        ["How many customers are from {country}?", "Count the customers who live in {country}."],
        lambda e: f"SELECT COUNT(*) FROM Customer WHERE Country = {q(e['country'])}",
    ),
    _one(
        "customer_names_in_country",
        "easy",
        "country",
        [
            "List the first names of the customers from {country}.",
            "What are the first names of customers in {country}?",
        ],
        lambda e: f"SELECT FirstName FROM Customer WHERE Country = {q(e['country'])}",
    ),
    _one(
        "invoices_in_city",
        "easy",
        "city",
        ["How many invoices were billed to {city}?", "Count the invoices with billing city {city}."],
        lambda e: f"SELECT COUNT(*) FROM Invoice WHERE BillingCity = {q(e['city'])}",
    ),
    _one(
        "artist_by_id",
        "easy",
        "artist",
        ["What is the name of the artist with id {artist_id}?", "Give the name of artist number {artist_id}."],
        lambda e: f"SELECT Name FROM Artist WHERE ArtistId = {e['artist_id']}",
    ),
    _one(
        "album_by_id",
        "easy",
        "album",
        ["What is the title of the album with id {album_id}?", "Give the title of album number {album_id}."],
        lambda e: f"SELECT Title FROM Album WHERE AlbumId = {e['album_id']}",
    ),
    _one(
        "albums_of_artist_id",
        "easy",
        "artist",
        ["How many albums does the artist with id {artist_id} have?", "Count the albums of artist number {artist_id}."],
        lambda e: f"SELECT COUNT(*) FROM Album WHERE ArtistId = {e['artist_id']}",
    ),
    _one(
        "customer_email",
        "easy",
        "customer",
        ["What is the email of the customer {first} {last}?", "Give the email address of customer {first} {last}."],
        lambda e: f"SELECT Email FROM Customer WHERE FirstName = {q(e['first'])} AND LastName = {q(e['last'])}",
    ),
    _one(
        "tracks_on_album_id",
        "easy",
        "album",
        ["How many tracks are on the album with id {album_id}?", "Count the tracks of album number {album_id}."],
        lambda e: f"SELECT COUNT(*) FROM Track WHERE AlbumId = {e['album_id']}",
    ),
    _one(
        "composer_of_track",
        "easy",
        "track",
        ["Who composed the track {track}?", "What is the composer of the track {track}?"],
        lambda e: f"SELECT Composer FROM Track WHERE Name = {q(e['track'])}",
    ),
    # -- medium: one table, ordering and limits, aggregates, GROUP BY
    _one(
        "longest_tracks_on_album",
        "medium",
        "album",
        [
            "List the names of the {k} longest tracks on the album with id {album_id}, longest first.",
            "Which {k} tracks of album number {album_id} are the longest? Longest first.",
        ],
        lambda e: f"SELECT Name FROM Track WHERE AlbumId = {e['album_id']} ORDER BY Milliseconds DESC LIMIT {e['k']}",
        ordered=True,
        tie_key="Milliseconds",
    ),
    _one(
        "album_titles_sorted",
        "medium",
        "artist",
        [
            "List the album titles of the artist with id {artist_id} in alphabetical order.",
            "Give the titles of the albums of artist number {artist_id}, sorted by title.",
        ],
        lambda e: f"SELECT Title FROM Album WHERE ArtistId = {e['artist_id']} ORDER BY Title",
        ordered=True,
    ),
    _one(
        "invoice_total_of_country",
        "medium",
        "country",
        [
            "What is the total of all invoices billed to {country}?",
            "Sum the invoice totals with billing country {country}.",
        ],
        lambda e: f"SELECT SUM(Total) FROM Invoice WHERE BillingCountry = {q(e['country'])}",
    ),
    _one(
        "average_track_length",
        "medium",
        "album",
        [
            "What is the average length in milliseconds of the tracks on the album with id {album_id}?",
            "Give the mean track length in milliseconds of album number {album_id}.",
        ],
        lambda e: f"SELECT AVG(Milliseconds) FROM Track WHERE AlbumId = {e['album_id']}",
    ),
    _one(
        "longest_track_length",
        "medium",
        "album",
        [
            "What is the length in milliseconds of the longest track on the album with id {album_id}?",
            "Give the maximum track length in milliseconds of album number {album_id}.",
        ],
        lambda e: f"SELECT MAX(Milliseconds) FROM Track WHERE AlbumId = {e['album_id']}",
    ),
    _one(
        "customers_per_city",
        "medium",
        "country",
        [
            "How many customers are there in each city of {country}?",
            "For each city in {country}, count the customers.",
        ],
        lambda e: f"SELECT City, COUNT(*) FROM Customer WHERE Country = {q(e['country'])} GROUP BY City",
    ),
    _one(
        "invoices_per_city",
        "medium",
        "country",
        [
            "How many invoices are there for each billing city in {country}?",
            "For each billing city in {country}, count the invoices.",
        ],
        lambda e: (
            f"SELECT BillingCity, COUNT(*) FROM Invoice WHERE BillingCountry = {q(e['country'])} GROUP BY BillingCity"
        ),
    ),
    _one(
        "latest_invoices_of_city",
        "medium",
        "city",
        [
            "List the dates of the {k} most recent invoices billed to {city}, newest first.",
            "Give the invoice dates of the last {k} invoices with billing city {city}, newest first.",
        ],
        lambda e: (
            f"SELECT InvoiceDate FROM Invoice WHERE BillingCity = {q(e['city'])} "
            f"ORDER BY InvoiceDate DESC LIMIT {e['k']}"
        ),
        ordered=True,
        tie_key="InvoiceDate",
    ),
    # -- hard: joins over two or three tables
    _one(
        "albums_of_artist",
        "hard",
        "artist",
        ["List the titles of the albums by {artist}.", "What are the album titles of the artist {artist}?"],
        lambda e: (
            "SELECT Album.Title FROM Album JOIN Artist ON Album.ArtistId = Artist.ArtistId "
            f"WHERE Artist.Name = {q(e['artist'])}"
        ),
    ),
    _one(
        "tracks_in_genre",
        "hard",
        "genre",
        ["How many tracks are in the genre {genre}?", "Count the tracks of genre {genre}."],
        lambda e: (
            f"SELECT COUNT(*) FROM Track JOIN Genre ON Track.GenreId = Genre.GenreId WHERE Genre.Name = {q(e['genre'])}"
        ),
    ),
    _one(
        "tracks_on_album",
        "hard",
        "album",
        ["List the names of the tracks on the album {album}.", "What are the track names of the album {album}?"],
        lambda e: (
            "SELECT Track.Name FROM Track JOIN Album ON Track.AlbumId = Album.AlbumId "
            f"WHERE Album.Title = {q(e['album'])}"
        ),
    ),
    _one(
        "genre_of_track",
        "hard",
        "track",
        ["Which genre is the track {track} in?", "What is the genre name of the track {track}?"],
        lambda e: (
            "SELECT Genre.Name FROM Track JOIN Genre ON Track.GenreId = Genre.GenreId "
            f"WHERE Track.Name = {q(e['track'])}"
        ),
    ),
    _one(
        "customer_spending",
        "hard",
        "customer",
        [
            "What is the total amount spent by the customer {first} {last}?",
            "Sum the invoice totals of customer {first} {last}.",
        ],
        lambda e: (
            "SELECT SUM(Invoice.Total) FROM Invoice JOIN Customer ON Invoice.CustomerId = Customer.CustomerId "
            f"WHERE Customer.FirstName = {q(e['first'])} AND Customer.LastName = {q(e['last'])}"
        ),
    ),
    _one(
        "tracks_of_artist",
        "hard",
        "artist",
        ["How many tracks does {artist} have?", "Count the tracks on albums by {artist}."],
        lambda e: (
            "SELECT COUNT(*) FROM Track JOIN Album ON Track.AlbumId = Album.AlbumId "
            f"JOIN Artist ON Album.ArtistId = Artist.ArtistId WHERE Artist.Name = {q(e['artist'])}"
        ),
    ),
    _one(
        "tracks_per_album_of_artist",
        "hard",
        "artist",
        [
            "How many tracks does each album by {artist} have? Give the title and the count.",
            "For each album of {artist}, give its title and its number of tracks.",
        ],
        lambda e: (
            "SELECT Album.Title, COUNT(*) FROM Album JOIN Artist ON Album.ArtistId = Artist.ArtistId "
            f"JOIN Track ON Track.AlbumId = Album.AlbumId WHERE Artist.Name = {q(e['artist'])} GROUP BY Album.Title"
        ),
    ),
)


def _entities(conn: sqlite3.Connection) -> dict[str, list[dict]]:
    """Every entity a template can take, by kind, in a stable order."""

    def rows(sql: str) -> list[tuple]:
        return conn.execute(sql).fetchall()

    unique_tracks = rows("SELECT Name FROM Track GROUP BY Name HAVING COUNT(*) = 1 AND MAX(Composer) IS NOT NULL")
    return {
        "country": [{"country": c} for (c,) in rows("SELECT DISTINCT Country FROM Customer ORDER BY 1")],
        "city": [{"city": c} for (c,) in rows("SELECT DISTINCT BillingCity FROM Invoice ORDER BY 1")],
        "artist": [
            {"artist_id": i, "artist": n}
            for i, n in rows(
                "SELECT ArtistId, Name FROM Artist WHERE ArtistId IN (SELECT ArtistId FROM Album) "
                "AND Name IN (SELECT Name FROM Artist GROUP BY Name HAVING COUNT(*) = 1) ORDER BY 1"
            )
        ],
        "album": [
            {"album_id": i, "album": t}
            for i, t in rows(
                "SELECT AlbumId, Title FROM Album WHERE Title IN "
                "(SELECT Title FROM Album GROUP BY Title HAVING COUNT(*) = 1) ORDER BY 1"
            )
        ],
        "track": [{"track": n} for (n,) in sorted(unique_tracks)],
        "genre": [{"genre": n} for (n,) in rows("SELECT Name FROM Genre ORDER BY 1")],
        "customer": [
            {"first": f, "last": la} for f, la in rows("SELECT FirstName, LastName FROM Customer ORDER BY 1, 2")
        ],
    }


def split_entities(entities: dict[str, list[dict]], seed: int = SEED) -> dict[str, dict[str, list[dict]]]:
    """Each kind's entities shuffled and cut 60/20/20 into disjoint train/val/test pools."""
    pools: dict[str, dict[str, list[dict]]] = {s: {} for s in SPLITS}
    for kind, items in sorted(entities.items()):
        items = list(items)
        random.Random(f"{seed}-{kind}").shuffle(items)
        a, b = int(len(items) * 0.6), int(len(items) * 0.8)
        for split, part in zip(SPLITS, (items[:a], items[a:b], items[b:]), strict=True):
            pools[split][kind] = part
    return pools


def _usable(conn: sqlite3.Connection, template: Template, entity: dict) -> bool:
    """Whether the gold query returns rows, none all NULL, and (ordered with LIMIT) no tie at the cut."""
    sql = template.sql(entity)
    result = conn.execute(sql).fetchall()
    if not result or all(v is None for row in result for v in row):
        return False
    if template.tie_key is not None:
        k = entity["k"]
        body = sql[sql.index(" FROM ") :].rsplit(" LIMIT ", 1)[0]
        keys = conn.execute(f"SELECT {template.tie_key}{body} LIMIT {k + 1}").fetchall()
        if len(keys) <= k or keys[k - 1] == keys[k]:
            return False
    return True


def _candidates(conn, template: Template, pool: list[dict], rng: random.Random) -> Iterator[dict]:
    """Questions of one template over one entity pool, in a seeded random order."""
    items = list(pool)
    rng.shuffle(items)
    for entity in items:
        entity = dict(entity)
        if template.tie_key is not None:
            entity["k"] = rng.choice((2, 3, 5))
        if not _usable(conn, template, entity):
            continue
        yield {
            "question": rng.choice(template.phrasings).format(**entity),
            "gold_sql": template.sql(entity),
            "ordered": template.ordered,
            "tier": template.tier,
            "template": template.name,
        }


def generate(db: str | None = None, seed: int = SEED, sizes: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """The three splits: ``{"train": [task, ...], "val": [...], "test": [...]}``.

    Each task is ``{"task_id", "input": {question, gold_sql, ordered, tier, template}}``;
    each split has ``sizes[split]`` questions per tier where the entity pools allow it,
    taken round-robin over the tier's templates.
    """
    sizes = sizes or SIZES
    conn = connect(db)
    try:
        pools = split_entities(_entities(conn), seed)
        out: dict[str, list[dict]] = {}
        for split in SPLITS:
            rng = random.Random(f"{seed}-{split}")
            tasks: list[dict] = []
            for tier in TIERS:
                streams = [_candidates(conn, t, pools[split][t.entity], rng) for t in TEMPLATES if t.tier == tier]
                picked: list[dict] = []
                seen: set[str] = set()
                while streams and len(picked) < sizes[split]:
                    for stream in list(streams):
                        item = next(stream, None)
                        if item is None:
                            streams.remove(stream)
                        elif item["question"] not in seen and len(picked) < sizes[split]:
                            seen.add(item["question"])
                            picked.append(item)
                tasks.extend(picked)
            rng.shuffle(tasks)
            out[split] = [{"task_id": f"sql-{split}-{i:03d}", "input": t} for i, t in enumerate(tasks)]
        return out
    finally:
        conn.close()


def write_jsonl(splits: dict[str, list[dict]], out: Path) -> list[Path]:
    """Write ``<split>.jsonl`` files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, tasks in splits.items():
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks))
        paths.append(path)
    return paths


def of_tiers(tasks: list[dict], tiers: tuple[str, ...]) -> list[dict]:
    """The tasks whose tier is one of ``tiers``, in their order."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"tiers: {sorted(unknown)} not among {list(TIERS)}")
    return [t for t in tasks if t["input"]["tier"] in tiers]


def load_split(split: str, data_dir: Path | None = None) -> list[dict]:
    """The tasks of one split from ``data_dir`` (default: this example's ``data/``)."""
    path = (data_dir or Path(__file__).resolve().parent / "data") / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Generate the splits and write them as JSONL."""
    parser = argparse.ArgumentParser(description="Generate the Chinook text-to-SQL questions.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    parser.add_argument(
        "--db", help="Chinook.db (default: $SQL_AGENT_DB or examples/sql_agent/data/chinook/Chinook.db)"
    )
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    splits = generate(args.db, args.seed)
    # the training tasks train.py uses by default, as a file for `agl train --tasks`
    splits["train-easy"] = of_tiers(splits["train"], ("easy",))
    for path in write_jsonl(splits, args.out):
        print(path)
    for split, tasks in splits.items():
        tiers = {t: sum(x["input"]["tier"] == t for x in tasks) for t in TIERS}
        print(f"{split}: {len(tasks)} questions {tiers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
