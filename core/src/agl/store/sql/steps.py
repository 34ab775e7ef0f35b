"""Model versions and the trainer's step records on a SQL store, with the runs the records make up."""

from __future__ import annotations

import json
from typing import Any

from agl.errors import NotFound
from agl.schema import ModelVersion, now
from agl.store.base import step_record_row
from agl.store.listing import RunSummary
from agl.store.sql.commit import GroupCommit
from agl.store.sql.jobs import Insert
from agl.tokens import STORED


class StepsAndVersions(GroupCommit):
    """Model versions and step records (a mixin of :class:`~agl.store.sql.SqlStore`)."""

    # -- model versions ------------------------------------------------------------
    def add_model_version(self, version: ModelVersion) -> None:
        row = [(version.version, version.model_dump_json())]
        self._write(Insert(self, "model_versions", ("version", "body"), row))

    def get_model_version(self, version: str) -> ModelVersion:
        rows = self._read("SELECT body FROM model_versions WHERE version = ?", [version])
        if not rows:
            raise NotFound("model version", version)
        return ModelVersion.model_validate_json(rows[0][0], context=STORED)

    def latest_model_version(self) -> ModelVersion | None:
        rows = self._read("SELECT body FROM model_versions ORDER BY pk DESC LIMIT 1")
        return ModelVersion.model_validate_json(rows[0][0], context=STORED) if rows else None

    # -- step records ---------------------------------------------------------------
    def add_step_record(self, run_id: str, record: dict[str, Any]) -> None:
        run_id, kind, step, body = step_record_row(run_id, record)
        row = [(run_id, kind, step, now(), body)]
        self._write(Insert(self, "run_steps", ("run_id", "kind", "step", "created_at", "body"), row))

    def step_records(self, run_id: str | None = None) -> list[dict[str, Any]]:
        where, params = ("WHERE run_id = ?", [run_id]) if run_id is not None else ("", [])
        rows = self._read(f"SELECT run_id, body FROM run_steps {where} ORDER BY pk", params)
        return [{**json.loads(body), "run_id": rid} for rid, body in rows]

    def runs(self) -> list[RunSummary]:
        rows = self._read("SELECT run_id, COUNT(*), MAX(created_at) FROM run_steps GROUP BY run_id ORDER BY 3 DESC")
        return [RunSummary(r[0], int(r[1]), float(r[2])) for r in rows]

    def latest_step_records(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = self._read("SELECT run_id, body FROM run_steps WHERE kind = ? ORDER BY pk", [kind])
        return {run_id: {**json.loads(body), "run_id": run_id} for run_id, body in rows}
