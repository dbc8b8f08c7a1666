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
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from neuroncc.errors import OptionsError

ENV_VARS = {
    "target": "NEURONCC_TARGET",
    "opt_level": "NEURONCC_OPT_LEVEL",
    "cache_dir": "NEURONCC_CACHE_DIR",
    "dump_dir": "NEURONCC_DUMP_DIR",
    "disk_cache": "NEURONCC_DISK_CACHE",
    "cache_max_bytes": "NEURONCC_CACHE_MAX_BYTES",
    "timing_only": "NEURONCC_TIMING_ONLY",
    "check_reuse": "NEURONCC_CHECK_REUSE",
}
# Options that change where and whether compiled graphs are kept or shown, never what they are.
_NOT_IN_KEY = {
    "dump_dir",
    "cache_dir",
    "disk_cache",
    "cache_max_bytes",
    "timing_only",
    "check_reuse",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class CompileOptions(BaseModel):
    # strict: a value of the wrong type is an error, not converted (fallback="yes" is not
    # True, opt_level=2.0 is not 2); environment variables are parsed by from_user first.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

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
    # Check the kernel keys (Note [kernel reuse]): the second kernel of each key is emitted
    # too and compared with the template the others are placed from; a difference counts in
    # stats()["kernel_key_mismatches"] and that key is never placed. Slower compiles; what is
    # compiled is the same. The tests run with it on.
    check_reuse: bool = False

    @field_validator("opt_level", mode="before")
    @classmethod
    def _an_int(cls, v: Any) -> Any:
        if type(v) is not int:  # 2.0 and True equal 2 and 1, and would pass the Literal
            raise ValueError(f"expected an int (0, 1 or 2), got a {type(v).__name__}")
        return v

    @classmethod
    def from_user(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> CompileOptions:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        from_env: dict[str, str] = {}
        for key, var in ENV_VARS.items():
            if environ.get(var):
                values[key] = _from_env(key, var, environ[var])
                from_env[key] = var
        for key in options or {}:
            from_env.pop(key, None)  # explicit options win
        values.update(options or {})
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise OptionsError(
                f"unknown neuroncc option(s) {unknown}; allowed: {', '.join(cls.model_fields)}"
            )
        try:
            opts = cls(**values)
        except ValidationError as e:
            raise OptionsError(_explain(e, from_env)) from None
        return opts

    def compile_fields(self) -> dict[str, Any]:
        """The options that can change the compiled executable (what a manifest records)."""
        return self.model_dump(exclude=_NOT_IN_KEY)

    def cache_key(self) -> str:
        """A digest of compile_fields()."""
        relevant = self.compile_fields()
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _from_env(key: str, var: str, raw: str) -> Any:
    """An environment variable's text as the option's type: integers and booleans are parsed
    here (the model is strict), an unparsable value is an error naming the variable."""
    annotation = CompileOptions.model_fields[key].annotation
    # int | None, Literal[0, 1, 2]: the types of its members
    kinds = {a if isinstance(a, type) else type(a) for a in get_args(annotation)} | {annotation}
    if bool in kinds:
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        allowed = "/".join(_TRUE + _FALSE)
        raise OptionsError(f"environment variable {var}={raw!r}: expected one of {allowed}")
    if int in kinds:
        try:
            return int(raw)
        except ValueError:
            raise OptionsError(f"environment variable {var}={raw!r}: expected an integer") from None
    return raw


def _explain(e: ValidationError, from_env: Mapping[str, str]) -> str:
    parts = []
    for err in e.errors():
        key = ".".join(str(x) for x in err["loc"])
        name = err["loc"][0] if err["loc"] else None
        given = f"option {key}={err.get('input')!r}"
        if name in from_env:
            given = f"environment variable {from_env[name]}={err.get('input')!r} (option {key})"
        parts.append(f"{given}: {err['msg']}")
    return "invalid neuroncc options: " + "; ".join(parts)
