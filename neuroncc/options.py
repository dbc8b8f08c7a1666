"""CompileOptions: the validated, frozen options of one compilation.

The environment is read here and only here, once per torch.compile backend call; explicit
options win over environment variables. An unknown key or value is an OptionsError that lists
what is allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from neuroncc.errors import OptionsError

ENV_VARS = {
    "target": "NEURONCC_TARGET",
    "opt_level": "NEURONCC_OPT_LEVEL",
    "cache_dir": "NEURONCC_CACHE_DIR",
    "dump_dir": "NEURONCC_DUMP_DIR",
    "disk_cache": "NEURONCC_DISK_CACHE",
    "cache_max_bytes": "NEURONCC_CACHE_MAX_BYTES",
}
_INT_OPTIONS = ("opt_level", "cache_max_bytes")
# Options that change where and whether compiled graphs are kept or shown, never what they are.
_NOT_IN_KEY = {"dump_dir", "cache_dir", "disk_cache", "cache_max_bytes", "timing_only"}


class CompileOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: Literal["trn1", "trn2", "trn3"] = "trn2"
    opt_level: Literal[0, 1, 2] = 2
    auto_cast: Literal["matmul"] | None = None
    fallback: bool = True
    dump_dir: str | None = None
    # The persistent compile cache (runtime/disk_cache.py): on by default, in cache_dir or the
    # per-user cache directory; cache_max_bytes caps it (least recently used entries go).
    disk_cache: bool = True
    cache_dir: str | None = None
    cache_max_bytes: int | None = Field(default=None, gt=0)
    # Time the compiled programs without simulating them; outputs come from PyTorch eager.
    # For estimating models too big to simulate; every such execution is counted in stats().
    timing_only: bool = False

    @classmethod
    def from_user(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> CompileOptions:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for key, var in ENV_VARS.items():
            if environ.get(var):
                raw = environ[var]
                values[key] = int(raw) if key in _INT_OPTIONS and raw.isdigit() else raw
        values.update(options or {})
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise OptionsError(
                f"unknown neuroncc option(s) {unknown}; allowed: {', '.join(cls.model_fields)}"
            )
        try:
            opts = cls(**values)
        except ValidationError as e:
            raise OptionsError(_explain(e)) from None
        return opts

    def compile_fields(self) -> dict[str, Any]:
        """The options that can change the compiled executable (what a manifest records)."""
        return self.model_dump(exclude=_NOT_IN_KEY)

    def cache_key(self) -> str:
        """A digest of compile_fields()."""
        relevant = self.compile_fields()
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        key = ".".join(str(x) for x in err["loc"])
        parts.append(f"option {key}={err.get('input')!r}: {err['msg']}")
    return "invalid neuroncc options: " + "; ".join(parts)
