"""The questions: templates filled from the generated world, in train, val and test splits.

Companies are shuffled with a fixed seed and cut 60/20/20 into train, val and test pools
(a founder goes with their company), so no val or test question asks about an entity a
training question asks about. Each template has three phrasings: train uses the first
two, val and test only the third, so the test split also measures whether the agent
copes with wording it was never trained on.

Three templates of seven need two hops (the company's passage, then the founder's or
the city's), and they make 60% of every split. ``python -m examples.rag_agent.questions`` (from the
repository root) writes ``data/passages.jsonl``, ``train.jsonl``, ``val.jsonl`` and
``test.jsonl``; running it again writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .collection import Company, World, build_world, passages

SPLITS = ("train", "val", "test")
TRAIN_ONE_HOP = "train-1hop"
"""The training split's one-hop questions, as a file of their own for ``agl train --tasks``."""
SEED = 13
POOL_FRACTIONS = {"train": 0.6, "val": 0.2, "test": 0.2}
PER_TEMPLATE = {"train": {2: 48, 1: 24}, "val": {2: 4, 1: 2}, "test": {2: 4, 1: 2}}
"""Questions per template in each split, by the template's hops."""
DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Template:
    """A question kind: its phrasings, how many hops it needs, its answer and the passages that hold it."""

    name: str
    hops: int
    phrasings: tuple[str, str, str]
    answer: Callable[[World, Company], str]
    evidence: Callable[[World, Company], tuple[str, ...]]
    """Titles of the passages the answer needs, in hop order."""


TEMPLATES: tuple[Template, ...] = (
    Template(
        "founder_birth_city",
        2,
        (
            "In which city was the founder of {company} born?",
            "Where was the person who founded {company} born?",
            "What is the birthplace of the founder of {company}?",
        ),
        lambda w, c: w.person(c.founder).birth_city,
        lambda w, c: (c.name, c.founder),
    ),
    Template(
        "company_country",
        2,
        (
            "In which country is {company} based?",
            "Which country is {company} located in?",
            "{company} has its base in a city. Which country is that city in?",
        ),
        lambda w, c: w.city(c.city).country,
        lambda w, c: (c.name, c.city),
    ),
    Template(
        "founder_occupation",
        2,
        (
            "What was the job of the founder of {company}?",
            "What did the person who founded {company} work as?",
            "Which occupation did the founder of {company} have?",
        ),
        lambda w, c: w.person(c.founder).occupation,
        lambda w, c: (c.name, c.founder),
    ),
    Template(
        "company_founder",
        1,
        ("Who founded {company}?", "Who is the founder of {company}?", "Which person started {company}?"),
        lambda w, c: c.founder,
        lambda w, c: (c.name,),
    ),
    Template(
        "company_product",
        1,
        ("What does {company} make?", "What product does {company} make?", "What are the goods {company} produces?"),
        lambda w, c: c.product,
        lambda w, c: (c.name,),
    ),
    Template(
        "company_city",
        1,
        ("In which city is {company} based?", "Where is {company} based?", "Name the city where {company} is based."),
        lambda w, c: c.city,
        lambda w, c: (c.name,),
    ),
    Template(
        "person_birth_city",
        1,
        ("Where was {person} born?", "In which city was {person} born?", "What is the birthplace of {person}?"),
        lambda w, c: w.person(c.founder).birth_city,
        lambda w, c: (c.founder,),
    ),
)


def split_companies(world: World, seed: int = SEED) -> dict[str, list[Company]]:
    """The companies of each split's pool (disjoint; founders go with their companies)."""
    companies = list(world.companies)
    random.Random(seed).shuffle(companies)
    n_train = round(len(companies) * POOL_FRACTIONS["train"])
    n_val = round(len(companies) * POOL_FRACTIONS["val"])
    return {
        "train": companies[:n_train],
        "val": companies[n_train : n_train + n_val],
        "test": companies[n_train + n_val :],
    }


def _phrasings(split: str, template: Template) -> tuple[str, ...]:
    return template.phrasings[:2] if split == "train" else template.phrasings[2:]


def generate(seed: int = SEED) -> dict[str, list[dict]]:
    """Every split's tasks (``task_id`` and ``input``), the same on every call."""
    world = build_world()
    titles = {p["title"]: p["doc_id"] for p in passages(world)}
    pools = split_companies(world, seed)
    out: dict[str, list[dict]] = {}
    for split in SPLITS:
        rng = random.Random(f"{seed}-{split}")
        tasks = []
        for template in TEMPLATES:
            chosen = rng.sample(pools[split], PER_TEMPLATE[split][template.hops])
            for company in chosen:
                phrasing = rng.choice(_phrasings(split, template))
                tasks.append(
                    {
                        "question": phrasing.format(company=company.name, person=company.founder),
                        "answer": template.answer(world, company),
                        "template": template.name,
                        "hops": template.hops,
                        "entity": company.name,
                        "gold_docs": [titles[t] for t in template.evidence(world, company)],
                    }
                )
        rng.shuffle(tasks)
        out[split] = [{"task_id": f"rag-{split}-{i:03d}", "input": t} for i, t in enumerate(tasks)]
    return out


def load_split(split: str, data: Path = DATA) -> list[dict]:
    """The committed tasks of ``split`` (or of :data:`TRAIN_ONE_HOP`)."""
    if split not in (*SPLITS, TRAIN_ONE_HOP):
        raise ValueError(f"split: one of {', '.join((*SPLITS, TRAIN_ONE_HOP))}, not {split!r}")
    with (data / f"{split}.jsonl").open() as f:
        return [json.loads(line) for line in f]


def of_hops(tasks: list[dict], hops: tuple[int, ...]) -> list[dict]:
    """The tasks whose questions take one of these numbers of hops, in their order."""
    unknown = set(hops) - {1, 2}
    if unknown:
        raise ValueError(f"hops: {sorted(unknown)} not among 1 and 2")
    return [t for t in tasks if t["input"]["hops"] in hops]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write(out: Path = DATA) -> dict[str, int]:
    """Write the collection and the splits into ``out``; returns how many rows each file got."""
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    docs = passages(build_world())
    _write_jsonl(out / "passages.jsonl", docs)
    counts["passages"] = len(docs)
    splits = generate()
    splits[TRAIN_ONE_HOP] = of_hops(splits["train"], (1,))
    for split, tasks in splits.items():
        _write_jsonl(out / f"{split}.jsonl", tasks)
        counts[split] = len(tasks)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Write the data files."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    for name, n in write(args.out).items():
        print(f"{name}: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
