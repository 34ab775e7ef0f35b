"""The collection: generated people, companies, cities and countries, told in short passages.

Everything comes from one seeded generator, so the collection is the same on every
machine and nothing is downloaded. Names are made of syllables (``Vorlakin Foods``,
``Mira Tessor``), so the model cannot know any fact beforehand: it has to find it.

Facts are spread so that questions need hops: a company's passage names its founder
and its headquarters city; the founder's own passage says where they were born; a
city's passage names its country. "In which city was the founder of X born?" needs
the company's passage, then the founder's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SEED = 12
N_COUNTRIES = 12
N_CITIES = 90
N_COMPANIES = 220
"""Each company has its own founder, so there are as many people as companies."""

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "sk"]
COMPANY_KINDS = ["Foods", "Motors", "Labs", "Works", "Textiles", "Energy", "Games", "Shipping"]
PRODUCTS = [
    "bicycles", "tea", "solar panels", "toys", "glass bottles", "wool coats", "ferries", "board games",
    "violins", "paper lamps", "rice noodles", "wind turbines", "river boats", "leather boots", "clocks", "maps",
]  # fmt: skip
OCCUPATIONS = ["chemist", "sailor", "teacher", "painter", "engineer", "baker", "pilot", "lawyer", "farmer", "doctor"]
FIRST_NAMES = [
    "Mira", "Tomas", "Ilse", "Oren", "Lena", "Pavel", "Sana", "Hugo", "Ada", "Ivo", "Nora", "Emil",
    "Rosa", "Karl", "Vera", "Anton", "Lia", "Jonas", "Elin", "Marco",
]  # fmt: skip


@dataclass(frozen=True)
class Person:
    """A founder: where they were born and what they did before."""

    name: str
    birth_city: str
    occupation: str


@dataclass(frozen=True)
class Company:
    """A company: what it makes, who founded it and when, where it is based."""

    name: str
    product: str
    founder: str
    year: int
    city: str


@dataclass(frozen=True)
class City:
    """A city and its country."""

    name: str
    country: str
    river: str


@dataclass(frozen=True)
class World:
    """Every generated entity, in generation order."""

    countries: tuple[str, ...]
    cities: tuple[City, ...]
    people: tuple[Person, ...]
    companies: tuple[Company, ...]

    def person(self, name: str) -> Person:
        """The person called ``name``."""
        return next(p for p in self.people if p.name == name)

    def city(self, name: str) -> City:
        """The city called ``name``."""
        return next(c for c in self.cities if c.name == name)


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _unique_words(rng: random.Random, n: int, syllables: tuple[int, ...], taken: set[str]) -> list[str]:
    words: list[str] = []
    while len(words) < n:
        word = _word(rng, rng.choice(syllables))
        if len(word) >= 4 and word not in taken:
            taken.add(word)
            words.append(word)
    return words


def build_world(seed: int = SEED) -> World:
    """All entities, from ``seed``: the same world every time."""
    rng = random.Random(seed)
    taken: set[str] = set()
    countries = _unique_words(rng, N_COUNTRIES, (2, 3), taken)
    rivers = _unique_words(rng, 20, (2,), taken)
    cities = tuple(
        City(name, rng.choice(countries), rng.choice(rivers)) for name in _unique_words(rng, N_CITIES, (2, 3), taken)
    )
    surnames = _unique_words(rng, N_COMPANIES, (2, 3), taken)
    people = tuple(
        Person(f"{rng.choice(FIRST_NAMES)} {surname}", rng.choice(cities).name, rng.choice(OCCUPATIONS))
        for surname in surnames
    )
    stems = _unique_words(rng, N_COMPANIES, (2, 3), taken)
    companies = tuple(
        Company(
            name=f"{stem} {rng.choice(COMPANY_KINDS)}",
            product=rng.choice(PRODUCTS),
            founder=person.name,
            year=rng.randint(1890, 2015),
            city=rng.choice(cities).name,
        )
        for stem, person in zip(stems, people, strict=True)
    )
    return World(tuple(countries), cities, people, companies)


def passages(world: World) -> list[dict]:
    """The collection: one short passage per company, person and city, with a stable ``doc_id``."""
    docs = []
    for c in world.companies:
        text = f"{c.name} makes {c.product}. It was founded by {c.founder} in {c.year} and is based in {c.city}."
        docs.append({"title": c.name, "text": text})
    for p in world.people:
        docs.append({"title": p.name, "text": f"{p.name} was a {p.occupation}, born in {p.birth_city}."})
    for city in world.cities:
        docs.append({"title": city.name, "text": f"{city.name} is a city in {city.country} on the {city.river} river."})
    return [{"doc_id": f"d{i:03d}", **doc} for i, doc in enumerate(docs)]
